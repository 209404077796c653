"""What the pool does with each message on its queue, before and after running the job: the
job is read as data, infrastructure failures put it back instead of acking it unanswered, and a
message that is not a job is dead-lettered, never dropped."""
from __future__ import annotations

import json
from typing import Any

import pytest
import redis

from workers.transport.app import EXECUTE_TASK
from workers.pool.runtime import decode_job, job_handler


class FakeMessage:
    def __init__(self, body: Any, task: str | None = EXECUTE_TASK, redelivered: bool = False) -> None:
        self.body = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.headers = {"task": task} if task is not None else {}
        self.properties = {"message_id": "m-1"}
        self.delivery_info = {"redelivered": redelivered}

    def ack(self) -> None: ...

    def requeue(self) -> None: ...


class FakeRuntime:
    def __init__(self, fail: Exception | None = None) -> None:
        self.fail = fail
        self.executed: list[tuple[dict[str, Any], bool]] = []
        self.dead: list[str] = []

    def execute(self, job: dict[str, Any], redelivered: bool = False) -> None:
        if self.fail is not None:
            raise self.fail
        self.executed.append((job, redelivered))

    def dead_letter_raw(self, message: Any, reason: str) -> None:
        self.dead.append(reason)


JOB = {"intent_id": "i-1", "agent_id": "a", "connector": "c", "action": "x", "params": {}}


def test_a_task_message_is_read_as_its_job() -> None:
    job, problem = decode_job(FakeMessage([[JOB], {}, {"callbacks": None}]))  # type: ignore[arg-type]
    assert job == JOB and problem == ""


@pytest.mark.parametrize("body,task,why", [
    ([[JOB], {}, {}], "celery.chord_unlock", "not a reach.execute message"),
    ([[JOB], {}, {}], None, "not a reach.execute message"),
    (b"{not json", EXECUTE_TASK, "not a task message of JSON"),
    ([], EXECUTE_TASK, "not a task message of JSON"),
    ([["a string"], {}, {}], EXECUTE_TASK, "not a job object"),
    ([[JOB, JOB], {}, {}], EXECUTE_TASK, "not a job object"),
])
def test_anything_else_is_refused_with_a_reason(body: Any, task: str | None, why: str) -> None:
    job, problem = decode_job(FakeMessage(body, task))  # type: ignore[arg-type]
    assert job is None and why in problem


def test_a_finished_job_is_acked_and_a_redelivery_is_flagged() -> None:
    runtime = FakeRuntime()
    message = FakeMessage([[JOB], {}, {}], redelivered=True)
    settle = job_handler(runtime, requeue_pause=0)(message)  # type: ignore[arg-type]
    assert settle == message.ack and runtime.executed == [(JOB, True)]


def test_a_job_that_redis_failed_goes_back_to_the_queue_instead_of_being_acked_unanswered() -> None:
    runtime = FakeRuntime(fail=redis.ConnectionError("Redis is down"))
    message = FakeMessage([[JOB], {}, {}])
    assert job_handler(runtime, requeue_pause=0)(message) == message.requeue  # type: ignore[arg-type]


def test_a_message_that_is_not_a_job_is_dead_lettered_and_acked() -> None:
    runtime = FakeRuntime()
    message = FakeMessage(b"garbage")
    assert job_handler(runtime, requeue_pause=0)(message) == message.ack  # type: ignore[arg-type]
    assert runtime.dead and "not a task message" in runtime.dead[0] and not runtime.executed
