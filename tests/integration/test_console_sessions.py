"""Two ``reach console`` processes over one Redis, driven as a browser would (cookie, CSRF token,
Origin): the login limit holds against concurrent guesses spread over both, and a session ends
on every replica when its user's password changes, when the user is removed (and stays ended if
the same user is added again), and on "log out everywhere"."""

from __future__ import annotations

import os
import re
import tempfile
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import redis
from selenium.webdriver.common.by import By

from tests.fleet import REDIS_URL, Fleet, free_port
from tests.integration.browser import chromium
from tests.waiting import wait_for
from workers.console.security import LoginLimiter
from workers.console.users import hash_password
from workers.state import keys

LIMIT = 10  # REACH_CONSOLE_LOGIN_RATE's default, 10/min
PASSWORDS = {"alice": "alice-pw", "bob": "bob-pw", "carol": "carol-pw", "dave": "dave-pw", "erin": "erin-pw"}
HASHES = {name: hash_password(password) for name, password in PASSWORDS.items()}


@dataclass
class Consoles:
    urls: list[str]
    users_file: Path
    log_dir: Path

    def write_users(self, hashes: dict[str, str]) -> None:
        """Replace the users file at once (as a Secret update does): never half-written."""
        text = "".join(f"{name}: {{password_hash: '{h}', role: viewer}}\n" for name, h in hashes.items())
        staged = self.users_file.with_suffix(".new")
        staged.write_text(text)
        os.replace(staged, self.users_file)


@pytest.fixture(autouse=True)
def _forget_login_attempts() -> Iterator[None]:
    """These tests spend 127.0.0.1's login allowance on purpose; the next test file run in this
    Redis database (another console logging in from the same address) must not inherit it."""
    yield
    client = redis.Redis.from_url(REDIS_URL)
    try:
        for key in client.scan_iter(match=keys.CONSOLE_LOGIN_MATCH, count=1000):
            client.delete(key)
    finally:
        client.close()


@pytest.fixture(scope="module")
def consoles() -> Iterator[Consoles]:
    fleet = Fleet("", [], env={"REACH_CONSOLE_SESSION_KEY": os.urandom(16).hex()})
    users_file = Path(tempfile.mkdtemp(prefix="reach-test-console-")) / "users.yaml"
    made = Consoles([], users_file, fleet.log_dir)
    made.write_users(HASHES)
    try:
        for name in ("console_a", "console_b"):
            port = free_port()
            fleet.start_process(name, ["console", "--port", str(port)], {"REACH_CONSOLE_USERS": str(users_file)})
            made.urls.append(f"http://127.0.0.1:{port}")
        for url in made.urls:
            wait_for(lambda: _healthy(url), 60, f"reach console at {url} did not start")
        yield made
    finally:
        fleet.stop()


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/healthz", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def browser(url: str, address: str = "127.0.0.1") -> tuple[httpx.Client, str]:
    """A client with the login page's session cookie, and that page's CSRF token."""
    client = httpx.Client(
        base_url=url, transport=httpx.HTTPTransport(local_address=address), headers={"Origin": url}, timeout=30
    )
    page = client.get("/login")
    found = re.search(r'name="csrf_token" value="([^"]+)"', page.text)
    assert found, page.text[:500]
    return client, found.group(1)


def log_in(url: str, name: str, password: str, address: str = "127.0.0.1") -> httpx.Client:
    client, csrf = browser(url, address)
    answer = client.post("/login", data={"name": name, "password": password, "csrf_token": csrf})
    assert answer.status_code == 303 and answer.headers["location"] == "/fleet", (answer.status_code, answer.text)
    return client


def same_cookie_on(client: httpx.Client, url: str) -> httpx.Client:
    """A copy of ``client``'s cookie, sent to another console replica."""
    return httpx.Client(base_url=url, cookies=client.cookies, headers={"Origin": url}, timeout=30)


def signed_in(client: httpx.Client) -> bool:
    answer = client.get("/trace")  # a page that needs a session and nothing else
    assert answer.status_code in (200, 303), answer.status_code
    return answer.status_code == 200


def csrf_of(client: httpx.Client) -> str:
    found = re.search(r'name="csrf_token" value="([^"]+)"', client.get("/trace").text)
    assert found
    return found.group(1)


def test_forty_concurrent_wrong_passwords_over_two_consoles_check_at_most_the_limit(consoles: Consoles) -> None:
    address = "127.0.0.5"  # an address of this test's own: the limit counts per address as well
    browsers = [browser(consoles.urls[i % 2], address) for i in range(40)]
    start = threading.Barrier(len(browsers))
    answers: list[int] = []

    def guess(client: httpx.Client, csrf: str, n: int) -> None:
        start.wait()
        answer = client.post("/login", data={"name": "alice", "password": f"guess-{n}", "csrf_token": csrf})
        answers.append(answer.status_code)

    threads = [threading.Thread(target=guess, args=(c, t, n)) for n, (c, t) in enumerate(browsers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    checked = answers.count(303)  # "wrong name or password": the password was checked
    assert checked <= LIMIT and answers.count(429) == 40 - checked, sorted(answers)
    # the right password, from a fresh address, is refused as well until the window passes
    client, csrf = browser(consoles.urls[0], "127.0.0.6")
    answer = client.post("/login", data={"name": "alice", "password": PASSWORDS["alice"], "csrf_token": csrf})
    assert answer.status_code == 429 and int(answer.headers["Retry-After"]) > 0


def test_a_password_change_ends_every_session_begun_with_the_old_password(consoles: Consoles) -> None:
    first = log_in(consoles.urls[0], "bob", PASSWORDS["bob"])
    copy = same_cookie_on(first, consoles.urls[1])
    assert signed_in(first) and signed_in(copy)
    consoles.write_users({**HASHES, "bob": hash_password("bob-new-pw")})
    try:
        assert not signed_in(first) and not signed_in(copy)
        assert signed_in(log_in(consoles.urls[1], "bob", "bob-new-pw"))
    finally:
        consoles.write_users(HASHES)


def test_a_removed_user_added_again_does_not_get_the_old_sessions_back(consoles: Consoles) -> None:
    first = log_in(consoles.urls[0], "carol", PASSWORDS["carol"])
    copy = same_cookie_on(first, consoles.urls[1])
    assert signed_in(first) and signed_in(copy)
    consoles.write_users({name: h for name, h in HASHES.items() if name != "carol"})
    assert not signed_in(first)  # console A sees the removal; B is not asked meanwhile
    consoles.write_users(HASHES)  # the very same entry again
    assert not signed_in(first) and not signed_in(copy)
    assert signed_in(log_in(consoles.urls[1], "carol", PASSWORDS["carol"]))  # a new login works


def test_logging_out_everywhere_ends_the_users_sessions_on_every_console(consoles: Consoles) -> None:
    here = log_in(consoles.urls[0], "dave", PASSWORDS["dave"])
    there = log_in(consoles.urls[1], "dave", PASSWORDS["dave"])
    other = log_in(consoles.urls[1], "bob", PASSWORDS["bob"])
    # a plain logout ends that one session, on both replicas, and no other
    plain = log_in(consoles.urls[0], "dave", PASSWORDS["dave"])
    plain_copy = same_cookie_on(plain, consoles.urls[1])
    assert plain.post("/logout", data={"csrf_token": csrf_of(plain)}).status_code == 303
    assert not signed_in(plain_copy) and signed_in(here) and signed_in(there)
    answer = here.post("/logout", data={"csrf_token": csrf_of(here), "everywhere": "1"})
    assert answer.status_code == 303
    assert not signed_in(here) and not signed_in(there)
    assert signed_in(other)
    assert signed_in(log_in(consoles.urls[1], "dave", PASSWORDS["dave"]))


def test_the_log_out_everywhere_button_ends_the_session_of_another_browser_on_another_console(
    consoles: Consoles,
) -> None:
    """Pressed in a real browser: the button in the page's logout form, not a hand-made POST."""
    elsewhere = log_in(consoles.urls[1], "erin", PASSWORDS["erin"])
    bystander = log_in(consoles.urls[1], "bob", PASSWORDS["bob"])
    driver = chromium(consoles.log_dir)
    try:
        driver.get(consoles.urls[0] + "/login")
        driver.find_element(By.ID, "name").send_keys("erin")
        driver.find_element(By.ID, "password").send_keys(PASSWORDS["erin"])
        driver.find_element(By.ID, "login-button").click()
        wait_for(lambda: driver.find_elements(By.ID, "who"), 10, "erin was not logged in")
        assert signed_in(elsewhere)
        button = driver.find_element(By.ID, "logout-everywhere-button")
        assert button.text == "Log out everywhere"
        button.click()
        wait_for(lambda: driver.find_elements(By.ID, "login-button"), 10, "the logout did not reach the login page")
        driver.get(consoles.urls[0] + "/trace")
        assert driver.find_elements(By.ID, "login-button"), "the browser's own session still stands"
    finally:
        driver.quit()
    assert not signed_in(elsewhere)  # the other browser, on the other console
    assert signed_in(bystander)


def test_concurrent_attempts_on_two_replicas_reserve_exactly_the_limit() -> None:
    replicas = [LoginLimiter(redis.Redis.from_url(REDIS_URL), LIMIT, 60.0) for _ in range(2)]
    who = f"user:{uuid.uuid4().hex}"
    start = threading.Barrier(40)
    waits: list[float] = []

    def attempt(n: int) -> None:
        start.wait()
        waits.append(replicas[n % 2].reserve(who, f"addr:{uuid.uuid4().hex}").retry_after)

    threads = [threading.Thread(target=attempt, args=(n,)) for n in range(40)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert waits.count(0) == LIMIT and all(0 < w <= 61 for w in waits if w)  # the window, rounded up
