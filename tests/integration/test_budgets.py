"""Value budgets in the real Redis and a real fleet: what the downstream received never sums past a
budget, over budget is BUDGET_EXCEEDED with when to retry, a failed intent gives its amount back
(once), and the window rolls."""

from __future__ import annotations

import random
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
import redis

from connectors.spec import BudgetSpec
from producers.wire import ErrorCode, Receipt
from tests.fleet import REDIS_URL, Fleet, agent
from tests.integration.counting_system import CountingSystem
from tests.waiting import wait_for
from workers.ops.approval_decisions import approve, deny, list_pending
from workers.state.budgets import RedisBudgets, Spend, release_intent

# -- the scripts on their own --------------------------------------------------------------


def budget(max_: float, per: str = "1h") -> BudgetSpec:
    return BudgetSpec(param="amount", max=max_, per=per)


@pytest.fixture
def counter() -> RedisBudgets:
    return RedisBudgets(redis.Redis.from_url(REDIS_URL))


TAG = "t" * 64  # what the intents of a test are bound to (budget_tag)


def fresh() -> str:
    return f"b_{uuid.uuid4().hex[:10]}"


def test_amounts_are_summed_until_the_next_one_does_not_fit(counter: RedisBudgets) -> None:
    who, b = fresh(), budget(500)
    assert counter.reserve(who, "shop", "i1", TAG, [Spend(b, 200)]).allowed
    assert counter.reserve(who, "shop", "i2", TAG, [Spend(b, 299.5)]).allowed
    over = counter.reserve(who, "shop", "i3", TAG, [Spend(b, 1)])
    assert not over.allowed and [(e.budget, e.used) for e in over.over] == [(b, 499.5)]
    assert 3_590_000 < over.over[0].retry_after_ms <= 3_600_000  # when i1 leaves the hour
    assert counter.reserve(who, "shop", "i4", TAG, [Spend(b, 0.5)]).allowed  # exactly full fits


def test_a_repeat_counted_longer_ago_than_outcomes_are_kept_is_not_waved_through() -> None:
    """Within the pools' idempotency horizon a repeated intent is counted once (the pool answers it
    from its ledger); past it the pool would run it again, so the repeat is not taken as counted."""
    counter = RedisBudgets(redis.Redis.from_url(REDIS_URL), repeat_within_ms=400)
    who, b = fresh(), budget(500, "1d")
    assert counter.reserve(who, "shop", "x", TAG, [Spend(b, 300)]).allowed
    assert counter.reserve(who, "shop", "x", TAG, [Spend(b, 300)]).allowed  # a repeat: counted once
    assert counter.reserve(who, "shop", "y", TAG, [Spend(b, 200)]).allowed  # 300 + 200: it was once
    time.sleep(0.6)
    stale = counter.reserve(who, "shop", "x", TAG, [Spend(b, 300)])
    assert not stale.allowed and stale.stale and not stale.reused and stale.over == ()
    # and the window still holds x once: nothing more fits
    assert counter.reserve(who, "shop", "z", TAG, [Spend(b, 1)]).over[0].used == 500


def test_retry_after_is_when_enough_has_left_the_window(counter: RedisBudgets) -> None:
    who, b = fresh(), budget(10, "3s")
    assert counter.reserve(who, "shop", "a", TAG, [Spend(b, 2)]).allowed
    time.sleep(1.0)
    assert counter.reserve(who, "shop", "b", TAG, [Spend(b, 8)]).allowed
    small = counter.reserve(who, "shop", "c", TAG, [Spend(b, 2)])  # a's 2 leaving is enough
    large = counter.reserve(who, "shop", "d", TAG, [Spend(b, 5)])  # b's 8 must leave too
    assert not small.allowed and not large.allowed
    assert 1_500 < small.over[0].retry_after_ms <= 2_000 and 2_500 < large.over[0].retry_after_ms <= 3_000
    time.sleep(small.over[0].retry_after_ms / 1000 + 0.05)
    assert counter.reserve(who, "shop", "c", TAG, [Spend(b, 2)]).allowed


def test_all_budgets_of_an_intent_count_it_or_none_does(counter: RedisBudgets) -> None:
    who = fresh()
    daily, hourly = budget(100, "1d"), budget(10, "1h")
    assert counter.reserve(who, "shop", "i1", TAG, [Spend(daily, 8), Spend(hourly, 8)]).allowed
    over = counter.reserve(who, "shop", "i2", TAG, [Spend(daily, 8), Spend(hourly, 8)])
    assert not over.allowed and [e.budget for e in over.over] == [hourly]
    # the daily budget did not count i2: 92 more still fit there
    assert counter.reserve(who, "shop", "i3", TAG, [Spend(daily, 92)]).allowed


def test_the_same_intent_is_counted_once_and_given_back_once(counter: RedisBudgets) -> None:
    who, b = fresh(), budget(10)
    assert counter.reserve(who, "shop", "i1", TAG, [Spend(b, 6)]).allowed
    assert counter.reserve(who, "shop", "i1", TAG, [Spend(b, 6)]).allowed  # decided again: not twice
    assert counter.reserve(who, "shop", "i2", TAG, [Spend(b, 4)]).allowed
    assert counter.refund(who, "shop", "i1", TAG, [b]) is True
    assert counter.refund(who, "shop", "i1", TAG, [b]) is False  # a redelivered failure gives nothing more
    assert counter.reserve(who, "shop", "i3", TAG, [Spend(b, 6)]).allowed
    assert not counter.reserve(who, "shop", "i4", TAG, [Spend(b, 1)]).allowed
    assert counter.refund(who, "shop", "never", TAG, [b]) is False


def test_a_forced_intent_counts_past_the_budget(counter: RedisBudgets) -> None:
    who, b = fresh(), budget(10)
    assert counter.reserve(who, "shop", "i1", TAG, [Spend(b, 25)], force=True).allowed
    assert not counter.reserve(who, "shop", "i2", TAG, [Spend(b, 1)]).allowed


def test_two_routers_hammering_one_budget_never_overspend() -> None:
    who, b = fresh(), budget(1000)
    counters = [RedisBudgets(redis.Redis.from_url(REDIS_URL)) for _ in range(2)]
    counted: list[int] = []
    lock = threading.Lock()

    def hammer(n: int) -> None:
        for i in range(25):
            amount = 1 + (n * 7 + i) % 13
            if counters[n % 2].reserve(who, "shop", f"{n}-{i}", TAG, [Spend(b, amount)]).allowed:
                with lock:
                    counted.append(amount)

    threads = [threading.Thread(target=hammer, args=(n,)) for n in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert 1000 - 13 < sum(counted) <= 1000


def test_an_intent_known_only_by_its_id_is_given_back_once(counter: RedisBudgets) -> None:
    who, daily, hourly = fresh(), budget(10, "1d"), budget(10, "1h")
    client = redis.Redis.from_url(REDIS_URL)
    assert counter.reserve(who, "shop", "i1", TAG, [Spend(daily, 10), Spend(hourly, 10)]).allowed
    assert release_intent(client, who, "i1", TAG) is True  # what a denied approval does
    assert release_intent(client, who, "i1", TAG) is False
    assert counter.refund(who, "shop", "i1", TAG, [daily, hourly]) is False  # nor can the pool give it back again
    assert counter.reserve(who, "shop", "i2", TAG, [Spend(daily, 10), Spend(hourly, 10)]).allowed


def test_a_float_total_does_not_drift_past_the_budget(counter: RedisBudgets) -> None:
    who, b = fresh(), budget(1)
    assert all(counter.reserve(who, "shop", f"i{i}", TAG, [Spend(b, 0.1)]).allowed for i in range(10))
    assert not counter.reserve(who, "shop", "i10", TAG, [Spend(b, 0.1)]).allowed


def test_a_reused_id_with_another_payload_is_not_counted_and_cannot_give_back_the_first(
    counter: RedisBudgets,
) -> None:
    who, b = fresh(), budget(500)
    client = redis.Redis.from_url(REDIS_URL)
    first, other = "a" * 64, "b" * 64
    assert counter.reserve(who, "shop", "x", first, [Spend(b, 400)]).allowed
    reused = counter.reserve(who, "shop", "x", other, [Spend(b, 50)])
    assert not reused.allowed and reused.reused and reused.over == ()
    # what the reused id's denial, expiry or failure would do: nothing of x's 400 comes back
    assert release_intent(client, who, "x", other) is False
    assert counter.refund(who, "shop", "x", other, [b]) is False
    over = counter.reserve(who, "shop", "y", TAG, [Spend(b, 101)])
    assert not over.allowed and [e.used for e in over.over] == [400]
    assert counter.reserve(who, "shop", "x", first, [Spend(b, 400)]).allowed  # decided again: counted once
    assert release_intent(client, who, "x", first) is True
    assert counter.reserve(who, "shop", "y", TAG, [Spend(b, 101)]).allowed


def test_a_huge_amount_given_back_leaves_what_was_counted(counter: RedisBudgets) -> None:
    who, b = fresh(), budget(500)
    assert counter.reserve(who, "shop", "i1", TAG, [Spend(b, 400)]).allowed
    assert counter.reserve(who, "shop", "big", TAG, [Spend(b, 1e300)], force=True).allowed
    assert counter.refund(who, "shop", "big", TAG, [b]) is True
    # a float running total would be 400 + 1e300 - 1e300 = 0 here
    over = counter.reserve(who, "shop", "i2", TAG, [Spend(b, 101)])
    assert not over.allowed and [e.used for e in over.over] == [400]


def test_many_decimal_amounts_given_back_leave_exactly_what_is_kept(counter: RedisBudgets) -> None:
    who, b = fresh(), budget(5000)
    rng = random.Random(0)  # a running float total was left at 0.07000000000000028 by these
    amounts = [round(rng.uniform(0.01, 99.99), 2) for _ in range(50)]
    assert counter.reserve(who, "shop", "kept", TAG, [Spend(b, 0.07)]).allowed
    for i, amount in enumerate(amounts):
        assert counter.reserve(who, "shop", f"i{i}", TAG, [Spend(b, amount)]).allowed
    for i in range(len(amounts)):
        assert counter.refund(who, "shop", f"i{i}", TAG, [b]) is True
    over = counter.reserve(who, "shop", "next", TAG, [Spend(b, 4999.95)])
    assert not over.allowed and [e.used for e in over.over] == [0.07]
    assert counter.reserve(who, "shop", "next", TAG, [Spend(b, 4999.93)]).allowed


def test_every_exceeded_budget_is_reported(counter: RedisBudgets) -> None:
    # the contract's example: 500 per day (reject) and 100 per 10 minutes (approval)
    who = fresh()
    daily, ten = budget(500, "1d"), BudgetSpec(param="amount", max=100, per="10m", on_exceed="approval")
    assert counter.reserve(who, "shop", "i1", TAG, [Spend(daily, 450), Spend(ten, 90)]).allowed
    over = counter.reserve(who, "shop", "i2", TAG, [Spend(daily, 60), Spend(ten, 60)])
    assert not over.allowed and [(e.budget, e.used) for e in over.over] == [(daily, 450), (ten, 90)]
    assert [e.budget for e in counter.reserve(who, "shop", "i3", TAG, [Spend(daily, 40), Spend(ten, 40)]).over] == [ten]


# -- a real fleet: two routers, one pool ---------------------------------------------------

CATALOG = """\
connector:
  name: shop
  endpoint: {url}
  retry: {{max_attempts: 1}}
  actions:
    - action: pay
      path: POST /items
      permission: write
      input:
        title: {{ type: string, required: true }}
        amount: {{ type: integer, required: true }}
    - action: pay_slowly
      path: POST /slow/items
      permission: write
      timeout: 500ms
      input:
        title: {{ type: string, required: true }}
        amount: {{ type: integer, required: true }}
---
agent_app:
  name: spender
  connector_bindings:
    - connector: shop
      allowed_actions: [pay]
      budget: {{param: amount, max: 500, per: 1d}}
---
agent_app:
  name: refunder
  connector_bindings:
    - connector: shop
      allowed_actions: [pay]
      budget: {{param: amount, max: 100, per: 1d}}
---
agent_app:
  name: retrier
  connector_bindings:
    - connector: shop
      allowed_actions: [pay]
      budget: {{param: amount, max: 500, per: 1h}}
---
agent_app:
  name: roller
  connector_bindings:
    - connector: shop
      allowed_actions: [pay]
      budget: {{param: amount, max: 10, per: 2s}}
---
agent_app:
  name: hostile
  connector_bindings:
    - connector: shop
      allowed_actions: [pay, pay_slowly]
      budget: {{param: amount, max: 50, per: 1d}}
---
agent_app:
  name: asker
  connector_bindings:
    - connector: shop
      allowed_actions: [pay]
      budget: {{param: amount, max: 100, per: 1d, on_exceed: approval}}
      approval: {{when: 'title == "manual"', approvers: [finance]}}
---
agent_app:
  name: reuser
  connector_bindings:
    - connector: shop
      allowed_actions: [pay, pay_slowly]
      budget: {{param: amount, max: 500, per: 1d}}
      approval: {{when: 'title == "manual"', approvers: [finance]}}
---
approvers:
  finance: [ann]
---
agent_app:
  name: crowd
  connector_bindings:
    - connector: shop
      allowed_actions: [pay]
      budget: [{{param: amount, max: 500, per: 1h}}, {{param: amount, max: 100000, per: 1d}}]
"""


@pytest.fixture(scope="module")
def system() -> Iterator[CountingSystem]:
    downstream = CountingSystem().start()
    yield downstream
    downstream.stop()


@pytest.fixture(scope="module")
def fleet(system: CountingSystem) -> Iterator[Fleet]:
    # a small read-ahead, so that the two routers share a burst
    with Fleet(CATALOG.format(url=system.url), pools=["shop"], env={"REACH_ROUTER_PREFETCH": "8"}) as running:
        running.start_process("router2", ["router"])
        running.wait_consuming("reach.intents", consumers=2)
        yield running


def paid(system: CountingSystem, who: str) -> int:
    """What the downstream executed for ``who``: the amounts are in the titles."""
    return sum(int(title.rsplit("-", 1)[1]) * n for title, n in system.executions().items() if title.startswith(who))


def pay(client: object, who: str, amount: int) -> Receipt:
    return client.call("shop.pay", {"title": f"{who}-{uuid.uuid4().hex[:6]}-{amount}", "amount": amount}, timeout=30)  # type: ignore[attr-defined]


def test_under_budget_passes_and_over_budget_is_budget_exceeded(fleet: Fleet, system: CountingSystem) -> None:
    with agent("spender") as client:
        assert pay(client, "spender", 200).status == "succeeded"
        assert pay(client, "spender", 300).status == "succeeded"
        over = pay(client, "spender", 1)
    assert over.status == "rejected" and over.error is not None
    assert over.error.code is ErrorCode.BUDGET_EXCEEDED and over.error.retryable
    assert over.error.retry_after_ms is not None and 86_000_000 < over.error.retry_after_ms <= 86_400_000
    assert paid(system, "spender") == 500


def test_a_failed_intent_gives_its_amount_back(fleet: Fleet, system: CountingSystem) -> None:
    with agent("refunder") as client:
        system.state.fail_status, system.state.fail_count = 409, 1
        failed = pay(client, "refunder", 80)
        assert failed.status == "failed" and failed.error is not None
        assert failed.error.code is ErrorCode.DOWNSTREAM_CONFLICT
        # its 80 came back: another 80 fits, and then nothing over 20
        assert pay(client, "refunder", 80).status == "succeeded"
        over = pay(client, "refunder", 21)
        assert over.error is not None and over.error.code is ErrorCode.BUDGET_EXCEEDED
        assert pay(client, "refunder", 20).status == "succeeded"
    assert paid(system, "refunder") == 100


def test_an_agent_that_retries_as_soon_as_it_reads_the_failure_finds_the_amount_back(
    fleet: Fleet, system: CountingSystem
) -> None:
    # the amount goes back before the failed receipt is published, so there is no moment in which
    # the failure is visible and the amount still counted (the budget is 500 an hour)
    with agent("retrier") as client:
        for _ in range(20):
            # both fail downstream (409), so nothing is ever paid and each must find the 400 back
            system.state.fail_status, system.state.fail_count = 409, 2
            for _attempt in range(2):
                receipt = pay(client, "retrier", 400)
                assert receipt.error is not None and receipt.error.code is ErrorCode.DOWNSTREAM_CONFLICT, receipt
    assert paid(system, "retrier") == 0


def test_the_window_rolls(fleet: Fleet, system: CountingSystem) -> None:
    with agent("roller") as client:
        assert pay(client, "roller", 10).status == "succeeded"
        over = pay(client, "roller", 3)
        assert over.error is not None and over.error.code is ErrorCode.BUDGET_EXCEEDED
        assert over.error.retry_after_ms is not None and 0 < over.error.retry_after_ms <= 2_000
        time.sleep(over.error.retry_after_ms / 1000 + 0.1)
        assert pay(client, "roller", 3).status == "succeeded"
    assert paid(system, "roller") == 13


def test_hostile_amounts_are_refused_and_cannot_refill_the_budget(fleet: Fleet, system: CountingSystem) -> None:
    with agent("hostile") as client:
        assert pay(client, "hostile", 40).status == "succeeded"
        for amount in (-40, -(10**30), 10**30, 51):
            refused = pay(client, "hostile", amount)
            assert refused.error is not None and refused.error.code is ErrorCode.VALIDATION_FAILED, amount
            assert refused.error.details[0]["field"] == "amount"
        for raw in ("NaN", "-Infinity", "1e999"):
            client.publish_raw(
                f'{{"intent_id":"h-{raw}","action":"shop.pay","params":{{"title":"hostile-x-0","amount":{raw}}}}}'.encode(),
                message_id=f"h-{raw}",  # the body does not parse: the receipt takes this id
            )
            assert client.wait(f"h-{raw}", timeout=30).error.code is ErrorCode.INVALID_INTENT  # type: ignore[union-attr]
        # nothing refused was counted, and no negative amount made room: 10 fit, 1 more does not
        over = pay(client, "hostile", 11)
        assert over.error is not None and over.error.code is ErrorCode.BUDGET_EXCEEDED
        # an outcome that may have happened stays counted (the call outlived its 500 ms timeout)
        unsure = client.call("shop.pay_slowly", {"title": "slow-hostile-10", "amount": 10}, timeout=30)
        assert unsure.status == "unknown"
        over = pay(client, "hostile", 1)
        assert over.error is not None and over.error.code is ErrorCode.BUDGET_EXCEEDED
    assert paid(system, "hostile") == 40  # (the slow call's title is counted apart: it lands later)


def parked(fleet: Fleet, intent_id: str) -> str:
    """The approval id of a parked intent, once it is parked."""
    client = redis.Redis.from_url(fleet.redis_url)
    found = wait_for(
        lambda: [p for p in list_pending(client) if p.intent_id == intent_id], 30, f"{intent_id} was never parked"
    )
    return str(found[0].approval_id)


def test_over_budget_with_on_exceed_approval_asks_a_person(fleet: Fleet, system: CountingSystem) -> None:
    store = redis.Redis.from_url(fleet.redis_url)
    with agent("asker") as client:
        assert pay(client, "asker", 80).status == "succeeded"  # within budget: no person asked
        # over budget: parked instead of BUDGET_EXCEEDED; denied, its 50 is given back
        denied = client.publish("shop.pay", {"title": "asker-d-50", "amount": 50})
        assert deny(store, fleet.broker_url, parked(fleet, denied), "ann", "too much").ok
        receipt = client.wait(denied, timeout=30)
        assert receipt.error is not None and receipt.error.code is ErrorCode.APPROVAL_DENIED
        assert pay(client, "asker", 20).status == "succeeded"  # 80 + 20: the denied 50 is not counted
        # over budget again; approved, it runs (a person may allow more than the budget)
        approved = client.publish("shop.pay", {"title": "asker-a-30", "amount": 30})
        assert approve(store, fleet.broker_url, parked(fleet, approved), "ann").ok
        assert client.wait(approved, timeout=30).status == "succeeded"
    assert paid(system, "asker") == 130


def dispatched_by(fleet: Fleet, router: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{fleet.metrics_port(router)}/metrics", timeout=5).read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith('reach_intents_dispatched_total{connector="shop"}')
    )


def test_two_hundred_concurrent_intents_through_two_routers_never_overspend(
    fleet: Fleet, system: CountingSystem
) -> None:
    before = {name: dispatched_by(fleet, name) for name in ("router", "router2")}
    amounts = [1 + (i * 7) % 10 for i in range(200)]  # 1..10, 1100 in all against 500
    with agent("crowd") as client:
        ids = [
            client.publish("shop.pay", {"title": f"crowd-{i}-{amount}", "amount": amount})
            for i, amount in enumerate(amounts)
        ]
        receipts = [client.wait(intent_id, timeout=60) for intent_id in ids]
    succeeded = [a for a, r in zip(amounts, receipts) if r.status == "succeeded"]
    refused = [r for r in receipts if r.status != "succeeded"]
    assert all(r.error is not None and r.error.code is ErrorCode.BUDGET_EXCEEDED for r in refused)
    wait_for(lambda: paid(system, "crowd") == sum(succeeded), 10, "the downstream executed what succeeded")
    # never past the budget; and filled: a refused amount (at most 10) did not fit
    assert 490 < paid(system, "crowd") <= 500
    # both routers took part
    assert all(dispatched_by(fleet, name) > before[name] for name in ("router", "router2"))


def test_a_reused_intent_id_cannot_park_and_expire_the_first_intents_amount_away(
    fleet: Fleet, system: CountingSystem
) -> None:
    store = redis.Redis.from_url(fleet.redis_url)
    with agent("reuser") as client:
        # the first intent is still running (its outcome will be unknown: it stays counted)
        first = client.publish("shop.pay_slowly", {"title": "slow-reuser-400", "amount": 400})
        # (counted and dispatched before the reuse is published: two routers could otherwise take
        # the reuse first, and then the first intent is the duplicate)
        wait_for(lambda: system.requests(title="slow-reuser-400"), 15, "the first intent never reached the system")
        # the same id, an approval-gated payload with a near deadline: once it parked ("counted
        # before") and its expiry gave back the first intent's 400
        deadline = time.time() + 1.5
        client.publish(
            "shop.pay",
            {"title": "manual", "amount": 50},
            intent_id=first,
            deadline=datetime.fromtimestamp(deadline, UTC),
        )
        wait_for(
            lambda: time.time() > deadline + 2.5 and not [p for p in list_pending(store) if p.intent_id == first],
            15,
            "the reused id was settled",
        )
        over = pay(client, "reuser", 101)
        assert over.error is not None and over.error.code is ErrorCode.BUDGET_EXCEEDED
        assert pay(client, "reuser", 100).status == "succeeded"
    assert paid(system, "reuser") == 100
