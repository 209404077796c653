"""Network faults, retries, the shared circuit breaker and health checks through the real fleet.

Connector ``flaky`` reaches its downstream through tests/integration/faultproxy.py (latency,
resets, blackhole, refusal, switched at run time) with short timeouts, two attempts and a
breaker of fail_max 3 / reset_timeout 2 s. ``healthy`` has a downstream of its own and must not
notice anything. Requests are counted at the proxy (attempts) and at the downstream (what
arrived there).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
import redis

from producers.client import ReachClient
from producers.wire import Receipt
from tests.fleet import BROKER_URL, REDIS_URL, Fleet
from tests.integration.counting_system import CountingSystem
from tests.integration.faultproxy import FaultProxy
from tests.waiting import wait_for
from workers.state import keys

RUN = uuid.uuid4().hex[:6]
AGENT = f"faults_{RUN}"
TIMEOUT = 0.5  # flaky's action timeout (s)
ATTEMPTS = 2  # flaky's retry.max_attempts
MAX_BACKOFF = 0.2  # flaky's retry.max_backoff (s)
MARGIN = 1.5  # router, queues and receipt on a loaded machine (s)
RESET_TIMEOUT = 2.0  # flaky's breaker.reset_timeout (s)

CATALOG = """
connector:
  name: flaky
  endpoint: {proxy}
  breaker: {{ fail_max: 3, reset_timeout: 2s }}
  retry: {{ max_attempts: 2, initial_backoff: 50ms, max_backoff: 200ms }}
  pool: {{ concurrency: 4 }}
  actions:
    - action: read_item
      path: GET /items/{{id}}
      input:
        id: {{ type: string, required: true }}
      permission: read
      timeout: 500ms
      idempotent: true
    - action: read_patiently
      description: The same read, willing to wait out a Retry-After of up to 2 s
      path: GET /items/{{id}}
      input:
        id: {{ type: string, required: true }}
      permission: read
      timeout: 500ms
      idempotent: true
      retry: {{ max_attempts: 2, initial_backoff: 50ms, max_backoff: 2s }}
    - action: create_item
      path: POST /items
      input:
        title: {{ type: string, required: true }}
      permission: write
      timeout: 500ms
      idempotent: false
---
connector:
  name: stuck
  description: Same proxy as flaky, but a breaker that never opens, so a backlog stays a backlog
  endpoint: {proxy}
  breaker: {{ fail_max: 1000, reset_timeout: 2s }}
  retry: {{ max_attempts: 1 }}
  pool: {{ concurrency: 2 }}
  actions:
    - action: read_item
      path: GET /items/{{id}}
      input:
        id: {{ type: string, required: true }}
      permission: read
      timeout: 1s
---
connector:
  name: healthy
  endpoint: {healthy}
  pool: {{ concurrency: 4 }}
  actions:
    - action: read_item
      path: GET /items/{{id}}
      input:
        id: {{ type: string, required: true }}
      permission: read
      timeout: 2s
---
connector:
  name: probed
  endpoint: {probed}
  health: {{ path: GET /health, interval: 1s }}
  actions:
    - action: read_item
      path: GET /items/{{id}}
      input:
        id: {{ type: string, required: true }}
      permission: read
      timeout: 2s
---
agent_app:
  name: {agent}
  connector_bindings:
    - connector: flaky
      allowed_actions: ["*"]
    - connector: stuck
      allowed_actions: ["*"]
    - connector: healthy
      allowed_actions: ["*"]
    - connector: probed
      allowed_actions: ["*"]
"""
CONNECTORS = ["flaky", "stuck", "healthy", "probed"]


@pytest.fixture(scope="module")
def downstreams() -> Iterator[dict[str, CountingSystem]]:
    running = {name: CountingSystem().start() for name in ("flaky", "healthy", "probed")}
    yield running
    for system in running.values():
        system.stop()


@pytest.fixture(scope="module")
def proxy(downstreams: dict[str, CountingSystem]) -> Iterator[FaultProxy]:
    running = FaultProxy(downstreams["flaky"].port).start()
    yield running
    running.stop()


@pytest.fixture(scope="module")
def fleet(downstreams: dict[str, CountingSystem], proxy: FaultProxy) -> Iterator[Fleet]:
    reset_marks()
    catalog = CATALOG.format(
        proxy=proxy.url, healthy=downstreams["healthy"].url, probed=downstreams["probed"].url, agent=AGENT
    )
    with Fleet(catalog, ["flaky", "stuck", "healthy", "probed"]) as running:
        yield running


def reset_marks() -> None:
    """Forget breaker and health state (this Redis database may hold an earlier run's)."""
    client = redis.Redis.from_url(REDIS_URL)
    for name in CONNECTORS:
        client.delete(keys.breaker(name), keys.health(name))


@pytest.fixture
def flaky(downstreams: dict[str, CountingSystem], proxy: FaultProxy, fleet: Fleet) -> Iterator[CountingSystem]:
    """flaky's downstream, reset; the proxy healed and the breakers closed before and after."""
    proxy.set("pass")
    reset_marks()
    for system in downstreams.values():
        system.state.reset()
    yield downstreams["flaky"]
    proxy.set("pass")
    reset_marks()


@pytest.fixture
def client(fleet: Fleet) -> Iterator[ReachClient]:
    with ReachClient(AGENT, BROKER_URL, reply_to=f"{AGENT}.{uuid.uuid4().hex[:8]}", drop_duplicates=False) as reach:
        yield reach


def timed(client: ReachClient, action: str, params: dict[str, str], timeout: float = 20) -> tuple[Receipt, float]:
    started = time.perf_counter()
    receipt = client.call(action, params, timeout=timeout)
    return receipt, time.perf_counter() - started


def proxy_delta(proxy: FaultProxy, before: tuple[int, int, int]) -> tuple[int, int, int]:
    time.sleep(0.1)  # the proxy's bookkeeping runs on its own threads
    return tuple(now - then for now, then in zip(proxy.counts(), before))  # type: ignore[return-value]


# -- timeouts are bounded ------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["blackhole", "latency"])
def test_a_read_that_gets_no_answer_times_out_on_every_attempt_within_its_bound(
    flaky: CountingSystem, proxy: FaultProxy, client: ReachClient, mode: str
) -> None:
    proxy.set(mode, latency=3 * TIMEOUT)
    before = proxy.counts()
    receipt, elapsed = timed(client, "flaky.read_item", {"id": "IT-1"})
    assert receipt.status == "failed" and receipt.error.code == "DOWNSTREAM_TIMEOUT", receipt
    assert receipt.error.retryable is True and receipt.execution.attempts == ATTEMPTS
    assert TIMEOUT * ATTEMPTS <= elapsed < TIMEOUT * ATTEMPTS + MAX_BACKOFF + MARGIN, elapsed
    requests, _, _ = proxy_delta(proxy, before)
    assert requests == ATTEMPTS
    if mode == "latency":  # the delayed requests still arrive, after the pool gave up on them
        wait_for(
            lambda: len(flaky.requests("GET")), 10, "the delayed requests never arrived", until=lambda n: n >= ATTEMPTS
        )
        assert len(flaky.requests("GET")) == ATTEMPTS
    else:
        assert flaky.requests() == []


def test_a_write_that_gets_no_answer_is_outcome_unknown_and_not_repeated(
    flaky: CountingSystem, proxy: FaultProxy, client: ReachClient
) -> None:
    proxy.set("blackhole")
    before = proxy.counts()
    receipt, elapsed = timed(client, "flaky.create_item", {"title": f"{RUN}-blackholed"})
    assert receipt.status == "unknown" and receipt.error.code == "OUTCOME_UNKNOWN", receipt
    assert receipt.error.retryable is False and receipt.execution.attempts == 1
    assert TIMEOUT <= elapsed < TIMEOUT + MARGIN, elapsed
    assert proxy_delta(proxy, before)[0] == 1


def test_added_latency_below_the_timeout_only_slows_the_call(
    flaky: CountingSystem, proxy: FaultProxy, client: ReachClient
) -> None:
    proxy.set("latency", latency=0.2)
    receipt, _ = timed(client, "flaky.read_item", {"id": "IT-2"})
    assert receipt.status == "succeeded" and receipt.execution.attempts == 1
    assert receipt.execution.downstream_ms >= 200
    assert len(flaky.requests("GET")) == 1


# -- resets and refusals -------------------------------------------------------------------------


@pytest.mark.parametrize("mode, reaches_system", [("reset_before", False), ("reset_after", True)])
def test_a_reset_connection_on_a_read_is_retried_and_reported_as_downstream_error(
    flaky: CountingSystem, proxy: FaultProxy, client: ReachClient, mode: str, reaches_system: bool
) -> None:
    proxy.set(mode)
    before = proxy.counts()
    receipt, _ = timed(client, "flaky.read_item", {"id": "IT-3"})
    assert receipt.error is not None and receipt.error.code == "DOWNSTREAM_ERROR", receipt
    assert receipt.error.retryable is True and receipt.execution.attempts == ATTEMPTS
    requests, _, resets = proxy_delta(proxy, before)
    assert requests == ATTEMPTS and resets == ATTEMPTS
    assert len(flaky.requests("GET")) == (ATTEMPTS if reaches_system else 0)


@pytest.mark.parametrize("mode, executed", [("reset_before", 0), ("reset_after", 1)])
def test_a_reset_connection_on_a_write_is_outcome_unknown_and_never_repeated(
    flaky: CountingSystem, proxy: FaultProxy, client: ReachClient, mode: str, executed: int
) -> None:
    proxy.set(mode)
    title = f"{RUN}-reset-{mode}"
    receipt, _ = timed(client, "flaky.create_item", {"title": title})
    assert receipt.status == "unknown" and receipt.error.code == "OUTCOME_UNKNOWN", receipt
    assert receipt.execution.attempts == 1 and receipt.error.retryable is False
    assert "read" in receipt.error.suggestion.lower() or "check" in receipt.error.suggestion.lower()
    time.sleep(0.1)
    assert len(flaky.requests("POST", title)) == executed and flaky.executions()[title] == executed


@pytest.mark.parametrize("action", ["read_item", "create_item"])
def test_a_refused_connection_is_unreachable_and_retried_even_for_a_write(
    flaky: CountingSystem, proxy: FaultProxy, client: ReachClient, action: str
) -> None:
    # warm the pool's keep-alive connection first: refusal must close it too
    assert timed(client, "flaky.read_item", {"id": "IT-warm"})[0].status == "succeeded"
    proxy.set("refuse")
    params = {"id": "IT-4"} if action == "read_item" else {"title": f"{RUN}-refused"}
    receipt, elapsed = timed(client, f"flaky.{action}", params)
    assert receipt.status == "failed" and receipt.error.code == "DOWNSTREAM_UNREACHABLE", receipt
    assert receipt.error.retryable is True
    # nothing was sent, so even a non-idempotent write is tried again
    assert receipt.execution.attempts == ATTEMPTS
    assert elapsed < MAX_BACKOFF + MARGIN
    assert flaky.requests("POST") == [] and len(flaky.requests("GET")) == 1  # only the warm-up


# -- HTTP answers: what is retried ---------------------------------------------------------------


@pytest.mark.parametrize(
    "status, code",
    [
        (400, "DOWNSTREAM_VALIDATION_FAILED"),
        (404, "DOWNSTREAM_NOT_FOUND"),
        (409, "DOWNSTREAM_CONFLICT"),
        (422, "DOWNSTREAM_VALIDATION_FAILED"),
    ],
)
def test_a_4xx_answer_is_never_retried(flaky: CountingSystem, client: ReachClient, status: int, code: str) -> None:
    flaky.state.fail_status, flaky.state.fail_count = status, 5
    receipt, _ = timed(client, "flaky.read_item", {"id": "IT-5"})
    assert receipt.status == "failed" and receipt.error.code == code and receipt.error.retryable is False
    assert receipt.execution.attempts == 1 and len(flaky.requests("GET")) == 1
    assert "injected failure" in receipt.error.message  # the system's own words


def test_429_with_retry_after_is_retried_no_sooner_than_it_says(flaky: CountingSystem, client: ReachClient) -> None:
    flaky.state.fail_status, flaky.state.fail_count, flaky.state.retry_after = 429, 1, "1"
    receipt, _ = timed(client, "flaky.read_patiently", {"id": "IT-6"})
    assert receipt.status == "succeeded" and receipt.execution.attempts == 2, receipt
    first, second = flaky.requests("GET")
    assert second["t"] - first["t"] >= 1.0


def test_429_asking_for_longer_than_max_backoff_is_handed_to_the_agent(
    flaky: CountingSystem, client: ReachClient
) -> None:
    """read_item's max_backoff is 200 ms: the pool does not sit out a 1 s Retry-After, it reports it."""
    flaky.state.fail_status, flaky.state.fail_count, flaky.state.retry_after = 429, 1, "1"
    receipt, _ = timed(client, "flaky.read_item", {"id": "IT-7"})
    assert receipt.error.code == "DOWNSTREAM_RATE_LIMITED" and receipt.error.retryable is True
    assert receipt.error.retry_after_ms == 1000 and receipt.execution.attempts == 1
    assert len(flaky.requests("GET")) == 1


def test_5xx_on_a_non_idempotent_write_is_not_retried(flaky: CountingSystem, client: ReachClient) -> None:
    flaky.state.fail_status, flaky.state.fail_count = 500, 5
    receipt, _ = timed(client, "flaky.create_item", {"title": f"{RUN}-500"})
    assert receipt.status == "failed" and receipt.error.code == "DOWNSTREAM_ERROR"
    assert receipt.execution.attempts == 1 and len(flaky.requests("POST")) == 1


def test_5xx_on_an_idempotent_read_is_retried_max_attempts_times(flaky: CountingSystem, client: ReachClient) -> None:
    flaky.state.fail_status, flaky.state.fail_count = 500, 5
    receipt, _ = timed(client, "flaky.read_item", {"id": "IT-8"})
    assert receipt.status == "failed" and receipt.error.code == "DOWNSTREAM_ERROR"
    assert receipt.execution.attempts == ATTEMPTS and len(flaky.requests("GET")) == ATTEMPTS
    reset_marks()  # those were 2 of the breaker's fail_max 3
    flaky.state.fail_count = 1  # one failure, then an answer: the retry saves the read
    receipt, _ = timed(client, "flaky.read_item", {"id": "IT-9"})
    assert receipt.status == "succeeded" and receipt.execution.attempts == 2


# -- the breaker ---------------------------------------------------------------------------------


def open_the_breaker(client: ReachClient, proxy: FaultProxy) -> float:
    """Blackhole flaky and send reads until fail_max (3) timeouts opened its breaker; returns when."""
    proxy.set("blackhole")
    first, _ = timed(client, "flaky.read_item", {"id": "IT-open-1"})  # two timeouts: 2 of fail_max 3
    assert first.error.code == "DOWNSTREAM_TIMEOUT" and first.execution.attempts == 2
    client.call("flaky.read_item", {"id": "IT-open-2"}, timeout=20)  # the third failure opens it
    return time.monotonic()


def test_breaker_opens_after_fail_max_answers_at_once_and_recovers_after_reset_timeout(
    flaky: CountingSystem, proxy: FaultProxy, client: ReachClient
) -> None:
    baseline = [timed(client, "healthy.read_item", {"id": "IT-b"})[1] for _ in range(3)]
    opened_at = open_the_breaker(client, proxy)
    before = proxy.counts()
    refused, elapsed = timed(client, "flaky.read_item", {"id": "IT-12"})
    assert refused.status == "rejected" and refused.error.code == "CONNECTOR_UNAVAILABLE", refused
    assert refused.error.retryable is True and 0 < refused.error.retry_after_ms <= RESET_TIMEOUT * 1000
    assert refused.execution.attempts == 0
    # at once: in about a router round trip, far below one action timeout
    assert elapsed < min(TIMEOUT * 0.7, max(baseline) + 0.3), (elapsed, baseline)
    assert proxy_delta(proxy, before)[0] == 0, "an open breaker must not let a request through"
    # writes are refused the same way
    assert timed(client, "flaky.create_item", {"title": f"{RUN}-refused"})[0].error.code == "CONNECTOR_UNAVAILABLE"
    # healed, and after reset_timeout a trial call goes through and closes the breaker
    proxy.set("pass")
    time.sleep(max(0.0, opened_at + RESET_TIMEOUT + 0.2 - time.monotonic()))
    trial, _ = timed(client, "flaky.read_item", {"id": "IT-13"})
    assert trial.status == "succeeded", trial
    after = [timed(client, "flaky.read_item", {"id": f"IT-{14 + i}"})[0] for i in range(3)]
    assert all(r.status == "succeeded" and r.execution.attempts == 1 for r in after)
    assert redis.Redis.from_url(REDIS_URL).hget(keys.breaker("flaky"), "state") == b"closed"


def test_half_open_breaker_lets_exactly_one_trial_through_and_reopens_when_it_fails(
    flaky: CountingSystem, proxy: FaultProxy, client: ReachClient
) -> None:
    opened_at = open_the_breaker(client, proxy)
    time.sleep(max(0.0, opened_at + RESET_TIMEOUT + 0.2 - time.monotonic()))
    assert redis.Redis.from_url(REDIS_URL).hget(keys.breaker("flaky"), "state") == b"open"
    before = proxy.counts()
    # four reads at once on four pool threads, still blackholed: one trial, three refusals
    ids = {client.publish("flaky.read_item", {"id": f"IT-trial-{i}"}) for i in range(4)}
    receipts = [client.wait(intent_id, timeout=5) for intent_id in ids]
    assert proxy_delta(proxy, before)[0] == 1, "half-open must let exactly one trial call through"
    refused = [r for r in receipts if r.execution.attempts == 0]
    assert len(refused) == 3 and all(r.error.code == "CONNECTOR_UNAVAILABLE" for r in refused), receipts
    # the failed trial opened it again: refused at once, for about another reset_timeout
    again, elapsed = timed(client, "flaky.read_item", {"id": "IT-trial-5"})
    assert again.error.code == "CONNECTOR_UNAVAILABLE" and again.error.retry_after_ms > RESET_TIMEOUT * 500
    assert elapsed < TIMEOUT and proxy_delta(proxy, before)[0] == 1


def test_a_retry_stopped_by_the_breaker_does_not_claim_the_system_was_never_called(
    flaky: CountingSystem, proxy: FaultProxy, client: ReachClient
) -> None:
    proxy.set("blackhole")
    client.call("flaky.read_item", {"id": "IT-30"}, timeout=20)  # 2 of fail_max 3
    before = proxy.counts()
    receipt, _ = timed(client, "flaky.read_item", {"id": "IT-31"})  # attempt 1 times out and opens it
    assert proxy_delta(proxy, before)[0] == 1  # the system was called
    assert receipt.status != "rejected", receipt
    assert receipt.error.code == "DOWNSTREAM_TIMEOUT" and receipt.execution.attempts == 1


def test_a_success_after_counted_failures_resets_them(
    flaky: CountingSystem, proxy: FaultProxy, client: ReachClient
) -> None:
    """The pool skips recording a success only when the breaker counted no failures; after some
    were counted, the next success resets them, so two later failures do not open the breaker."""
    breaker, stored = keys.breaker("flaky"), redis.Redis.from_url(REDIS_URL)
    proxy.set("blackhole")
    assert client.call("flaky.read_item", {"id": "IT-40"}, timeout=20).error.code == "DOWNSTREAM_TIMEOUT"
    assert stored.hget(breaker, "failures") == b"2"  # 2 of fail_max 3
    proxy.set("pass")
    assert client.call("flaky.read_item", {"id": "IT-41"}, timeout=20).status == "succeeded"
    assert stored.hget(breaker, "failures") == b"0"
    proxy.set("blackhole")
    again = client.call("flaky.read_item", {"id": "IT-42"}, timeout=20)
    assert again.error.code == "DOWNSTREAM_TIMEOUT" and again.execution.attempts == 2  # not refused: still closed
    assert stored.hget(breaker, "state") == b"closed"


# -- isolation -----------------------------------------------------------------------------------


def test_a_blackholed_connector_with_a_backlog_does_not_slow_another_connector(
    flaky: CountingSystem, proxy: FaultProxy, client: ReachClient
) -> None:
    """``stuck`` shares flaky's proxy but its breaker never opens, so its backlog of 1 s timeouts
    lasts (2 threads, 20 intents: about 10 s)."""
    baseline = [timed(client, "healthy.read_item", {"id": "IT-b"})[1] for _ in range(5)]
    proxy.set("blackhole")
    requests_before = proxy.counts()[0]
    backlog = {client.publish("stuck.read_item", {"id": f"IT-s{i}"}) for i in range(20)}
    # both of stuck's threads are now waiting on the blackhole
    wait_for(lambda: proxy.counts()[0] - requests_before >= 2, 10, "stuck's threads never reached the blackhole")
    during = []
    for _ in range(5):
        receipt, elapsed = timed(client, "healthy.read_item", {"id": "IT-b"})
        assert receipt.status == "succeeded"
        during.append(elapsed)
    done = [r for r in client.receipts(timeout=0.2) if r.intent_id in backlog]
    assert len(done) < 20, "the backlog was expected to still be in progress"
    assert max(during) < max(0.5, 5 * max(baseline)), (baseline, during)
    proxy.set("pass")  # drain the rest quickly
    finished = done + [r for r in client.receipts(timeout=5) if r.intent_id in backlog]
    assert {r.intent_id for r in finished} == backlog
    assert {r.error.code if r.error else r.status for r in finished} <= {"DOWNSTREAM_TIMEOUT", "succeeded"}


# -- health checks (reach beat) ------------------------------------------------------------------


def test_beat_marks_a_failing_health_check_down_and_the_router_refuses_until_it_recovers(
    downstreams: dict[str, CountingSystem], flaky: CountingSystem, fleet: Fleet, client: ReachClient
) -> None:
    probed = downstreams["probed"]
    fleet.start_process("beat", ["beat"])
    try:
        assert timed(client, "probed.read_item", {"id": "IT-h"})[0].status == "succeeded"
        probed.state.health_status = 503
        failing_since = time.monotonic()
        deadline = failing_since + 8
        while True:
            receipt, _ = timed(client, "probed.read_item", {"id": "IT-h"})
            if receipt.error is not None and receipt.error.code == "CONNECTOR_UNAVAILABLE":
                break
            assert time.monotonic() < deadline, "the router kept dispatching to a connector failing its health checks"
            time.sleep(0.2)
        noticed_after = time.monotonic() - failing_since
        assert noticed_after < 5.0  # two failed probes at 1 s intervals, and a little slack
        seen = len(probed.requests("GET"))
        refused, elapsed = timed(client, "probed.read_item", {"id": "IT-h"})
        assert refused.status == "rejected" and refused.error.code == "CONNECTOR_UNAVAILABLE"
        assert refused.error.retryable is True and refused.error.retry_after_ms == 1000
        assert "health" in refused.error.message
        assert len(probed.requests("GET")) == seen, "an unhealthy connector got a request"
        # the healthy connector is unaffected meanwhile
        assert timed(client, "healthy.read_item", {"id": "IT-b"})[0].status == "succeeded"
        probed.state.health_status = 200
        deadline = time.monotonic() + 8
        while timed(client, "probed.read_item", {"id": "IT-h"})[0].status != "succeeded":
            assert time.monotonic() < deadline, "the connector stayed refused after its health check recovered"
            time.sleep(0.2)
    finally:
        fleet.stop_process("beat")
        reset_marks()
