"""Approvers see every waiting approval, however many one agent parks.

Before: one agent that parked 100 intents (its bound) filled `reach approvals list` (100 rows) and
the console (100 rows, no paging) with its own, soonest to expire first, so another agent's 700
refund parked afterwards was on neither, and expired unseen; nothing told anyone it was about to.
Now the listing takes each agent's soonest first, pages reach the rest, the counts per agent come
with it (CLI, console, the console's Fleet page), and routers export
``reach_approvals_expiring_soon`` per connector.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis
from click.testing import CliRunner

from producers.client import ReachClient
from tests.fleet import BROKER_URL, REDIS_URL, Fleet, free_port
from tests.integration.counting_system import CountingSystem
from tests.waiting import wait_for
from workers.cli import main
from workers.console.users import hash_password
from workers.ops import approval_decisions as approvals
from workers.state import keys

RUN = uuid.uuid4().hex[:6]
FLOOD, REAL = f"flood_{RUN}", f"refunds_{RUN}"
CONNECTOR = "fair_shop"
FLOODED = 100  # the flooding agent's bound (REACH_MAX_PENDING_APPROVALS' default)


def catalog(url: str) -> str:
    bindings = "".join(
        f"""---
agent_app:
  name: {name}
  connector_bindings:
    - connector: {CONNECTOR}
      allowed_actions: ["*"]
"""
        for name in (FLOOD, REAL)
    )
    return f"""
connector:
  name: {CONNECTOR}
  endpoint: {url}
  actions:
    - action: refund
      description: Refund an order
      path: POST /items
      permission: write
      input:
        title: {{ type: string, required: true }}
        amount: {{ type: number, required: true }}
      approval: {{ required: true, approvers: [finance], expires: 10m }}
---
approvers:
  finance: [alice]
{bindings}"""


@pytest.fixture(scope="module")
def system() -> Iterator[CountingSystem]:
    running = CountingSystem().start()
    yield running
    running.stop()


@pytest.fixture(scope="module")
def fleet(system: CountingSystem, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    users = tmp_path_factory.mktemp("console") / "users.yaml"
    users.write_text(f"alice: {{password_hash: '{hash_password('alice-pw')}', role: approver}}\n")
    with Fleet(catalog(system.url), [CONNECTOR]) as running:
        port = free_port()
        running.start_process(
            "console",
            ["console", "--port", str(port)],
            {"REACH_CONSOLE_USERS": str(users), "REACH_CONSOLE_SESSION_KEY": uuid.uuid4().hex},
        )
        running.console_url = f"http://127.0.0.1:{port}"  # type: ignore[attr-defined]
        wait_for(lambda: _answers(f"http://127.0.0.1:{port}/healthz"), 30, "reach console did not start")
        yield running


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.TransportError:
        return False


@pytest.fixture(scope="module")
def store() -> redis.Redis:
    return redis.Redis.from_url(REDIS_URL)


@pytest.fixture(scope="module")
def parked(fleet: Fleet, store: redis.Redis) -> Iterator[dict[str, list[str]]]:
    """The flood (its whole bound), then the one real refund: the intent ids of each agent."""
    ids: dict[str, list[str]] = {FLOOD: [], REAL: []}
    with ReachClient(FLOOD, BROKER_URL) as flood, ReachClient(REAL, BROKER_URL) as real:
        for i in range(FLOODED):
            ids[FLOOD].append(flood.publish("refund", {"title": f"flood-{i}", "amount": 1}))
        wait_for(lambda: waiting(store, FLOOD), 60, "the flood", until=lambda n: n == FLOODED)
        ids[REAL].append(real.publish("refund", {"title": "the real one", "amount": 700}))
        wait_for(lambda: waiting(store, REAL), 30, "the real refund to be parked")
        yield ids
        # leave nothing waiting for the modules after this one
        for listed in approvals.list_pending(store, 10_000):
            if listed.agent_id in ids:
                approvals.deny(store, BROKER_URL, listed.approval_id, "alice", "test cleanup")


def waiting(store: redis.Redis, agent: str) -> int:
    """The agent's waiting approvals, as the pending bound counts them."""
    return int(store.hget(keys.approvals_count(), agent) or 0)


def approval_of(store: redis.Redis, intent_id: str) -> str:
    [found] = [p.approval_id for p in approvals.list_pending(store, 10_000) if p.intent_id == intent_id]
    return found


def cli(*args: str) -> str:
    result = CliRunner().invoke(
        main, ["approvals", "list", *args], env={"REACH_REDIS_URL": REDIS_URL, "REACH_BROKER_URL": BROKER_URL}
    )
    assert result.exit_code == 0, result.output
    return result.stdout


def test_the_cli_lists_another_agents_approval_among_the_first_rows_despite_a_flood(
    parked: dict[str, list[str]], store: redis.Redis
) -> None:
    real = approval_of(store, parked[REAL][0])
    first = cli()  # the default page: 100 rows
    assert real in first
    assert f"{FLOOD} {FLOODED}" in first and f"{REAL} 1" in first  # the counts per agent, first
    assert "page 1 of" in first and "--page 2 for more" in first

    rows = json.loads(cli("--json"))
    assert len(rows) == 100 and real in [r["approval_id"] for r in rows[:5]]  # in the first round
    # every page together holds every approval, once
    listing = json.loads(cli("--json", "--counts", "--limit", "30"))
    assert listing["per_agent"][FLOOD] == FLOODED and listing["per_agent"][REAL] == 1
    seen = [r["intent_id"] for r in listing["approvals"]]
    for page in range(2, listing["pages"] + 1):
        seen += [r["intent_id"] for r in json.loads(cli("--json", "--limit", "30", "--page", str(page)))]
    mine = [i for i in seen if i in parked[FLOOD] or i in parked[REAL]]
    assert sorted(mine) == sorted(parked[FLOOD] + parked[REAL])
    only = json.loads(cli("--json", "--agent", REAL))
    assert [r["intent_id"] for r in only] == parked[REAL]


def log_in(fleet: Fleet) -> httpx.Client:
    base: str = fleet.console_url  # type: ignore[attr-defined]
    browser = httpx.Client(base_url=base, headers={"Origin": base}, timeout=10)
    page = browser.get("/login").text
    token = re.search(r'name="csrf-token" content="([^"]+)"', page)
    assert token is not None, page
    answer = browser.post(
        "/login", data={"name": "alice", "password": "alice-pw", "csrf_token": token.group(1), "next": "/fleet"}
    )
    assert answer.status_code == 303 and answer.headers["location"] == "/fleet", answer.text
    return browser


def test_the_console_pages_every_approval_and_counts_them_per_agent(
    fleet: Fleet, parked: dict[str, list[str]], store: redis.Redis
) -> None:
    real = approval_of(store, parked[REAL][0])
    browser = log_in(fleet)
    try:
        first = browser.get("/approvals/live").text
        assert f'id="approval-{real}"' in first  # on the first page, the flood notwithstanding
        assert re.search(rf'data-agent="{FLOOD}"><a [^>]*>{FLOOD} {FLOODED}</a>', first), first[:2000]
        assert 'id="approval-pages"' in first and "next →" in first

        shown: set[str] = set()
        pages = int(re.search(r'data-pages="(\d+)"', first).group(1))  # type: ignore[union-attr]
        for number in range(1, pages + 1):
            html = browser.get(f"/approvals/live?page={number}").text
            shown |= set(re.findall(r'data-intent="([^"]+)"', html))
        assert set(parked[FLOOD] + parked[REAL]) <= shown

        theirs = browser.get(f"/approvals/live?agent={REAL}").text
        assert re.findall(r'data-intent="([^"]+)"', theirs) == parked[REAL]
        page = browser.get(f"/approvals?agent={REAL}&page=1").text  # the page polls the same choice
        assert f'data-live="/approvals/live?agent={REAL}&amp;page=1"' in page

        fleet_page = browser.get("/fleet/live").text
        counts = dict(re.findall(r'<tr id="waiting-([a-z0-9_]+)">.*?<td class="count">(\d+)</td>', fleet_page))
        assert counts[FLOOD] == str(FLOODED) and counts[REAL] == "1", fleet_page[:2000]
    finally:
        browser.close()


def test_the_routers_export_how_many_approvals_expire_soon(fleet: Fleet, parked: dict[str, list[str]]) -> None:
    url = f"http://127.0.0.1:{fleet.metrics_port('router')}/metrics"

    def expiring() -> float:
        for line in httpx.get(url, timeout=5).text.splitlines():
            if line.startswith(f'reach_approvals_expiring_soon{{connector="{CONNECTOR}"}} '):
                return float(line.rsplit(" ", 1)[1])
        return -1.0

    # every one of them expires within 10 minutes: inside the 15-minute window; no ids as labels
    wait_for(expiring, 30, "the expiring gauge", until=lambda n: n == FLOODED + 1)
    assert "approval_id" not in httpx.get(url, timeout=5).text


def test_the_docs_name_the_metric() -> None:
    contract = (Path(__file__).resolve().parents[2] / "docs" / "contract.md").read_text()
    assert "reach_approvals_expiring_soon" in contract
