"""`reach console` in a real browser (headless Chromium from the Debian packages, via Selenium)
against a real fleet: the router, pools for ``payments`` (its ``refund`` needs a person's approval)
and ``notes``, a counting downstream, and ``reach console`` as a process of its own.

What a person does on the page is what is asserted: an approver's click lets exactly the parked
payload reach the downstream once; a denial never reaches it; a viewer has no buttons and the
browser's own POSTs for it are refused; an operator's POST without the CSRF token is refused;
pause/resume change the pools' state; a new approval appears without a reload; after a logout a
copy of the session cookie is refused. With
REACH_CONSOLE_SCREENSHOTS=DIR the main pages are saved there (docs/console/ holds the ones in the docs).
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import TypeVar

import pytest
import redis
from kombu import Connection
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement

from producers.client import ReachClient, ReceiptTimeout
from tests.fleet import BROKER_URL, REDIS_URL, Fleet, agent, free_port, purge, queue_depth
from tests.integration.browser import chromium
from tests.integration.counting_system import CountingSystem
from tests.waiting import wait_for
from workers.console.users import hash_password
from workers.settings import Settings
from workers.state import keys
from workers.state.control import is_paused
from workers.transport.topology import DEFAULT_EXCHANGE, DLQ, connector_queue

pytestmark = pytest.mark.integration

RUN = uuid.uuid4().hex[:6]
AGENT = f"shop_{RUN}"
SECRET_CARD = f"4111-1111-{RUN}"  # a `sensitive: true` param: never on the page
USERS = {"alice": ("approver", "alice-pw"), "olga": ("operator", "olga-pw"), "vera": ("viewer", "vera-pw")}
SCREENSHOTS = os.environ.get("REACH_CONSOLE_SCREENSHOTS")
T = TypeVar("T")

CATALOG = """
approvers:
  finance: [alice]
---
connector:
  name: payments
  endpoint: {url}
  actions:
    - action: refund
      description: Refund an order to the customer's card
      path: POST /items
      input:
        title: {{ type: string, required: true }}
        amount: {{ type: number, required: true }}
        card: {{ type: string, sensitive: true }}
      permission: write
      idempotent: false
      approval: {{ required: true, approvers: [finance] }}
---
connector:
  name: notes
  endpoint: {url}
  actions:
    - action: add_note
      description: Add a note to an order
      path: POST /items
      input:
        title: {{ type: string, required: true }}
      permission: write
      idempotent: false
---
agent_app:
  name: {agent}
  connector_bindings:
    - connector: payments
      allowed_actions: ["*"]
    - connector: notes
      allowed_actions: ["*"]
"""


@pytest.fixture(scope="module")
def downstream() -> Iterator[CountingSystem]:
    system = CountingSystem().start()
    yield system
    system.stop()


@pytest.fixture(scope="module")
def fleet(downstream: CountingSystem, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    client = redis.Redis.from_url(REDIS_URL)
    for name in ("payments", "notes"):
        client.delete(keys.paused(name), keys.breaker(name), keys.health(name))
    users = tmp_path_factory.mktemp("console") / "users.yaml"
    users.write_text(
        "".join(f"{n}: {{password_hash: '{hash_password(p)}', role: {r}}}\n" for n, (r, p) in USERS.items())
    )
    with Fleet(CATALOG.format(url=downstream.url, agent=AGENT), ["payments", "notes"]) as running:
        port = free_port()
        running.start_process(
            "console",
            ["console", "--port", str(port)],
            {"REACH_CONSOLE_USERS": str(users), "REACH_CONSOLE_SESSION_KEY": uuid.uuid4().hex},
        )
        running.console_url = f"http://127.0.0.1:{port}"  # type: ignore[attr-defined]
        wait_for(lambda: _answers(running.console_url + "/healthz"), 30, "reach console did not start")  # type: ignore[attr-defined]
        yield running


def _answers(url: str) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


@pytest.fixture(scope="module")
def shop(fleet: Fleet) -> Iterator[ReachClient]:
    with agent(AGENT) as client:
        yield client


@pytest.fixture(scope="module")
def browser(fleet: Fleet) -> Iterator[WebDriver]:
    driver = chromium(fleet.log_dir)
    yield driver
    driver.quit()


def log_in(browser: WebDriver, fleet: Fleet, name: str, page: str = "/fleet") -> None:
    base: str = fleet.console_url  # type: ignore[attr-defined]
    browser.delete_all_cookies()
    browser.get(f"{base}/login?next={page}")
    browser.find_element(By.ID, "name").send_keys(name)
    browser.find_element(By.ID, "password").send_keys(USERS[name][1])
    browser.find_element(By.ID, "login-button").click()
    wait_for(lambda: browser.find_elements(By.ID, "who"), 10, f"{name} was not logged in")
    assert browser.find_element(By.ID, "who").text == f"{name} ({USERS[name][0]})"
    wait_live(browser)


def wait_live(browser: WebDriver) -> None:
    """Until the page's live region has been filled once by the poll."""
    wait_for(
        lambda: browser.execute_script("return document.getElementById('live').dataset.updated"), 10, "no live update"
    )


def post_from_page(browser: WebDriver, path: str, token: bool, form: dict[str, str] | None = None) -> int:
    """The HTTP status of a POST the page itself sends (the browser adds its cookie and Origin)."""
    script = """
        const [path, token, form, done] = arguments;
        const headers = {"X-Requested-With": "fetch"};
        if (token) headers["X-CSRF-Token"] = document.querySelector('meta[name="csrf-token"]').content;
        fetch(path, {method: "POST", credentials: "same-origin", headers, body: new URLSearchParams(form)})
          .then(r => done(r.status), e => done(String(e)));
    """
    return int(browser.execute_async_script(script, path, token, form or {}))


def screenshot(browser: WebDriver, name: str) -> None:
    if SCREENSHOTS:
        Path(SCREENSHOTS).mkdir(parents=True, exist_ok=True)
        browser.save_screenshot(str(Path(SCREENSHOTS) / f"{name}.png"))


def pending(browser: WebDriver) -> list[str]:
    """The intent ids of the approvals on the page (read at once: the live region may be replaced any time)."""
    script = "return [...document.querySelectorAll('section.approval')].map(s => s.dataset.intent)"
    return list(browser.execute_script(script))


def on_live(browser: WebDriver, act: Callable[[], T]) -> T:
    """``act`` on elements of the live region, again if the poll replaced them meanwhile."""
    for _ in range(20):
        try:
            return act()
        except StaleElementReferenceException:
            time.sleep(0.1)
    raise AssertionError("the live region kept changing under the test")


def approval(browser: WebDriver, intent_id: str) -> WebElement:
    return browser.find_element(By.CSS_SELECTOR, f'section.approval[data-intent="{intent_id}"]')


def park_refund(shop: ReachClient, title: str, amount: float) -> str:
    intent_id = shop.publish("payments.refund", {"title": title, "amount": amount, "card": SECRET_CARD})
    wait_for(lambda: shop.notice(intent_id) or notices(shop, intent_id), 20, "no approval_pending notice")
    return intent_id


def notices(shop: ReachClient, intent_id: str) -> bool:
    """Read what came on the reply queue for a moment (notices are kept; receipts stay buffered)."""
    try:
        shop.wait(intent_id, timeout=0.2)
    except ReceiptTimeout:
        return False
    raise AssertionError(f"{intent_id} was answered instead of parked")


def test_an_approver_approves_a_parked_refund_and_the_downstream_gets_exactly_it_once(
    fleet: Fleet, shop: ReachClient, browser: WebDriver, downstream: CountingSystem
) -> None:
    log_in(browser, fleet, "alice", "/approvals")
    browser.execute_script("window.notReloaded = true")
    title = f"refund order 7 {RUN}"
    intent_id = park_refund(shop, title, 900)

    # the live update shows it, without a reload
    wait_for(lambda: intent_id in pending(browser), 15, "the approval did not appear")
    assert browser.execute_script("return window.notReloaded") is True
    params = json.loads(
        on_live(browser, lambda: approval(browser, intent_id).find_element(By.CSS_SELECTOR, "pre.params").text)
    )
    assert params["title"] == title and params["amount"] == 900 and params["card"] != SECRET_CARD
    assert SECRET_CARD not in browser.page_source
    assert downstream.requests(title=title) == []  # parked: nothing ran yet
    screenshot(browser, "approvals")

    # typing holds the live region (the script does not replace what someone is filling in)
    on_live(browser, lambda: approval(browser, intent_id).find_element(By.NAME, "reason").send_keys("customer called"))
    approval(browser, intent_id).find_element(By.CSS_SELECTOR, "button.approve").click()
    receipt = shop.wait(intent_id, timeout=30)
    assert receipt.success, receipt
    wait_for(lambda: intent_id not in pending(browser), 10, "the decided approval stayed on the page")
    wait_for(lambda: "approved" in browser.find_element(By.ID, "flash").text, 10, "no 'approved' message")
    time.sleep(1)  # a second execution, if any, would have happened by now
    calls = downstream.requests("POST", title=title)
    assert len(calls) == 1
    assert calls[0]["body"] == {"title": title, "amount": 900, "card": SECRET_CARD}  # the parked payload, as sent

    def approved_by_alice() -> bool:
        audit = [json.loads(line) for line in fleet.log_lines("console") if '"stage":"console"' in line]
        return any(e["user"] == "alice" and e["action"] == "approve" and e["intent_id"] == intent_id for e in audit)

    wait_for(approved_by_alice, 10, "the console's audit line for the approval")  # (its log is flushed by lines)

    # the decision is in the intent's trace, found from the page
    browser.get(f"{fleet.console_url}/trace")  # type: ignore[attr-defined]
    browser.find_element(By.ID, "intent-id").send_keys(intent_id)
    browser.find_element(By.ID, "trace-button").click()

    def stages() -> list[str]:
        try:
            return [cell.text for cell in browser.find_elements(By.CSS_SELECTOR, "#trace td.stage")]
        except StaleElementReferenceException:  # the result page was still loading
            return []

    wait_for(lambda: {"console", "receipt"} <= set(stages()), 10, "the trace did not show the decision and receipt")
    screenshot(browser, "trace")


def test_a_denied_refund_never_reaches_the_downstream(
    fleet: Fleet, shop: ReachClient, browser: WebDriver, downstream: CountingSystem
) -> None:
    log_in(browser, fleet, "alice", "/approvals")
    title = f"refund order 8 {RUN}"
    intent_id = park_refund(shop, title, 1200)
    wait_for(lambda: intent_id in pending(browser), 15, "the approval did not appear")
    on_live(browser, lambda: approval(browser, intent_id).find_element(By.NAME, "reason").send_keys("not our order"))
    approval(browser, intent_id).find_element(By.CSS_SELECTOR, "button.deny").click()
    receipt = shop.wait(intent_id, timeout=30)
    assert not receipt.success and receipt.error is not None and receipt.error.code == "APPROVAL_DENIED"
    time.sleep(1)
    assert downstream.requests(title=title) == []


def test_a_viewer_sees_no_buttons_and_the_browsers_posts_for_it_are_refused(
    fleet: Fleet, shop: ReachClient, browser: WebDriver, downstream: CountingSystem
) -> None:
    title = f"refund order 9 {RUN}"
    intent_id = park_refund(shop, title, 700)
    log_in(browser, fleet, "vera", "/approvals")
    wait_for(lambda: intent_id in pending(browser), 15, "the approval is not shown to the viewer")
    assert browser.find_elements(By.CSS_SELECTOR, "#live button") == []
    approval_id = shop.notice(intent_id).approval_id  # type: ignore[union-attr]
    for token in (False, True):
        assert post_from_page(browser, f"/approvals/{approval_id}/approve", token) == 403
        assert post_from_page(browser, "/fleet/notes/pause", token) == 403
        assert post_from_page(browser, "/dead-letters/replay", token) == 403
    browser.get(f"{fleet.console_url}/fleet")  # type: ignore[attr-defined]
    wait_live(browser)
    assert browser.find_elements(By.CSS_SELECTOR, "button.pause, button.resume") == []
    assert not is_paused(redis.Redis.from_url(REDIS_URL), "notes")
    time.sleep(0.5)
    assert downstream.requests(title=title) == []  # still parked
    assert shop.notice(intent_id) is not None


def test_an_operators_post_without_the_csrf_token_is_refused(fleet: Fleet, browser: WebDriver) -> None:
    log_in(browser, fleet, "olga", "/fleet")
    assert post_from_page(browser, "/fleet/notes/pause", token=False) == 403
    assert not is_paused(redis.Redis.from_url(REDIS_URL), "notes")


def test_pause_and_resume_from_the_page_stop_and_restart_the_pools(fleet: Fleet, browser: WebDriver) -> None:
    client = redis.Redis.from_url(REDIS_URL)
    log_in(browser, fleet, "olga", "/fleet")
    screenshot(browser, "fleet")
    on_live(browser, lambda: browser.find_element(By.CSS_SELECTOR, "#connector-notes button.pause").click())
    wait_for(lambda: is_paused(client, "notes"), 10, "notes was not paused")
    wait_for(lambda: queue_depth(connector_queue("notes").name)[1] == 0, 15, "the notes pool still consumes")
    shown = "return document.getElementById('connector-notes').dataset.paused"
    wait_for(lambda: browser.execute_script(shown) == "yes", 10, "the page does not show notes paused")
    assert browser.find_elements(By.CSS_SELECTOR, "#connector-notes button.resume")
    assert queue_depth(connector_queue("payments").name)[1] == 1  # only the one paused
    on_live(browser, lambda: browser.find_element(By.CSS_SELECTOR, "#connector-notes button.resume").click())
    wait_for(lambda: not is_paused(client, "notes"), 10, "notes was not resumed")
    wait_for(lambda: queue_depth(connector_queue("notes").name)[1] == 1, 15, "the notes pool did not consume again")
    wait_for(lambda: browser.execute_script(shown) == "no", 10, "the page does not show notes resumed")


def test_a_dead_letter_is_listed_and_replayed_from_the_page(
    fleet: Fleet, shop: ReachClient, browser: WebDriver, downstream: CountingSystem
) -> None:
    purge(DLQ.name)
    intent_id = f"letter-{RUN}"
    title = f"note from a dead letter {RUN}"
    body = json.dumps(
        {"intent_id": intent_id, "agent_id": AGENT, "action": "notes.add_note", "params": {"title": title}}
    )
    headers = {
        "x-reach-reason": "simulated: the router could not read it then",
        "x-reach-intent-id": intent_id,
        "x-reach-agent-id": AGENT,
        "x-reach-received-at": datetime.now().astimezone().isoformat(),
    }
    with Connection(BROKER_URL, transport_options={"confirm_publish": True}) as conn:
        conn.Producer().publish(
            body.encode(),
            exchange=DEFAULT_EXCHANGE,
            routing_key=DLQ.name,
            content_type="application/json",
            content_encoding="utf-8",
            delivery_mode=2,
            message_id=intent_id,
            headers=headers,
        )
    wait_for(lambda: queue_depth(DLQ.name)[0] == 1, 10, "the letter did not reach reach.dlq")
    log_in(browser, fleet, "olga", "/dead-letters")
    letter = f'tr.letter[data-message-id="{intent_id}"]'

    def listed() -> bool:
        return bool(browser.find_elements(By.CSS_SELECTOR, letter))

    deadline = time.monotonic() + 30  # the page polls every 5 s
    while not listed():
        if time.monotonic() > deadline:  # say what the page showed instead
            shown = browser.execute_script("return document.getElementById('live').innerText")
            raise AssertionError(f"dead letter not listed; reach.dlq holds {queue_depth(DLQ.name)}; page: {shown!r}")
        time.sleep(0.1)
    assert "simulated" in on_live(browser, lambda: browser.find_element(By.CSS_SELECTOR, letter).text)
    screenshot(browser, "dead-letters")
    assert downstream.requests(title=title) == []
    on_live(browser, lambda: browser.find_element(By.CSS_SELECTOR, f"{letter} button.replay").click())
    receipt = shop.wait(intent_id, timeout=30)
    assert receipt.success, receipt
    assert len(downstream.requests("POST", title=title)) == 1
    wait_for(lambda: queue_depth(DLQ.name)[0] == 0, 10, "the replayed letter is still in reach.dlq")
    wait_for(lambda: browser.find_elements(By.ID, "no-dead-letters"), 15, "the page still lists the letter")

    def audited() -> list[dict[str, object]]:
        lines = [json.loads(line) for line in fleet.log_lines("console") if '"stage":"console"' in line]
        return [e for e in lines if e["action"] == "replay" and e.get("target") == intent_id]

    replays = wait_for(audited, 10, "the console's audit line for the replay")
    assert replays[0]["user"] == "olga" and replays[0]["result"] == "ok" and replays[0]["replayed"] == [intent_id]


def test_logging_out_in_the_browser_makes_a_copy_of_its_cookie_worthless(fleet: Fleet, browser: WebDriver) -> None:
    """The session cookie is signed, not stored: the logout is recorded in Redis, so a copy taken
    before it (a stolen cookie) is refused afterwards, by this console and by any other replica."""
    import httpx

    base: str = fleet.console_url  # type: ignore[attr-defined]
    log_in(browser, fleet, "olga")
    cookie = browser.get_cookie("reach_console")
    assert cookie is not None
    with httpx.Client(base_url=base, cookies={"reach_console": cookie["value"]}, follow_redirects=False) as copy:
        assert copy.get("/fleet").status_code == 200  # the copy works while the session lasts
        browser.find_element(By.CSS_SELECTOR, "form.logout button").click()
        wait_for(lambda: browser.find_elements(By.ID, "login-button"), 10, "the logout did not reach the login page")
        answer = copy.get("/fleet")
        assert answer.status_code == 303 and answer.headers["location"].startswith("/login")
        assert copy.get("/fleet/live").status_code == 401
    store = redis.Redis.from_url(REDIS_URL)
    ended = list(store.scan_iter(match=keys.console_session_ended("*"), count=1000))
    # remembered only while the session could still have been used
    assert ended and all(0 < store.ttl(key) <= Settings().console_session_ttl_seconds + 1 for key in ended)
