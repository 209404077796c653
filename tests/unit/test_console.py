"""The console's HTTP surface without services: login, roles, CSRF, Origin, rate limit, redaction
of the page's input. The fleet behind it is a recording stand-in for ``workers.console.views.Fleet``
(the real one, against a real fleet and a real browser, is tests/integration/test_console.py)."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis
from click.testing import CliRunner
from starlette.testclient import TestClient

from workers.cli import main
from workers.console.app import create_app
from workers.console.security import Attempt, Sessions
from workers.console.users import UsersFile, UsersFileError, check_login, hash_password, parse_users, verify_password
from workers.console.views import Page, SearchBusy
from workers.ops.fleet import ConnectorStatus
from workers.settings import Settings

ORIGIN = "http://testserver"
PASSWORDS = {"vera": "viewer-pw", "alice": "approver-pw", "olga": "operator-pw"}
ROLES = {"vera": "viewer", "alice": "approver", "olga": "operator"}


@dataclass
class Decision:
    ok: bool
    code: str
    message: str


@dataclass
class Pending:
    approval_id: str = "ap1"
    intent_id: str = "intent-1"
    agent_id: str = "shop_bot"
    connector: str = "payments"
    action: str = "refund"
    params: dict[str, Any] = field(default_factory=lambda: {"amount": 900, "card": "[REDACTED]"})
    payload_hash: str = "ab" * 32
    approvers: list[str] = field(default_factory=lambda: ["finance"])
    created_at: str = "2026-12-01T03:00:00Z"
    expires_at: str = "2026-12-01T04:00:00Z"
    summary: str = "refund 900 to order 7"
    people: list[str] = field(default_factory=lambda: ["alice"])
    owners: list[str] = field(default_factory=list)

    def may_decide(self, person: str) -> bool:
        return person in self.people and person not in self.owners


class MemoryLoginLimiter:
    """The console's login limiter (workers.console.security.LoginLimiter, in Redis) as a stand-in
    in memory: failures per key in a sliding window (tests/integration/test_console_limiter.py
    holds the real one to the same behaviour)."""

    def __init__(self, limit: int, window_seconds: float) -> None:
        self.limit, self.window = limit, window_seconds
        self.failures: dict[str, list[float]] = {}

    def retry_after(self, *names: str) -> float:
        now, wait = time.monotonic(), 0.0
        for name in names:
            times = [t for t in self.failures.get(name, []) if now - t < self.window]
            self.failures[name] = times
            if len(times) >= self.limit:
                wait = max(wait, self.window - (now - times[-self.limit]))
        return wait

    def reserve(self, *names: str) -> Attempt:
        wait = self.retry_after(*names)
        if wait == 0:
            self.failed(*names)
        return Attempt(names, "m", wait)

    def failed(self, *names: str) -> None:
        for name in names:
            self.failures.setdefault(name, []).append(time.monotonic())

    def succeeded(self, name: str, attempt: Attempt | None = None) -> None:
        self.failures.pop(name, None)
        for other in attempt.names if attempt is not None else ():
            if other != name and self.failures.get(other):
                self.failures[other].pop()


class MemorySessions(Sessions):
    """The console's sessions (workers.console.security.Sessions, in Redis) in memory, over the
    stand-in fleet's records and its Redis switches."""

    def __init__(self, fleet: RecordingFleet, key: str) -> None:
        self._key = key.encode()
        self.fleet = fleet

    def _redis(self, writing: bool = False) -> None:
        if self.fleet.redis_down or (writing and self.fleet.ending_fails):
            raise redis.ConnectionError("Redis is down")

    def stands(self, session_id: str, user_name: str, began: float) -> bool:
        self._redis()
        return session_id not in self.fleet.ended and began > self.fleet.ended_before.get(user_name, 0.0)

    def end(self, session_id: str, seconds_left: float) -> None:
        self._redis(writing=True)
        self.fleet.ended[session_id] = seconds_left

    def end_all(self, user_name: str, at: float, keep_seconds: int) -> None:
        self._redis(writing=True)
        self.fleet.ended_before[user_name] = max(at, self.fleet.ended_before.get(user_name, 0.0))


class RecordingFleet:
    """What the pages read, fixed; what they change, recorded."""

    def __init__(self) -> None:
        self.paused: dict[str, bool] = {}
        self.decisions: list[tuple[str, bool, str, str | None, str | None]] = []
        self.replays: list[str | None] = []
        self.pending_rows: list[Pending] = [Pending()]
        self.search_busy = False
        self.audit: list[dict[str, Any]] = []
        self.ended: dict[str, float] = {}  # session id -> seconds it is remembered
        self.ended_before: dict[str, float] = {}  # user -> sessions begun before this time are over
        self.redis_down = False
        self.ending_fails = False

    def status(self) -> Page:
        return Page(
            rows=[ConnectorStatus("payments", 0, 1, 0, 1, "closed", "up", self.paused.get("payments", False), "")]
        )

    def known_connector(self, name: str) -> bool:
        return name == "payments"

    def set_paused(self, connector: str, paused: bool) -> None:
        self.paused[connector] = paused

    def dead_letters(self) -> Page:
        return Page()

    def replay(self, message_id: str | None) -> tuple[list[str], list[tuple[str, str]]]:
        self.replays.append(message_id)
        return ([message_id or "m1"], [])

    def trace(self, intent_id: str, agent: str | None) -> tuple[str | None, list[str], list[dict[str, Any]]]:
        if agent is None and self.search_busy:
            raise SearchBusy(intent_id)
        return "shop_bot", [], [{"offset_ms": "0.0", "stage": "received", "details": "<script>x</script>"}]

    def pending(self, agent: str | None = None, page: str | None = None) -> Page:
        return Page(rows=self.pending_rows)

    def get_approval(self, approval_id: str) -> Pending | None:
        return Pending() if approval_id == "ap1" else None

    def decide(self, approval_id: str, approve: bool, approver: str, reason: str | None, shown: str | None) -> Decision:
        self.decisions.append((approval_id, approve, approver, reason, shown))
        return Decision(True, "", "")

    def audited(self, user: str, role: str, action: str, **fields: Any) -> None:
        self.audit.append({"user": user, "role": role, "action": action, **fields})

    def login_limiter(self, limit: int, window_seconds: float) -> MemoryLoginLimiter:
        return MemoryLoginLimiter(limit, window_seconds)

    def sessions(self, key: str) -> MemorySessions:
        return MemorySessions(self, key)


@pytest.fixture(scope="module")
def users_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("console") / "users.yaml"
    path.write_text(
        "".join(f"{n}: {{password_hash: '{hash_password(p)}', role: {ROLES[n]}}}\n" for n, p in PASSWORDS.items())
    )
    return path


@pytest.fixture
def fleet() -> RecordingFleet:
    return RecordingFleet()


def console(users_file: Path, fleet: RecordingFleet, **settings: Any) -> TestClient:
    app = create_app(Settings(console_users=str(users_file), **settings), fleet, UsersFile(str(users_file)))  # type: ignore[arg-type]
    return TestClient(app, base_url=ORIGIN, follow_redirects=False)


def csrf_of(client: TestClient, path: str = "/login") -> str:
    found = re.search(r'name="csrf_token" value="([^"]+)"', client.get(path).text)
    assert found, f"no CSRF token on {path}"
    return found.group(1)


def logged_in(users_file: Path, fleet: RecordingFleet, name: str) -> tuple[TestClient, str]:
    client = console(users_file, fleet)
    token = csrf_of(client)
    answer = client.post(
        "/login", data={"name": name, "password": PASSWORDS[name], "csrf_token": token}, headers={"Origin": ORIGIN}
    )
    assert answer.status_code == 303 and answer.headers["location"] == "/fleet", answer.text
    return client, csrf_of(client, "/fleet")


def test_passwords_hash_with_scrypt_and_a_salt_each_time() -> None:
    first, second = hash_password("s3cret"), hash_password("s3cret")
    assert first.startswith("scrypt$") and first != second
    assert verify_password("s3cret", first) and verify_password("s3cret", second)
    assert not verify_password("s3cret!", first)
    assert not verify_password("s3cret", "scrypt$garbage") and not verify_password("x" * 2000, first)


def test_the_users_file_is_checked_entry_by_entry() -> None:
    good = hash_password("pw")
    assert parse_users(f"a: {{password_hash: '{good}', role: operator}}")["a"].role.name == "operator"
    for text in (
        "[a, b]",
        f"a: {{password_hash: '{good}', role: admin}}",
        "a: {password_hash: plain, role: viewer}",
        f"a: {{password_hash: '{good}', role: viewer, extra: 1}}",
        f"'a b': {{password_hash: '{good}', role: viewer}}",
    ):
        with pytest.raises(UsersFileError):
            parse_users(text)
    assert check_login(parse_users(f"a: {{password_hash: '{good}', role: viewer}}"), "nobody", "pw") is None


def test_pages_need_a_login(users_file: Path, fleet: RecordingFleet) -> None:
    client = console(users_file, fleet)
    for path in ("/fleet", "/approvals", "/dead-letters", "/trace"):
        answer = client.get(path)
        assert answer.status_code == 303 and answer.headers["location"].startswith("/login"), path
    assert client.get("/fleet/live").status_code == 401


def test_a_wrong_password_does_not_log_in(users_file: Path, fleet: RecordingFleet) -> None:
    client = console(users_file, fleet)
    token = csrf_of(client)
    client.post("/login", data={"name": "olga", "password": "nope", "csrf_token": token}, headers={"Origin": ORIGIN})
    assert client.get("/fleet").status_code == 303
    assert fleet.audit[-1] == {
        "user": "olga",
        "role": "-",
        "action": "login",
        "result": "failed",
        "address": "testclient",
    }


def test_login_itself_needs_the_csrf_token_and_the_own_origin(users_file: Path, fleet: RecordingFleet) -> None:
    client = console(users_file, fleet)
    token = csrf_of(client)
    form = {"name": "olga", "password": PASSWORDS["olga"]}
    assert client.post("/login", data=form, headers={"Origin": ORIGIN}).status_code == 403
    assert (
        client.post("/login", data={**form, "csrf_token": token}, headers={"Origin": "http://evil"}).status_code == 403
    )
    assert client.get("/fleet").status_code == 303


def test_failed_logins_are_rate_limited_per_name(users_file: Path, fleet: RecordingFleet) -> None:
    client = console(users_file, fleet, console_login_rate="3/min")
    token = csrf_of(client)
    for _ in range(3):
        wrong = {"name": "alice", "password": "guess", "csrf_token": token}
        assert client.post("/login", data=wrong, headers={"Origin": ORIGIN}).status_code == 303
    right = {"name": "alice", "password": PASSWORDS["alice"], "csrf_token": token}
    answer = client.post("/login", data=right, headers={"Origin": ORIGIN})
    assert answer.status_code == 429 and int(answer.headers["Retry-After"]) > 0
    assert client.get("/fleet").status_code == 303  # even the right password waits


def test_the_session_cookie_is_httponly_samesite_strict_and_secure_when_asked(
    users_file: Path, fleet: RecordingFleet
) -> None:
    plain = console(users_file, fleet).get("/login").headers["set-cookie"].lower()
    assert "httponly" in plain and "samesite=strict" in plain and "secure" not in plain
    secure = console(users_file, fleet, console_secure_cookie=True).get("/login").headers["set-cookie"].lower()
    assert "; secure" in secure


def test_a_viewer_sees_no_buttons_and_every_post_is_refused(users_file: Path, fleet: RecordingFleet) -> None:
    client, token = logged_in(users_file, fleet, "vera")
    for live in ("/fleet/live", "/approvals/live"):
        html = client.get(live).text
        assert "payments" in html and "<button" not in html, live
    assert "Replay all" not in client.get("/dead-letters").text
    for path in ("/fleet/payments/pause", "/approvals/ap1/approve", "/approvals/ap1/deny", "/dead-letters/replay"):
        for headers in ({"Origin": ORIGIN}, {"Origin": ORIGIN, "X-CSRF-Token": token}):
            assert client.post(path, data={"reason": "x"}, headers=headers).status_code == 403, (path, headers)
    assert fleet.paused == {} and fleet.decisions == [] and fleet.replays == []
    assert {a["action"] for a in fleet.audit if a["result"] == "refused"} == {"pause", "approve", "deny", "replay"}


def test_an_operator_post_without_the_csrf_token_or_from_elsewhere_is_refused(
    users_file: Path, fleet: RecordingFleet
) -> None:
    client, token = logged_in(users_file, fleet, "olga")
    assert client.post("/fleet/payments/pause", headers={"Origin": ORIGIN}, data={}).status_code == 403
    assert (
        client.post("/fleet/payments/pause", headers={"Origin": ORIGIN, "X-CSRF-Token": "forged"}, data={}).status_code
        == 403
    )
    assert (
        client.post(
            "/fleet/payments/pause", headers={"Origin": "http://evil.example", "X-CSRF-Token": token}, data={}
        ).status_code
        == 403
    )
    assert (
        client.post("/fleet/payments/pause", headers={"X-CSRF-Token": token}, data={}).status_code == 403
    )  # no Origin
    assert fleet.paused == {}
    ok = client.post(
        "/fleet/payments/pause", headers={"Origin": ORIGIN, "X-Requested-With": "fetch"}, data={"csrf_token": token}
    )
    assert ok.status_code == 200 and ok.json()["ok"] and fleet.paused == {"payments": True}
    assert fleet.audit[-1] == {
        "user": "olga",
        "role": "operator",
        "action": "pause",
        "target": "payments",
        "result": "ok",
    }


def test_an_approver_decides_as_themselves_but_cannot_pause(users_file: Path, fleet: RecordingFleet) -> None:
    client, token = logged_in(users_file, fleet, "alice")
    headers = {"Origin": ORIGIN, "X-CSRF-Token": token}
    form = {"reason": "not this one", "payload_hash": "ab" * 32}
    assert client.post("/approvals/ap1/deny", headers=headers, data={"reason": "no hash"}).status_code == 303
    assert fleet.decisions == []  # which payload was shown is part of the decision
    answer = client.post("/approvals/ap1/deny", headers=headers, data=form)
    assert answer.status_code == 303
    assert fleet.decisions == [("ap1", False, "alice", "not this one", "ab" * 32)]
    assert fleet.audit[-1]["intent_id"] == "intent-1" and fleet.audit[-1]["payload_hash"] == "ab" * 32
    assert client.post("/fleet/payments/pause", headers=headers, data={}).status_code == 403
    html = client.get("/approvals/live").text
    assert "Approve" in html and "[REDACTED]" in html and "&#34;amount&#34;: 900" in html


def test_an_approver_outside_the_approvals_groups_or_owning_the_agent_sees_no_buttons(
    users_file: Path, fleet: RecordingFleet
) -> None:
    client, _ = logged_in(users_file, fleet, "olga")  # an operator, but not in finance
    html = client.get("/approvals/live").text
    assert "ap1" in html and "Approve" not in html and "Only finance may decide this" in html
    fleet.pending_rows = [Pending(people=["alice"], owners=["alice"])]
    client, _ = logged_in(users_file, fleet, "alice")
    html = client.get("/approvals/live").text
    assert "Approve" not in html and "not an owner of shop_bot" in html


def test_a_second_agent_search_while_one_runs_is_turned_away_but_a_lookup_by_agent_is_not(
    users_file: Path, fleet: RecordingFleet
) -> None:
    client, _ = logged_in(users_file, fleet, "vera")
    fleet.search_busy = True
    html = client.get("/trace", params={"intent_id": "i-1"}).text
    assert "another search for an intent&#39;s agent is running" in html and "<table" not in html
    html = client.get("/trace", params={"intent_id": "i-1", "agent": "shop_bot"}).text
    assert '<table id="trace">' in html


def test_page_input_is_escaped_and_bounded(users_file: Path, fleet: RecordingFleet) -> None:
    client, token = logged_in(users_file, fleet, "olga")
    html = client.get("/trace", params={"intent_id": "i-1"}).text
    assert "<script>x</script>" not in html and "&lt;script&gt;" in html
    assert "not an intent id" in client.get("/trace", params={"intent_id": "<b>"}).text
    big = {"csrf_token": token, "message_id": "m" * 20_000}
    assert client.post("/dead-letters/replay", headers={"Origin": ORIGIN}, data=big).status_code == 413
    assert client.get("/fleet").headers["content-security-policy"].startswith("default-src 'self'")


def test_logging_out_ends_the_session(users_file: Path, fleet: RecordingFleet) -> None:
    client, token = logged_in(users_file, fleet, "vera")
    assert client.post("/logout", headers={"Origin": ORIGIN}, data={"csrf_token": token}).status_code == 303
    assert client.get("/fleet").status_code == 303


def test_a_copy_of_the_cookie_is_worthless_after_logout(users_file: Path, fleet: RecordingFleet) -> None:
    """The cookie is signed, not stored: without a record of the logout, a stolen copy would stay
    valid for the session's whole TTL."""
    client, token = logged_in(users_file, fleet, "olga")
    stolen = dict(client.cookies)
    assert client.post("/logout", headers={"Origin": ORIGIN}, data={"csrf_token": token}).status_code == 303
    (ended_for,) = fleet.ended.values()
    assert 0 < ended_for <= Settings().console_session_ttl_seconds
    thief = console(users_file, fleet)
    thief.cookies.update(stolen)
    assert thief.get("/fleet").status_code == 303 and thief.get("/fleet/live").status_code == 401
    assert (
        thief.post("/fleet/payments/pause", headers={"Origin": ORIGIN}, data={"csrf_token": token}).status_code == 401
    )
    assert fleet.paused == {}
    # a session that never logged out is untouched
    other, _ = logged_in(users_file, fleet, "vera")
    assert other.get("/fleet").status_code == 200


def test_without_redis_a_session_is_refused_and_a_logout_says_it_did_not_happen(
    users_file: Path, fleet: RecordingFleet
) -> None:
    client, token = logged_in(users_file, fleet, "vera")
    fleet.redis_down = True  # whether the session was logged out cannot be told: it is refused, not trusted
    assert client.get("/fleet").status_code == 303 and client.get("/fleet/live").status_code == 401
    fleet.redis_down = False
    assert client.get("/fleet").status_code == 200
    fleet.ending_fails = True
    answer = client.post("/logout", headers={"Origin": ORIGIN}, data={"csrf_token": token})
    assert answer.status_code == 503 and "not logged out" in answer.json()["message"]
    assert fleet.audit[-1]["action"] == "logout" and fleet.audit[-1]["result"] == "failed"
    assert client.get("/fleet").status_code == 200  # still logged in, as the answer said


def test_hash_password_prints_a_hash_the_console_accepts() -> None:
    result = CliRunner().invoke(main, ["console", "hash-password", "--stdin"], input="correct horse\n")
    assert result.exit_code == 0, result.output
    assert verify_password("correct horse", result.output.strip())


def test_console_without_users_exits_2(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REACH_CONSOLE_USERS", raising=False)
    result = CliRunner().invoke(main, ["console", "--port", "1"])
    assert result.exit_code == 2 and "REACH_CONSOLE_USERS" in result.output


def test_behind_a_proxy_only_the_public_origin_is_accepted(users_file: Path, fleet: RecordingFleet) -> None:
    client = console(users_file, fleet, console_public_url="https://console.example.com")
    token = csrf_of(client)
    form = {"name": "olga", "password": PASSWORDS["olga"], "csrf_token": token}
    assert client.post("/login", data=form, headers={"Origin": ORIGIN}).status_code == 403
    assert client.post("/login", data=form, headers={"Origin": "https://console.example.com"}).status_code == 303
    token = csrf_of(client, "/fleet")
    assert (
        client.post("/fleet/payments/pause", data={"csrf_token": token}, headers={"Origin": ORIGIN}).status_code == 403
    )
    answer = client.post(
        "/fleet/payments/pause", data={"csrf_token": token}, headers={"Referer": "https://console.example.com/fleet"}
    )
    assert answer.status_code == 303 and fleet.paused == {"payments": True}


def test_a_user_removed_from_the_file_is_logged_out_at_the_next_request(
    tmp_path: Path, users_file: Path, fleet: RecordingFleet
) -> None:
    own = tmp_path / "users.yaml"
    own.write_text(users_file.read_text())
    client, _ = logged_in(own, fleet, "vera")
    assert client.get("/fleet").status_code == 200
    own.write_text("\n".join(line for line in users_file.read_text().splitlines() if not line.startswith("vera")))
    assert client.get("/fleet").status_code == 303


def test_a_login_lasts_the_session_ttl(
    users_file: Path, fleet: RecordingFleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    client, _ = logged_in(users_file, fleet, "vera")
    assert client.get("/fleet").status_code == 200
    later = time.time() + Settings().console_session_ttl_seconds + 1
    monkeypatch.setattr("workers.console.app.time.time", lambda: later)
    assert client.get("/fleet").status_code == 303
