"""The pool in-process: ``PoolRuntime`` driven directly with a scripted adapter, an in-memory
Redis, ledger and publisher. What is asserted is what an agent and the system observe: receipts
published, dead letters, and how often the system was called."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
import redis

from connectors.adapters.base import CallContext, Outcome
from connectors.adapters.http import HttpAdapter
from connectors.catalog import Catalog
from connectors.spec import ActionSpec
from producers.wire import ErrorCode, Receipt
from tests.unit.routing_catalog import routing_catalog
from workers.observability.audit import Audit
from workers.pool.consumer import job_handler
from workers.pool.runtime import PoolOptions, PoolOutput, PoolRuntime, PoolState
from workers.state import keys
from workers.state.batcher import Write
from workers.state.ledger import Begin, Claim, params_hash
from workers.transport.app import EXECUTE_TASK
from workers.transport.delivery import Delivery
from workers.transport.job import Job
from workers.transport.receipts import ReceiptSink

WORKER = "worker-1"


# --------------------------------------------------------------------------- fakes


class FakeRedis:
    """The few commands the pool, its sink and the fakes below use; hashes are dicts."""

    def __init__(self) -> None:
        self.data: dict[str, Any] = {}
        self.fail_writes = False

    def get(self, key: str) -> Any:
        return self.data.get(key)

    def set(self, key: str, value: Any, ex: int | None = None, px: int | None = None) -> bool:
        if self.fail_writes:
            raise redis.ConnectionError("Redis went away")
        self.data[key] = value
        return True

    def exists(self, *names: str) -> int:
        return sum(name in self.data for name in names)

    def delete(self, *names: str) -> int:
        return sum(self.data.pop(name, None) is not None for name in names)

    def incr(self, key: str) -> int:
        self.data[key] = int(self.data.get(key, 0)) + 1
        return int(self.data[key])

    def hset(self, key: str, field: str | None = None, value: Any = None, mapping: dict[str, Any] | None = None) -> int:
        record = self.data.setdefault(key, {})
        record.update(mapping if mapping is not None else {str(field): value})
        return 1

    def hget(self, key: str, field: str) -> Any:
        return self.data.get(key, {}).get(field)

    def rpush(self, key: str, *values: Any) -> int:
        self.data.setdefault(key, []).extend(values)
        return len(self.data[key])

    def expire(self, *_: Any) -> bool:
        return True

    pexpire = expire

    def ltrim(self, *_: Any) -> bool:
        return True

    def pipeline(self, transaction: bool = False) -> FakePipe:
        return FakePipe(self)

    def sadd(self, key: str, *members: Any) -> int:
        found = self.data.setdefault(key, set())
        added = len(set(members) - found)
        found.update(members)
        return added

    def execute_command(self, name: str, *args: Any, **_: Any) -> Any:
        """Only the trace's EVAL (keep a stage once) reaches here: these tests read the lines the
        batcher was given, not Redis, so the script is taken as having written its line."""
        assert name == "EVAL", name
        return 1


class FakePipe:
    def __init__(self, client: FakeRedis) -> None:
        self._client = client
        self._commands: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    def __getattr__(self, name: str) -> Callable[..., FakePipe]:
        def queue(*args: Any, **kwargs: Any) -> FakePipe:
            self._commands.append((name, args, kwargs))
            return self

        return queue

    def execute(self) -> list[Any]:
        commands, self._commands = self._commands, []
        return [getattr(self._client, name)(*args, **kwargs) for name, args, kwargs in commands]


class FakeBatcher:
    def __init__(self, client: FakeRedis) -> None:
        self._client = client
        self.written: list[str] = []  # audit lines

    def call(
        self, commands: Callable[[Any], None], lines: list[str] | None = None, durable: tuple[str, ...] = ()
    ) -> list[Any]:
        pipe = self._client.pipeline()
        commands(pipe)
        self.written.extend(lines or [])
        return pipe.execute()

    def submit(self, commands: Callable[[Any], None] | None, lines: list[str] | None = None) -> None:
        if commands is not None:
            self.call(commands, lines)

    def lines(self, lines: list[str]) -> None:
        self.written.extend(lines)


class FakeLedger:
    """The idempotency ledger's state machine (``workers.state.ledger``) over FakeRedis hashes;
    a record's owner is alive while it is in ``alive``."""

    def __init__(self, client: FakeRedis, alive: set[str] | None = None) -> None:
        self._client = client
        self.alive = alive if alive is not None else {WORKER}
        self.abandoned: list[str] = []

    def begin(
        self,
        sent_key: str,
        deliveries_key: str,
        key: str,
        params_hash: str,
        intent_id: str,
        attempt: str,
        max_deliveries: int,
        breaker_key: str | None = None,
        batcher: Any = None,
    ) -> Begin:
        if self._client.exists(sent_key):
            return Begin("sent", "", "", 0, False)
        n = self._client.incr(deliveries_key)
        if n > max_deliveries:
            return Begin("poison", "", "", n, False)
        claim, sending = self._claim(key, params_hash, intent_id)
        return Begin(claim.state, claim.receipt_json, claim.holder_intent, n, sending)

    def _claim(self, key: str, params_hash: str, intent_id: str) -> tuple[Claim, bool]:
        record = self._client.data.get(key)
        if record is None:
            self._client.hset(
                key, mapping={"state": "in_progress", "hash": params_hash, "owner": WORKER, "intent": intent_id}
            )
            return Claim("claimed"), False
        if record["hash"] != params_hash:
            return Claim("reused", "", record["intent"]), False
        if record["state"] == "completed":
            return Claim("completed", record["receipt"], record["intent"]), False
        if record["owner"] in self.alive:
            return Claim("in_progress", "", record["intent"]), False
        return Claim("orphaned", "", record["intent"]), "sending" in record

    def claim(self, key: str, params_hash: str, intent_id: str, attempt: str) -> Claim:
        return self._claim(key, params_hash, intent_id)[0]

    def take_over(self, key: str, intent_id: str, attempt: str) -> bool:
        self._client.hset(key, mapping={"owner": WORKER, "intent": intent_id})
        return True

    def abandon(self, key: str, attempt: str) -> None:
        self.abandoned.append(key)

    def mark_sending(self, key: str) -> None:
        self._client.hset(key, "sending", "1")

    def was_sending(self, key: str) -> bool:
        return self._client.hget(key, "sending") is not None

    def complete(self, key: str, receipt_json: str) -> None:
        self._client.hset(key, mapping={"state": "completed", "receipt": receipt_json})

    def complete_into(self, pipe: Any, key: str, receipt_json: str) -> None:
        pipe.hset(key, mapping={"state": "completed", "receipt": receipt_json})

    def wait_completed(self, key: str, timeout: float, interval: float = 0.1) -> Claim | None:
        record = self._client.data.get(key)
        if record is None:
            return Claim("claimed")
        return Claim("completed", record["receipt"]) if record["state"] == "completed" else None


class FakePublisher:
    def __init__(self, client: FakeRedis, batcher: FakeBatcher) -> None:
        self._client = client
        self._batcher = batcher
        self.published: list[dict[str, Any]] = []

    def publish(
        self,
        body: bytes,
        *,
        exchange: Any,
        routing_key: str,
        headers: dict[str, Any] | None = None,
        then: Callable[[Any], None] | None = None,
        first: Write | None = None,
        **properties: Any,
    ) -> None:
        if first is not None:
            self.store_first(first)
        self.published.append(
            {
                "exchange": exchange.name,
                "routing_key": routing_key,
                "body": body,
                "headers": headers or {},
                **properties,
            }
        )
        if then is not None:
            pipe = self._client.pipeline()
            then(pipe)
            pipe.execute()

    def store_first(self, first: Write) -> None:
        self._batcher.call(first.commands, first.lines, durable=tuple(first.durable))

    def receipts(self) -> list[Receipt]:
        return [Receipt.model_validate_json(p["body"]) for p in self.published if p["exchange"] == "reach.receipts"]

    def dead_letters(self) -> list[dict[str, Any]]:
        return [p for p in self.published if p["routing_key"] == "reach.dlq"]


class FakeAdapter:
    """Answers each call with the next scripted outcome (the last one repeats)."""

    def __init__(self, *outcomes: Outcome) -> None:
        self.outcomes = list(outcomes) or [Outcome(True, data={"id": 1})]
        self.calls: list[tuple[str, dict[str, Any], CallContext]] = []

    def call(self, action: ActionSpec, params: dict[str, Any], ctx: CallContext) -> Outcome:
        self.calls.append((action.action, params, ctx))
        return self.outcomes.pop(0) if len(self.outcomes) > 1 else self.outcomes[0]

    def close(self) -> None: ...


class Pool:
    """A PoolRuntime for the ``tickets`` connector with every dependency faked."""

    def __init__(self, catalog: Catalog, adapter: Any, alive: set[str] | None = None) -> None:
        self.redis = FakeRedis()
        self.batcher = FakeBatcher(self.redis)
        self.ledger = FakeLedger(self.redis, alive)
        self.publisher = FakePublisher(self.redis, self.batcher)
        self.adapter = adapter
        audit = Audit(None, "pool:tickets", batcher=self.batcher)  # type: ignore[arg-type]
        self.runtime = PoolRuntime(
            catalog.connectors["tickets"],
            catalog,
            adapter,
            state=PoolState(self.redis, self.batcher, self.ledger),  # type: ignore[arg-type]
            output=PoolOutput(ReceiptSink(self.publisher, self.redis, 600), self.publisher, audit),  # type: ignore[arg-type]
            options=PoolOptions(max_deliveries=3, wait_for_holder_seconds=0.0),
            sleep=lambda _: None,
        )

    def receipts(self) -> list[Receipt]:
        return self.publisher.receipts()


@pytest.fixture(scope="module")
def catalog(tmp_path_factory: pytest.TempPathFactory) -> Catalog:
    return routing_catalog(tmp_path_factory.mktemp("catalog"))


def job(**changes: Any) -> Job:
    now = time.time()
    intent_id = changes.pop("intent_id", "i-1")
    fields: dict[str, Any] = {
        "intent_id": intent_id,
        "agent_id": "bot",
        "connector": "tickets",
        "action": "create_ticket",
        "params": {"title": "t", "priority": "medium"},
        "idempotency_key": intent_id,
        "reply_to": "bot",
        "deadline": None,
        "trace_id": "0" * 31 + "1",
        "traceparent": None,
        "format": "native",
        "received_at": now,
        "dispatched_at": now,
    }
    return Job(**{**fields, **changes})


def TaskMessage(argument: Any, redelivered: bool = False) -> Delivery:  # noqa: N802
    return Delivery(
        body=json.dumps([[argument], {}, {}]).encode(),
        headers={"task": EXECUTE_TASK},
        message_id="m-1",
        redelivered=redelivered,
    )


# --------------------------------------------------------------------------- exactly one receipt


def test_a_job_gets_one_receipt_and_one_downstream_call(catalog: Catalog) -> None:
    pool = Pool(catalog, FakeAdapter(Outcome(True, data={"id": 7})))
    pool.runtime.execute(job())
    [receipt] = pool.receipts()
    assert receipt.status == "succeeded" and receipt.data == {"id": 7} and receipt.execution.attempts == 1
    assert receipt.intent_id == "i-1" and receipt.agent_id == "bot" and receipt.action == "create_ticket"
    assert len(pool.adapter.calls) == 1
    assert pool.adapter.calls[0][1] == {"title": "t", "priority": "medium"}
    assert pool.adapter.calls[0][2].idempotency_key == "i-1"


@pytest.mark.parametrize("redelivered", [True, False])
def test_a_redelivered_job_gets_no_second_receipt_and_no_second_call(catalog: Catalog, redelivered: bool) -> None:
    pool = Pool(catalog, FakeAdapter())
    pool.runtime.execute(job())
    pool.runtime.execute(job(), redelivered=redelivered)
    assert len(pool.receipts()) == 1 and len(pool.adapter.calls) == 1


def test_another_intent_with_the_same_idempotency_key_gets_the_stored_outcome_without_a_call(catalog: Catalog) -> None:
    pool = Pool(catalog, FakeAdapter(Outcome(True, data={"id": 7})))
    pool.runtime.execute(job(intent_id="i-1", idempotency_key="k"))
    pool.runtime.execute(job(intent_id="i-2", idempotency_key="k"))
    _, second = pool.receipts()
    assert len(pool.adapter.calls) == 1
    assert second.intent_id == "i-2" and second.data == {"id": 7} and second.execution.deduplicated


def test_the_same_idempotency_key_with_other_params_is_refused(catalog: Catalog) -> None:
    pool = Pool(catalog, FakeAdapter())
    pool.runtime.execute(job(intent_id="i-1", idempotency_key="k"))
    pool.runtime.execute(job(intent_id="i-2", idempotency_key="k", params={"title": "other"}))
    assert pool.receipts()[1].error.code is ErrorCode.IDEMPOTENCY_KEY_REUSED  # type: ignore[union-attr]
    assert len(pool.adapter.calls) == 1


# --------------------------------------------------------------------------- unknown outcomes


def test_a_non_idempotent_write_that_timed_out_is_outcome_unknown_and_never_repeated(catalog: Catalog) -> None:
    requests: list[httpx.Request] = []

    def timeout(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        raise httpx.ReadTimeout("no answer", request=request)

    adapter = HttpAdapter(catalog.connectors["tickets"], transport=httpx.MockTransport(timeout))
    pool = Pool(catalog, adapter)
    pool.runtime.execute(job(intent_id="i-1", idempotency_key="k"))
    [receipt] = pool.receipts()
    assert receipt.status == "unknown" and receipt.error is not None
    assert receipt.error.code is ErrorCode.OUTCOME_UNKNOWN and not receipt.error.retryable
    assert "tickets.query_ticket" in receipt.error.suggestion  # check before resending
    assert len(requests) == 1  # not retried: the write may have taken effect
    # resent with the same key: the same answer, still no second request
    pool.runtime.execute(job(intent_id="i-2", idempotency_key="k"))
    assert pool.receipts()[1].error.code is ErrorCode.OUTCOME_UNKNOWN and len(requests) == 1  # type: ignore[union-attr]


def test_a_write_whose_worker_died_mid_call_is_outcome_unknown_without_a_call(catalog: Catalog) -> None:
    pool = Pool(catalog, FakeAdapter())
    the_job = job()
    # a worker that died while it was sending the request holds the record
    pool.redis.data[keys.idempotency("bot", "tickets", "create_ticket", "i-1")] = {
        "state": "in_progress",
        "owner": "dead-worker",
        "intent": "i-1",
        "sending": "1",
        "hash": params_hash(the_job.params),
    }
    pool.runtime.execute(the_job, redelivered=True)
    [receipt] = pool.receipts()
    assert receipt.error is not None and receipt.error.code is ErrorCode.OUTCOME_UNKNOWN
    assert not pool.adapter.calls


def test_a_read_whose_worker_died_is_simply_run_again(catalog: Catalog) -> None:
    pool = Pool(catalog, FakeAdapter(Outcome(True, data={"tid": "1"})))
    read = job(action="query_ticket", params={"tid": "1"})
    pool.redis.data[keys.idempotency("bot", "tickets", "query_ticket", "i-1")] = {
        "state": "in_progress",
        "owner": "dead-worker",
        "intent": "i-1",
        "sending": "1",
        "hash": params_hash(read.params),
    }
    pool.runtime.execute(read, redelivered=True)
    [receipt] = pool.receipts()
    assert receipt.status == "succeeded" and len(pool.adapter.calls) == 1


# --------------------------------------------------------------------------- answers without a call


def test_a_deadline_that_passed_in_the_queue_is_deadline_exceeded_without_a_call(catalog: Catalog) -> None:
    pool = Pool(catalog, FakeAdapter())
    pool.runtime.execute(job(deadline=time.time() - 1))
    [receipt] = pool.receipts()
    assert receipt.error is not None and receipt.error.code is ErrorCode.DEADLINE_EXCEEDED
    assert receipt.status == "rejected" and not pool.adapter.calls


def test_a_redelivery_past_its_deadline_of_a_write_a_dead_worker_was_sending_is_outcome_unknown(
    catalog: Catalog,
) -> None:
    """Not DEADLINE_EXCEEDED ("it was never run"): the first delivery may have reached the system."""
    pool = Pool(catalog, FakeAdapter())
    the_job = job(deadline=time.time() - 1)
    pool.redis.data[keys.idempotency("bot", "tickets", "create_ticket", "i-1")] = {
        "state": "in_progress",
        "owner": "dead-worker",
        "intent": "i-1",
        "sending": "1",
        "hash": params_hash(the_job.params),
    }
    pool.runtime.execute(the_job, redelivered=True)
    [receipt] = pool.receipts()
    assert receipt.error is not None and receipt.error.code is ErrorCode.OUTCOME_UNKNOWN
    assert not pool.adapter.calls


def test_a_redelivery_past_its_deadline_that_nobody_was_sending_is_deadline_exceeded(catalog: Catalog) -> None:
    pool = Pool(catalog, FakeAdapter())
    pool.runtime.execute(job(deadline=time.time() - 1), redelivered=True)
    [receipt] = pool.receipts()
    assert receipt.error is not None and receipt.error.code is ErrorCode.DEADLINE_EXCEEDED
    assert not pool.adapter.calls


def test_a_job_for_another_connector_is_answered_internal_without_a_call(catalog: Catalog) -> None:
    pool = Pool(catalog, FakeAdapter())
    pool.runtime.execute(job(connector="crm", action="query_ticket", params={"tid": "1"}))
    [receipt] = pool.receipts()
    assert receipt.error is not None and receipt.error.code is ErrorCode.INTERNAL and not pool.adapter.calls


def test_a_job_delivered_too_often_is_dead_lettered_once_and_answered(catalog: Catalog) -> None:
    pool = Pool(catalog, FakeAdapter())
    the_job = job(params={"title": "t", "priority": "medium", "api_token": "s3cret"})
    pool.redis.data[keys.deliveries("bot", "i-1")] = 3  # three workers died on it already
    pool.runtime.execute(the_job, redelivered=True)
    [letter] = pool.publisher.dead_letters()
    assert "delivered 4 times" in letter["headers"]["x-reach-reason"] and b"s3cret" not in letter["body"]
    [receipt] = pool.receipts()
    assert receipt.error is not None and receipt.error.code is ErrorCode.INTERNAL and not pool.adapter.calls


# --------------------------------------------------------------------------- retries and failures


def test_a_read_is_retried_after_a_transient_failure_and_answered_once(catalog: Catalog) -> None:
    pool = Pool(
        catalog,
        FakeAdapter(
            Outcome(False, code=ErrorCode.DOWNSTREAM_ERROR, sent=True, http_status=503),
            Outcome(True, data={"tid": "1"}),
        ),
    )
    pool.runtime.execute(job(action="query_ticket", params={"tid": "1"}))
    [receipt] = pool.receipts()
    assert receipt.status == "succeeded" and receipt.execution.attempts == 2 and len(pool.adapter.calls) == 2


def test_an_adapter_that_raises_becomes_an_internal_receipt(catalog: Catalog) -> None:
    class Broken(FakeAdapter):
        def call(self, action: ActionSpec, params: dict[str, Any], ctx: CallContext) -> Outcome:
            raise RuntimeError("bug")

    pool = Pool(catalog, Broken())
    pool.runtime.execute(job())
    [receipt] = pool.receipts()
    assert receipt.error is not None and receipt.error.code is ErrorCode.INTERNAL


def test_when_redis_fails_before_the_outcome_is_kept_the_claim_is_given_up_and_the_job_requeued(
    catalog: Catalog,
) -> None:
    pool = Pool(catalog, FakeAdapter())
    real_call = pool.batcher.call

    def failing(commands: Callable[[Any], None], lines: list[str] | None = None, **_: Any) -> list[Any]:
        raise redis.ConnectionError("Redis went away")

    pool.batcher.call = failing  # type: ignore[method-assign]
    message = TaskMessage(job().model_dump())
    assert job_handler(pool.runtime, requeue_pause=0)(message) == "requeue"  # type: ignore[arg-type]
    assert pool.ledger.abandoned and not pool.receipts()
    pool.batcher.call = real_call  # type: ignore[method-assign]


# --------------------------------------------------------------------------- messages that are not jobs


@pytest.mark.parametrize("change,field", [({"v": 2}, "v"), ({"extra": 1}, "extra"), ({"deadline": "soon"}, "deadline")])
def test_a_job_that_does_not_parse_is_dead_lettered_with_the_reason_never_run(
    catalog: Catalog, change: dict[str, Any], field: str
) -> None:
    pool = Pool(catalog, FakeAdapter())
    doc = {**job(params={"title": "t", "api_token": "s3cret"}).model_dump(), **change}
    message = TaskMessage(doc)
    handle = job_handler(pool.runtime, requeue_pause=0)
    assert handle(message) == "ack"  # type: ignore[arg-type]
    [letter] = pool.publisher.dead_letters()
    assert "not a valid job" in letter["headers"]["x-reach-reason"] and field in letter["headers"]["x-reach-reason"]
    assert b"s3cret" not in letter["body"]  # kept like a job: params redacted
    assert not pool.adapter.calls and not pool.receipts()


def test_a_message_that_is_not_a_job_object_is_dead_lettered_as_it_came(catalog: Catalog) -> None:
    pool = Pool(catalog, FakeAdapter())
    message = TaskMessage("just a string")
    assert job_handler(pool.runtime, requeue_pause=0)(message) == "ack"  # type: ignore[arg-type]
    [letter] = pool.publisher.dead_letters()
    assert letter["body"] == message.body and "x-reach-connector" not in letter["headers"]
    assert not pool.adapter.calls and not pool.receipts()


def test_a_redelivery_of_a_job_whose_receipt_was_decided_sends_that_receipt(catalog: Catalog) -> None:
    pool = Pool(catalog, FakeAdapter(Outcome(True, data={"id": 7})))
    pool.runtime.execute(job())
    # the receipt was stored but (say) the process died before the sent mark was written
    del pool.redis.data[keys.sent("bot", "i-1")]
    pool.runtime.execute(job(), redelivered=True)
    receipts = pool.receipts()
    assert len(receipts) == 2 and receipts[1] == receipts[0] and len(pool.adapter.calls) == 1


# --------------------------------------------------------------------------- history records


def with_history(pool: Pool, catalog: Catalog) -> list[list[tuple[str, tuple[Any, ...]]]]:
    """Give the pool a Redis history store; return the round trips (pipelines) it executes."""
    from workers.pool.history_writes import HistoryWrites
    from workers.state.history import RedisHistory

    trips: list[list[tuple[str, tuple[Any, ...]]]] = []
    real = FakePipe.execute

    def execute(self: FakePipe) -> list[Any]:
        trips.append([(name, args) for name, args, _ in self._commands])
        return real(self)

    pool.runtime.answers.history = HistoryWrites(catalog, RedisHistory(pool.redis, 60), 60)  # type: ignore[arg-type]
    FakePipe.execute = execute  # type: ignore[method-assign]
    return trips


def test_the_history_record_is_written_in_the_round_trip_that_stores_the_receipt(
    catalog: Catalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(FakePipe, "execute", FakePipe.execute)  # restored after the test
    pool = Pool(catalog, FakeAdapter(Outcome(True, data={"id": 7})))
    trips = with_history(pool, catalog)
    pool.runtime.execute(job())
    [receipt] = pool.receipts()
    record_key = keys.history_record("bot", "i-1")
    together = [
        trip
        for trip in trips
        if any(name == "set" and args[0] == keys.receipt("bot", "i-1") for name, args in trip)
        and any(name == "execute_command" and record_key in args for name, args in trip)
    ]
    assert receipt.success and len(together) == 1


def test_a_record_that_cannot_be_built_never_stops_the_receipt(
    catalog: Catalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    import connectors.history

    monkeypatch.setattr(FakePipe, "execute", FakePipe.execute)
    pool = Pool(catalog, FakeAdapter(Outcome(True, data={"id": 7})))
    trips = with_history(pool, catalog)

    def broken(**_: Any) -> Any:
        raise RuntimeError("a bug in the projection")

    monkeypatch.setattr(connectors.history, "record", broken)
    pool.runtime.execute(job())
    [receipt] = pool.receipts()
    assert receipt.success
    assert not any(
        name == "execute_command" and keys.history_record("bot", "i-1") in args for t in trips for name, args in t
    )
