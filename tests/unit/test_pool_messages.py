"""What the pool does with each message on its queue, before and after running the job: the
job is read as data, infrastructure failures put it back instead of acking it unanswered, and a
message that is not a job is dead-lettered, never dropped."""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis

from workers.pool.consumer import decode_job, job_handler
from workers.transport.app import EXECUTE_TASK
from workers.transport.delivery import Delivery
from workers.transport.job import Job, JobDecodeError


def FakeMessage(body: Any, task: str | None = EXECUTE_TASK, redelivered: bool = False) -> Delivery:  # noqa: N802
    return Delivery(
        body=body if isinstance(body, bytes) else json.dumps(body).encode(),
        headers={"task": task} if task is not None else {},
        message_id="m-1",
        redelivered=redelivered,
    )


class FakeRuntime:
    def __init__(self, fail: Exception | None = None) -> None:
        self.fail = fail
        self.executed: list[tuple[Job, bool]] = []
        self.dead: list[str] = []
        self.dead_jobs: list[tuple[dict[str, Any], str]] = []

    def execute(self, job: Job, redelivered: bool = False) -> None:
        if self.fail is not None:
            raise self.fail
        self.executed.append((job, redelivered))

    def dead_letter_raw(self, message: Any, reason: str) -> None:
        self.dead.append(reason)

    def dead_letter_job(self, job: Job | dict[str, Any], reason: str) -> None:
        self.dead_jobs.append((job if isinstance(job, dict) else job.model_dump(), reason))


JOB = {
    "v": 1,
    "intent_id": "i-1",
    "agent_id": "a",
    "connector": "c",
    "action": "x",
    "params": {},
    "idempotency_key": "i-1",
    "reply_to": "a",
    "deadline": None,
    "trace_id": "t" * 32,
    "traceparent": None,
    "format": "native",
    "received_at": 1.0,
    "dispatched_at": 2.0,
}


def test_a_task_message_is_read_as_its_job() -> None:
    job = decode_job(FakeMessage([[JOB], {}, {"callbacks": None}]))  # type: ignore[arg-type]
    assert job == Job.model_validate(JOB)


@pytest.mark.parametrize(
    "body,task,why",
    [
        ([[JOB], {}, {}], "celery.chord_unlock", "not a reach.execute message"),
        ([[JOB], {}, {}], None, "not a reach.execute message"),
        (b"{not json", EXECUTE_TASK, "not a task message of JSON"),
        ([], EXECUTE_TASK, "not a task message of JSON"),
        ([["a string"], {}, {}], EXECUTE_TASK, "not a job object"),
        ([[JOB, JOB], {}, {}], EXECUTE_TASK, "not a job object"),
    ],
)
def test_anything_else_is_refused_with_a_reason(body: Any, task: str | None, why: str) -> None:
    with pytest.raises(JobDecodeError, match=why):
        decode_job(FakeMessage(body, task))  # type: ignore[arg-type]


def test_a_finished_job_is_acked_and_a_redelivery_is_flagged() -> None:
    runtime = FakeRuntime()
    message = FakeMessage([[JOB], {}, {}], redelivered=True)
    settle = job_handler(runtime, requeue_pause=0)(message)  # type: ignore[arg-type]
    assert settle == "ack" and runtime.executed == [(Job.model_validate(JOB), True)]


def test_a_job_that_redis_failed_goes_back_to_the_queue_instead_of_being_acked_unanswered() -> None:
    runtime = FakeRuntime(fail=redis.ConnectionError("Redis is down"))
    message = FakeMessage([[JOB], {}, {}])
    assert job_handler(runtime, requeue_pause=0)(message) == "requeue"  # type: ignore[arg-type]


def test_a_message_that_is_not_a_job_is_dead_lettered_and_acked() -> None:
    runtime = FakeRuntime()
    message = FakeMessage(b"garbage")
    assert job_handler(runtime, requeue_pause=0)(message) == "ack"  # type: ignore[arg-type]
    assert runtime.dead and "not a task message" in runtime.dead[0] and not runtime.executed


@pytest.mark.parametrize("change", [{"v": 2}, {"surprise": 1}, {"params": "x"}, {"intent_id": None}])
def test_a_job_object_that_does_not_parse_is_dead_lettered_with_the_reason_and_acked(change: dict[str, Any]) -> None:
    runtime = FakeRuntime()
    doc = {**JOB, **change}
    message = FakeMessage([[doc], {}, {}])
    assert job_handler(runtime, requeue_pause=0)(message) == "ack"  # type: ignore[arg-type]
    [(kept, reason)] = runtime.dead_jobs
    assert kept == doc and "not a valid job" in reason and next(iter(change)) in reason
    assert not runtime.executed and not runtime.dead


def test_a_dead_letter_that_fails_is_retried_later_not_dropped() -> None:
    class Failing(FakeRuntime):
        def dead_letter_job(self, job: Job | dict[str, Any], reason: str) -> None:
            raise ConnectionError("broker away")

    message = FakeMessage([[{**JOB, "v": 2}], {}, {}])
    assert job_handler(Failing(), requeue_pause=0)(message) == "requeue"  # type: ignore[arg-type]


def test_a_message_that_is_not_a_job_is_acked_when_the_dead_letter_queue_is_full() -> None:
    """A full reach.dlq refuses the letter (a nack): the message is dropped and counted, never
    requeued into a loop."""
    from amqp.exceptions import MessageNacked

    from workers.pool.runtime import PoolRuntime

    class FullPublisher:
        def publish(self, *args: Any, **kwargs: Any) -> None:
            raise MessageNacked()

    class Connector:
        name = "c"

    runtime = PoolRuntime.__new__(PoolRuntime)
    runtime.connector = Connector()  # type: ignore[assignment]
    runtime.publisher = FullPublisher()  # type: ignore[assignment]
    message = FakeMessage(b"\xff not json", task="celery.backend_cleanup")
    assert job_handler(runtime, requeue_pause=0)(message) == "ack"
