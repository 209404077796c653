"""The console's Runs page (issue 32) against a real fleet: router, the shop's pool, the workflow
runner and ``reach console``, with the fake shop of the workflow tests (tests/integration/workflow_shop.py).

A run parks when its last step is refused and an undo keeps failing. In a real browser an operator
finds it on the Runs page, opens its timeline (each step's intent, status, code, times), flips the
shop's switch and clicks Resume: each undo reaches the shop once, newest first, and the page shows
the run failed with its steps undone. A viewer sees the same pages without a button, and the
browser's own POSTs for it are refused. Over plain HTTP: viewers and approvers are refused (403)
with a valid CSRF token, an operator without one too, and what a run's records carry from agents
(step codes and messages) is shown as text, never as markup.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import httpx
import pytest
import redis
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from producers.client import ReachClient
from tests.fleet import Fleet, free_port
from tests.integration.browser import chromium
from tests.integration.test_console import on_live, post_from_page, screenshot
from tests.integration.workflow_shop import AGENT, Shop, catalog, order, running_shop, start_runner
from tests.waiting import wait_for
from workers.console.users import hash_password
from workers.ops.workflow_commands import find_run
from workers.state.workflow_runs import WorkflowRuns
from workers.workflows.model import Run

pytestmark = pytest.mark.integration

USERS = {"olga": ("operator", "olga-pw"), "vera": ("viewer", "vera-pw"), "alice": ("approver", "alice-pw")}
HOSTILE = '<img src=x id="injected" onerror="document.title=1">'


@pytest.fixture(scope="module")
def shop() -> Iterator[Shop]:
    with running_shop() as server:
        yield server


@pytest.fixture(scope="module")
def fleet(shop: Shop, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    users = tmp_path_factory.mktemp("console-runs") / "users.yaml"
    users.write_text(
        "".join(f"{n}: {{password_hash: '{hash_password(p)}', role: {r}}}\n" for n, (r, p) in USERS.items())
    )
    with Fleet(catalog(shop.url), ["wfshop"]) as running:
        start_runner(running)
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
def agent(fleet: Fleet) -> Iterator[ReachClient]:
    with ReachClient(AGENT, fleet.broker_url, drop_duplicates=False) as client:
        yield client


@pytest.fixture(scope="module")
def browser(fleet: Fleet) -> Iterator[WebDriver]:
    driver = chromium(fleet.log_dir)
    yield driver
    driver.quit()


def base(fleet: Fleet) -> str:
    url: str = fleet.console_url  # type: ignore[attr-defined]
    return url


def runs_of(fleet: Fleet) -> WorkflowRuns:
    return WorkflowRuns(redis.Redis.from_url(fleet.redis_url), 3600)


def state_of(fleet: Fleet, run_id: str) -> str:
    return find_run(runs_of(fleet), run_id, AGENT).state


def parked_run(shop: Shop, agent: ReachClient) -> tuple[str, str]:
    """A run of refund_quick (6 s timeout) whose notice is refused and whose refund cannot be
    cancelled (500) until the test flips the switch: it parks with COMPENSATION_FAILED."""
    order_id = order()
    shop.conflict_on.add(order_id)
    shop.failing.add(("/refunds/cancel", f"R-{order_id}"))
    intent_id = agent.publish("refund_quick", {"order_id": order_id})
    receipt = agent.wait(intent_id, timeout=40)
    assert receipt.error is not None and receipt.error.code == "COMPENSATION_FAILED", receipt
    return order_id, intent_id


def log_in(browser: WebDriver, fleet: Fleet, name: str, page: str) -> None:
    browser.delete_all_cookies()
    browser.get(f"{base(fleet)}/login?next={quote(page)}")
    browser.find_element(By.ID, "name").send_keys(name)
    browser.find_element(By.ID, "password").send_keys(USERS[name][1])
    browser.find_element(By.ID, "login-button").click()
    wait_for(lambda: browser.find_elements(By.ID, "who"), 10, f"{name} was not logged in")


def shown(browser: WebDriver, script: str) -> Any:
    """What ``script`` reads from the page now (the live region may be replaced any time)."""
    return browser.execute_script(script)


def timeline(browser: WebDriver) -> list[dict[str, str]]:
    return list(
        shown(
            browser,
            """return [...document.querySelectorAll('#timeline tr.step')].map(r => ({
                 step: r.dataset.step, status: r.dataset.status, undone: r.dataset.undone,
                 cells: [...r.cells].map(c => c.innerText.trim())}))""",
        )
    )


def test_an_operator_finds_a_parked_run_reads_its_timeline_and_resumes_it_from_the_page(
    fleet: Fleet, shop: Shop, agent: ReachClient, browser: WebDriver
) -> None:
    order_id, run_id = parked_run(shop, agent)
    log_in(browser, fleet, "olga", f"/runs?agent={AGENT}")
    row = f'tr.run[data-run-id="{run_id}"]'
    wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, row), 15, "the run is not listed")
    cells = on_live(browser, lambda: [c.text for c in browser.find_elements(By.CSS_SELECTOR, f"{row} td")])
    assert cells[0] == run_id and cells[1] == "refund_quick" and cells[2] == AGENT
    assert cells[3] == "parked" and cells[5] == "3" and cells[6] == "notify"
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", cells[4])
    screenshot(browser, "runs")

    on_live(browser, lambda: browser.find_element(By.CSS_SELECTOR, f"{row} a.run-link").click())
    wait_for(lambda: browser.find_elements(By.ID, "timeline"), 15, "the run page shows no timeline")
    assert shown(browser, "return document.getElementById('run').dataset.state") == "parked"
    steps = timeline(browser)
    assert [(s["step"], s["status"], s["undone"]) for s in steps] == [
        ("hold", "succeeded", "no"),
        ("refund", "succeeded", "no"),
        ("notify", "failed", "no"),
    ]
    hold, refund, notify = (s["cells"] for s in steps)
    assert hold[1] == "wfshop.hold_order" and hold[2]  # its intent id, linked to its trace
    assert notify[4].startswith("DOWNSTREAM_CONFLICT"), notify  # the step's own code
    assert refund[5].startswith("failed (try"), refund  # the undo that keeps failing
    for cells in (hold, refund, notify):  # sent and answered, from the step's trace
        assert re.fullmatch(r"\d\d:\d\d:\d\d\.\d{3}", cells[6]) and re.fullmatch(r"\d\d:\d\d:\d\d\.\d{3}", cells[7])
        assert cells[6] <= cells[7]
    assert "COMPENSATION_FAILED" in browser.find_element(By.ID, "run-error-code").text
    screenshot(browser, "run")

    assert shop.calls(order_id) == ["/holds", "/refunds"]
    shop.failing.discard(("/refunds/cancel", f"R-{order_id}"))  # the switch flips
    on_live(browser, lambda: browser.find_element(By.ID, "resume-run").click())
    wait_for(lambda: "resumed" in browser.find_element(By.ID, "flash").text, 10, "no 'resumed' message")
    wait_for(lambda: state_of(fleet, run_id) == "failed", 30, "the resumed run never ended")
    assert shop.calls(order_id) == ["/holds", "/refunds", "/refunds/cancel", "/holds/release"]
    wait_for(
        lambda: [s["undone"] for s in timeline(browser)] == ["yes", "yes", "no"], 15, "the page does not show the undos"
    )
    wait_for(lambda: not browser.find_elements(By.ID, "resume-run"), 10, "a failed run still offers Resume")
    events = shown(browser, "return [...document.querySelectorAll('#run-events tr.event')].map(r => r.innerText)")
    assert any("resumed" in e and "olga" in e for e in events), events
    # the operator's action is in the run's own trace as well
    browser.get(f"{base(fleet)}/trace?intent_id={run_id}&agent={AGENT}")
    stages = [c.text for c in browser.find_elements(By.CSS_SELECTOR, "#trace td.stage")]
    assert "console" in stages, stages
    time.sleep(1)
    assert shop.tries("/holds/release", f"H-{order_id}") == [200]  # each undo once


def test_a_viewer_reads_runs_without_buttons_and_the_browsers_posts_for_it_are_refused(
    fleet: Fleet, shop: Shop, agent: ReachClient, browser: WebDriver
) -> None:
    order_id, run_id = parked_run(shop, agent)
    log_in(browser, fleet, "vera", f"/run?agent={AGENT}&id={run_id}")
    wait_for(lambda: browser.find_elements(By.ID, "timeline"), 15, "the viewer sees no timeline")
    assert len(timeline(browser)) == 3
    assert browser.find_elements(By.CSS_SELECTOR, "#live button, #live form") == []
    form = {"agent": AGENT, "run_id": run_id}
    for token in (False, True):
        assert post_from_page(browser, "/run/resume", token, form) == 403
        assert post_from_page(browser, "/run/abort", token, form) == 403
    assert state_of(fleet, run_id) == "parked"
    assert shop.calls(order_id) == ["/holds", "/refunds"]
    browser.get(f"{base(fleet)}/runs?agent={AGENT}")
    wait_for(
        lambda: browser.find_elements(By.CSS_SELECTOR, f'tr.run[data-run-id="{run_id}"]'), 15, "the run is not listed"
    )
    assert browser.find_elements(By.CSS_SELECTOR, "#live button") == []


# -- over plain HTTP ---------------------------------------------------------------------------------


def session(fleet: Fleet, name: str) -> tuple[httpx.Client, str]:
    """A logged-in client (cookie and Origin as a browser sends them) and its CSRF token."""
    url = base(fleet)
    client = httpx.Client(base_url=url, headers={"Origin": url}, timeout=30)
    token = re.search(r'name="csrf_token" value="([^"]+)"', client.get("/login").text)
    assert token
    answer = client.post("/login", data={"name": name, "password": USERS[name][1], "csrf_token": token.group(1)})
    assert answer.status_code == 303, answer.text
    token = re.search(r'name="csrf-token" content="([^"]+)"', client.get("/runs").text)
    assert token
    return client, token.group(1)


def act(client: httpx.Client, verb: str, run_id: str, token: str | None) -> httpx.Response:
    headers = {"X-Requested-With": "fetch", **({"X-CSRF-Token": token} if token else {})}
    return client.post(f"/run/{verb}", data={"agent": AGENT, "run_id": run_id}, headers=headers)


def test_only_an_operator_with_the_csrf_token_may_resume_or_abort(fleet: Fleet, shop: Shop, agent: ReachClient) -> None:
    _, run_id = parked_run(shop, agent)
    for name in ("vera", "alice"):  # viewer, approver
        client, token = session(fleet, name)
        page = client.get("/run/live", params={"agent": AGENT, "id": run_id})
        assert page.status_code == 200 and "timeline" in page.text and "/run/resume" not in page.text
        for verb in ("resume", "abort"):
            refused = act(client, verb, run_id, token)
            assert refused.status_code == 403, (name, verb, refused.text)
            assert "needs the operator role" in refused.json()["message"]
        client.close()
    client, token = session(fleet, "olga")
    assert "/run/resume" in client.get("/run/live", params={"agent": AGENT, "id": run_id}).text
    assert act(client, "abort", run_id, None).status_code == 403  # no CSRF token
    assert state_of(fleet, run_id) == "parked"
    assert act(client, "abort", run_id, token).json()["ok"] is True
    assert state_of(fleet, run_id) == "failed"
    again = act(client, "abort", run_id, token)
    assert again.status_code == 409 and "only a parked or unknown run" in again.json()["message"]
    assert act(client, "resume", "no-such-run", token).status_code == 404
    assert act(client, "explode", run_id, token).status_code == 404
    client.close()
    anonymous = httpx.Client(base_url=base(fleet), headers={"Origin": base(fleet)}, timeout=30)
    assert anonymous.get("/runs").status_code == 303
    assert anonymous.get("/run/live", params={"agent": AGENT, "id": run_id}).status_code == 401
    assert act(anonymous, "resume", run_id, None).status_code == 401
    anonymous.close()


def test_what_agents_put_in_a_run_is_shown_as_text(
    fleet: Fleet, shop: Shop, agent: ReachClient, browser: WebDriver
) -> None:
    """Step codes and messages come from agents and the systems they call: a copy of a real run
    with markup in them is rendered escaped, in the list, on the run page and in the browser."""
    _, source = parked_run(shop, agent)
    runs = runs_of(fleet)
    stored = runs.load(AGENT, source)
    assert stored is not None
    original = Run.from_json(stored.doc)
    run_id = f"x.{uuid.uuid4().hex[:8]}"
    steps = [s.model_copy(update={"code": HOSTILE, "message": HOSTILE}) for s in original.steps]
    forged = original.model_copy(update={"run_id": run_id, "steps": steps, "started_at": time.time()})
    assert runs.write(AGENT, run_id, 0, forged.to_json(), keep_until=None)
    runs.remember(AGENT, run_id, forged.started_at)

    client, _ = session(fleet, "vera")
    page = client.get("/run/live", params={"agent": AGENT, "id": run_id}).text
    assert HOSTILE not in page and "&lt;img src=x id=&#34;injected&#34;" in page
    assert HOSTILE not in client.get("/runs/live", params={"agent": AGENT}).text
    assert client.get("/run/live", params={"agent": AGENT, "id": "<b>"}).text.count("<b>") == 0
    client.close()
    log_in(browser, fleet, "vera", f"/run?agent={AGENT}&id={run_id}")
    wait_for(lambda: browser.find_elements(By.ID, "timeline"), 15, "no timeline")
    assert browser.find_elements(By.ID, "injected") == []
    assert shown(browser, "return document.title") != "1"
    codes = [s["cells"][4] for s in timeline(browser)]
    assert all(HOSTILE in c for c in codes), codes  # the markup itself, as text


def test_the_runs_list_is_newest_first_and_bounded_with_a_notice_that_older_runs_are_kept(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    from workers.console import views
    from workers.settings import Settings

    console = views.Fleet(
        Settings.from_env({"REACH_REDIS_URL": fleet.redis_url, "REACH_BROKER_URL": fleet.broker_url}),
        redis.Redis.from_url(fleet.redis_url),
    )
    monkeypatch.setattr(views, "RUNS_SHOWN", 10_000)
    every = console.runs(AGENT)
    assert isinstance(every, views.RunsPage) and not every.more and len(every.rows) >= 3  # the tests' runs
    started = [row.started for row in every.rows]
    assert started == sorted(started, reverse=True)
    # the agent's runs of other test modules on this worker (post_order has 2 steps) may be listed too
    assert all(row.owner == AGENT and row.steps in (1, 2, 3) for row in every.rows), every.rows
    monkeypatch.setattr(views, "RUNS_SHOWN", 2)
    bounded = console.runs(AGENT)
    assert isinstance(bounded, views.RunsPage) and bounded.more
    assert [r.run_id for r in bounded.rows] == [r.run_id for r in every.rows[:2]]
    parked = console.runs(AGENT, "parked")
    assert parked.rows and {r.state for r in parked.rows} == {"parked"}
    assert console.runs(AGENT, "no-such-state").rows == every.rows[:2]  # not a state: no filter
