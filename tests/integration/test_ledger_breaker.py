"""The idempotency ledger and the shared breaker against the real Redis: atomic across workers."""

from __future__ import annotations

import threading
import time
import uuid

import redis

from connectors.spec import BreakerSpec
from tests.fleet import REDIS_URL
from tests.integration.faultproxy import redis_proxy
from workers.state import keys
from workers.state.breaker import CLOSED, HALF_OPEN, OPEN, SharedBreaker, breaker_state
from workers.state.ledger import Heartbeat, Ledger, params_hash


def client() -> redis.Redis:
    return redis.Redis.from_url(REDIS_URL)


def worker(ttl: float = 3.0) -> tuple[Ledger, Heartbeat]:
    beat = Heartbeat(client(), ttl_seconds=ttl).start()
    return Ledger(client(), beat, ttl_seconds=3600), beat


def fresh_key() -> str:
    return keys.idempotency("agent", "conn", "create", uuid.uuid4().hex)


def test_first_claim_wins_and_the_others_see_it_in_progress_reused_or_completed() -> None:
    (a, beat_a), (b, beat_b) = worker(), worker()
    key, h = fresh_key(), params_hash({"title": "x"})
    assert a.claim(key, h, "i-1", "a").state == "claimed"
    assert b.claim(key, h, "i-2", "a").state == "in_progress"
    assert b.claim(key, params_hash({"title": "other"}), "i-3", "a").state == "reused"
    a.complete(key, '{"receipt": 1}')
    done = b.claim(key, h, "i-4", "a")
    assert done.state == "completed" and done.receipt_json == '{"receipt": 1}'
    beat_a.stop()
    beat_b.stop()


def test_twenty_concurrent_claims_from_different_workers_execute_once() -> None:
    workers = [worker() for _ in range(4)]
    key, h = fresh_key(), params_hash({"n": 1})
    states: list[str] = []
    lock = threading.Lock()
    barrier = threading.Barrier(20)

    def claim(i: int) -> None:
        ledger = workers[i % 4][0]
        barrier.wait()
        state = ledger.claim(key, h, f"i-{i}", "a").state
        with lock:
            states.append(state)

    threads = [threading.Thread(target=claim, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert states.count("claimed") == 1 and states.count("in_progress") == 19
    for _, beat in workers:
        beat.stop()


def test_a_record_held_by_a_dead_worker_is_orphaned_and_can_be_taken_over_once() -> None:
    (dead, dead_beat), (alive, alive_beat) = worker(ttl=0.3), worker()
    key, h = fresh_key(), params_hash({})
    assert dead.claim(key, h, "i-1", "a").state == "claimed"
    dead.mark_sending(key)
    dead_beat._stop.set()  # the process "dies": its heartbeat stops being renewed
    time.sleep(1.0)  # over three times the heartbeat's ttl: a renewal already under way has expired too
    claim = alive.claim(key, h, "i-1", "a")
    assert claim.state == "orphaned" and claim.holder_intent == "i-1"
    assert alive.was_sending(key)
    assert alive.take_over(key, "i-1", "a") is True
    assert alive.take_over(key, "i-1", "a") is False or alive.claim(key, h, "i-9", "a").state == "in_progress"
    alive_beat.stop()


def test_released_records_let_a_resend_execute() -> None:
    (ledger, beat) = worker()
    key, h = fresh_key(), params_hash({})
    assert ledger.claim(key, h, "i-1", "a").state == "claimed"
    ledger.release(key)
    assert ledger.claim(key, h, "i-2", "a").state == "claimed"
    beat.stop()


def test_completed_records_expire() -> None:
    beat = Heartbeat(client()).start()
    ledger = Ledger(client(), beat, ttl_seconds=1)
    key, h = fresh_key(), params_hash({})
    ledger.claim(key, h, "i-1", "a")
    ledger.complete(key, "{}")
    assert 0 < client().pttl(key) <= 1000
    beat.stop()


def breaker(name: str, fail_max: int = 3, reset: str = "1s", trials: int = 1) -> SharedBreaker:
    return SharedBreaker(client(), name, BreakerSpec(fail_max=fail_max, reset_timeout=reset), trials=trials)


def record(b: SharedBreaker, kind: str) -> str:
    """Record an outcome as the pool does, on a pipeline (returns the breaker's new state)."""
    pipe = client().pipeline(transaction=False)
    b.record_into(pipe, kind)
    return pipe.execute()[-1].decode()


def peek(b: SharedBreaker) -> tuple[str, int, str]:
    """(state, ms until it may half-open, health) as the router's guards read them, on a pipeline."""
    pipe = client().pipeline(transaction=False)
    b.peek_into(pipe)
    state, left, health = pipe.execute()[-1]
    return state.decode(), int(left), health.decode()


def test_breaker_opens_after_fail_max_and_lets_one_trial_through_when_half_open() -> None:
    name = f"b_{uuid.uuid4().hex[:8]}"
    replicas = [breaker(name) for _ in range(3)]  # three processes' views of one breaker
    for b in replicas:
        assert b.acquire().allowed
        record(b, "failure")
    permit = replicas[0].acquire()
    assert not permit.allowed and permit.state == OPEN and 0 < permit.retry_after_ms <= 1000
    state, left, health = peek(replicas[1])
    assert state == OPEN and left > 0 and health == "unknown"
    time.sleep(1.05)
    granted: list[bool] = []
    lock = threading.Lock()
    barrier = threading.Barrier(12)

    def try_acquire(i: int) -> None:
        barrier.wait()
        permit = replicas[i % 3].acquire()
        with lock:
            granted.append(permit.allowed)

    threads = [threading.Thread(target=try_acquire, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert granted.count(True) == 1  # one trial, however many processes asked
    assert breaker_state(client(), name) == HALF_OPEN
    assert record(replicas[2], "success") == CLOSED
    assert all(b.acquire().allowed for b in replicas)


def test_a_failed_trial_opens_the_breaker_again() -> None:
    name = f"b_{uuid.uuid4().hex[:8]}"
    b = breaker(name, fail_max=1)
    record(b, "failure")
    time.sleep(1.05)
    assert b.acquire().trial
    assert record(b, "failure") == OPEN
    assert not b.acquire().allowed


def test_successes_reset_the_failure_count() -> None:
    name = f"b_{uuid.uuid4().hex[:8]}"
    b = breaker(name, fail_max=3)
    record(b, "failure")
    record(b, "failure")
    record(b, "success")
    record(b, "failure")
    record(b, "failure")
    assert b.acquire().allowed and breaker_state(client(), name) == CLOSED


def test_peek_reports_health_marks() -> None:
    name = f"b_{uuid.uuid4().hex[:8]}"
    client().set(keys.health(name), "down", px=5000)
    assert peek(breaker(name))[2] == "down"


def test_begin_takes_the_first_permit_only_while_the_breaker_is_closed() -> None:
    ledger, beat = worker()
    b = breaker(f"b_{uuid.uuid4().hex[:8]}", fail_max=1, reset="30s")
    h = params_hash({"n": 1})

    def begin(key: str, intent: str, max_deliveries: int = 5) -> object:
        return ledger.begin(
            keys.sent("t", intent), keys.deliveries("t", intent), key, h, intent, "a", max_deliveries, breaker_key=b.key
        )

    closed_key = fresh_key()
    first = begin(closed_key, "i-closed")
    assert first.state == "claimed" and first.permit  # type: ignore[attr-defined]
    assert ledger.was_sending(closed_key)  # the permit marks the record, as acquire does
    again = begin(closed_key, "i-other")
    assert again.state == "in_progress" and not again.permit  # type: ignore[attr-defined]

    record(b, "failure")  # fail_max=1: open
    open_key = fresh_key()
    blocked = begin(open_key, "i-open")
    assert blocked.state == "claimed" and not blocked.permit  # type: ignore[attr-defined]
    assert not ledger.was_sending(open_key)  # left to the acquire script, which refuses
    assert not b.acquire(mark_sending=open_key).allowed and not ledger.was_sending(open_key)

    poisoned_key = fresh_key()
    for _ in range(2):
        begin(poisoned_key, "i-poison", max_deliveries=1)
    assert begin(poisoned_key, "i-poison", max_deliveries=1).state == "poison"  # type: ignore[attr-defined]
    client().set(keys.sent("t", "i-sent"), "1")
    sent = begin(fresh_key(), "i-sent")
    assert sent.state == "sent" and not sent.permit  # type: ignore[attr-defined]
    beat.stop()


def test_begin_says_clean_only_while_the_breaker_is_closed_with_no_failures_counted() -> None:
    """A clean begin lets the pool skip recording the first attempt's success (it would change
    nothing); once a failure is counted, the next success must be recorded to reset it."""
    ledger, beat = worker()
    b = breaker(f"b_{uuid.uuid4().hex[:8]}", fail_max=3, reset="30s")
    h = params_hash({"n": 1})

    def begin(intent: str) -> object:
        return ledger.begin(
            keys.sent("t", intent), keys.deliveries("t", intent), fresh_key(), h, intent, "a", 5, breaker_key=b.key
        )

    fresh = begin("i-fresh")
    assert fresh.permit and fresh.clean  # type: ignore[attr-defined]
    record(b, "failure")
    counted = begin("i-counted")
    assert counted.permit and not counted.clean  # type: ignore[attr-defined]  # closed, one failure counted
    record(b, "success")
    assert begin("i-reset").clean  # type: ignore[attr-defined]
    beat.stop()


def attempts(*names: str) -> list[str]:
    """Attempt ids are unique in the fleet (a given-up attempt stays marked for an hour)."""
    return [f"{name}-{uuid.uuid4().hex[:8]}" for name in names]


def test_an_abandoned_attempt_leaves_its_record_orphaned_for_the_next_delivery() -> None:
    # the same live worker process: only the attempt that holds the record may give it up
    ledger, beat = worker()
    first, second, stranger, third = attempts("first", "second", "stranger", "third")
    key, h = fresh_key(), params_hash({"n": 1})
    assert ledger.claim(key, h, "i-1", first).state == "claimed"
    ledger.mark_sending(key)
    assert ledger.claim(key, h, "i-1", second).state == "in_progress"  # its heartbeat lives
    ledger.abandon(key, stranger)  # not the holder: nothing changes
    assert ledger.claim(key, h, "i-1", second).state == "in_progress"
    ledger.abandon(key, first)
    again = ledger.claim(key, h, "i-1", second)
    assert again.state == "orphaned" and again.holder_intent == "i-1" and ledger.was_sending(key)
    assert ledger.take_over(key, "i-1", second) is True
    assert ledger.claim(key, h, "i-1", third).state == "in_progress"  # held again, by the live attempt
    ledger.complete(key, "{}")
    ledger.abandon(key, second)  # a completed record is never given up
    assert ledger.claim(key, h, "i-1", third).state == "completed"
    beat.stop()


def test_a_record_that_could_not_be_given_up_while_redis_was_away_is_given_up_when_it_is_back() -> None:
    proxy, through_url = redis_proxy(REDIS_URL)
    try:
        through = redis.Redis.from_url(through_url, socket_timeout=2, socket_connect_timeout=2)
        beat = Heartbeat(client()).start()
        ledger = Ledger(through, beat, ttl_seconds=3600)
        key, h = fresh_key(), params_hash({"n": 2})
        first, second = attempts("first", "second")
        assert ledger.claim(key, h, "i-1", first).state == "claimed"
        proxy.set("refuse")  # Redis is away just when the attempt fails
        ledger.abandon(key, first)  # does not raise: retried on a thread of its own
        assert Ledger(client(), beat, 3600).claim(key, h, "i-1", second).state == "in_progress"
        proxy.set("pass")
        deadline = time.monotonic() + 10
        while Ledger(client(), beat, 3600).claim(key, h, "i-1", second).state != "orphaned":
            assert time.monotonic() < deadline, "the record was never given up once Redis was back"
            time.sleep(0.1)
        beat.stop()
    finally:
        proxy.stop()


def test_a_record_written_by_an_older_worker_without_an_attempt_is_still_judged_by_its_owner() -> None:
    # a rolling upgrade: records claimed by workers that never wrote an attempt id
    ledger, beat = worker()
    key, h = fresh_key(), params_hash({"n": 3})
    client().hset(key, mapping={"state": "in_progress", "hash": h, "owner": beat.worker_id, "intent": "i-1"})
    (a,) = attempts("a")
    assert ledger.claim(key, h, "i-1", a).state == "in_progress"  # its worker lives
    ledger.abandon(key, a)  # not this attempt's record: left alone
    (b,) = attempts("b")
    assert ledger.claim(key, h, "i-1", b).state == "in_progress"
    beat.stop()


def test_a_claim_of_an_attempt_given_up_before_its_claim_ran_is_never_made() -> None:
    # the attempt's begin reached Redis only after its caller had stopped waiting and given up
    ledger, beat = worker()
    key, h = fresh_key(), params_hash({"n": 4})
    late, following = attempts("late", "next")
    ledger.abandon(key, late)  # nothing to give up yet: only the attempt is marked
    assert ledger.claim(key, h, "i-1", late).state == "abandoned"
    assert not client().exists(key)
    assert ledger.claim(key, h, "i-1", following).state == "claimed"  # the next delivery's attempt
    beat.stop()
