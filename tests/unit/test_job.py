"""The router->pool job: one frozen, versioned model whose JSON is the one routers have always
written, so pools read jobs queued before an upgrade; anything else is refused with a reason."""

from __future__ import annotations

import json
from typing import Any

import pytest
from celery import Celery
from pydantic import ValidationError

from workers.transport.app import EXECUTE_TASK, JobMessages
from workers.transport.job import JobDecodeError, parse_job, parse_job_json

# a job as the router of the previous version wrote it (a dict, these keys in this order)
TODAYS_JOB: dict[str, Any] = {
    "v": 1,
    "intent_id": "i-1",
    "agent_id": "bot",
    "connector": "tickets",
    "action": "create_ticket",
    "params": {"title": "Ünïcode", "tags": ["a", "b"], "n": 3, "nested": {"x": None}},
    "idempotency_key": "k-1",
    "reply_to": "bot.session-1",
    "deadline": 1767225600.5,
    "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736",
    "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    "format": "native",
    "received_at": 1767225500.25,
    "dispatched_at": 1767225500.75,
}


def test_todays_job_round_trips_through_the_model() -> None:
    job = parse_job(TODAYS_JOB)
    assert job.hops == 0 and job.routing is None and job.run_id is None
    assert job.model_dump(exclude={"hops", "routing", "run_id"}) == TODAYS_JOB
    # same keys, same order
    assert list(json.loads(job.model_dump_json(exclude={"hops", "routing", "run_id"}))) == list(TODAYS_JOB)
    assert parse_job_json(job.model_dump_json()) == job


def test_a_job_without_deadline_or_traceparent_and_with_integer_times() -> None:
    job = parse_job({**TODAYS_JOB, "deadline": None, "traceparent": None, "received_at": 1, "dispatched_at": 2})
    assert job.deadline is None and job.traceparent is None and job.received_at == 1.0


def test_the_task_message_carries_the_job_as_its_only_argument() -> None:
    jobs = JobMessages(Celery("reach", set_as_current=False))
    body, headers, properties = jobs.build(parse_job(TODAYS_JOB), "i-1:1")
    args, kwargs, embed = json.loads(body)
    assert args == [TODAYS_JOB] and kwargs == {} and isinstance(embed, dict)
    assert headers["task"] == EXECUTE_TASK and headers["id"] == "i-1:1" and "Ünïcode" not in str(headers)
    assert properties["correlation_id"] == "i-1:1"


def test_a_run_id_travels_only_with_a_workflow_step() -> None:
    jobs = JobMessages(Celery("reach", set_as_current=False))
    body, _, _ = jobs.build(parse_job({**TODAYS_JOB, "run_id": "run-1"}), "i-1:1")
    assert json.loads(body)[0][0]["run_id"] == "run-1"
    body, _, _ = jobs.build(parse_job(TODAYS_JOB), "i-1:1")
    assert "run_id" not in json.loads(body)[0][0]


def test_hops_travel_only_when_an_agent_called_an_agent() -> None:
    jobs = JobMessages(Celery("reach", set_as_current=False))
    body, _, _ = jobs.build(parse_job({**TODAYS_JOB, "hops": 2}), "i-1:1")
    assert json.loads(body)[0] == [{**TODAYS_JOB, "hops": 2}]
    assert parse_job(json.loads(body)[0][0]).hops == 2


def test_a_routing_note_travels_only_when_semantic_routing_chose_the_connector() -> None:
    jobs = JobMessages(Celery("reach", set_as_current=False))
    note = {"method": "semantic", "candidates": [{"action": "tickets.create_ticket", "score": 0.5}]}
    body, _, _ = jobs.build(parse_job({**TODAYS_JOB, "routing": note}), "i-1:1")
    assert json.loads(body)[0] == [{**TODAYS_JOB, "routing": note}]
    assert parse_job(json.loads(body)[0][0]).routing == note
    with pytest.raises(JobDecodeError):
        parse_job({**TODAYS_JOB, "hops": -1})


def test_the_job_is_frozen() -> None:
    with pytest.raises(ValidationError):
        parse_job(TODAYS_JOB).intent_id = "other"  # type: ignore[misc]


@pytest.mark.parametrize(
    "change,field",
    [
        ({"v": 2}, "v"),
        ({"v": "1"}, "v"),
        ({"surprise": "x"}, "surprise"),
        ({"params": ["not", "an", "object"]}, "params"),
        ({"intent_id": ""}, "intent_id"),
        ({"deadline": "tomorrow"}, "deadline"),
    ],
)
def test_a_job_of_another_version_or_shape_is_refused_with_the_reason(change: dict[str, Any], field: str) -> None:
    with pytest.raises(JobDecodeError) as refused:
        parse_job({**TODAYS_JOB, **change})
    assert field in refused.value.reason and refused.value.doc == {**TODAYS_JOB, **change}


def test_a_job_missing_a_key_is_refused() -> None:
    doc = {k: v for k, v in TODAYS_JOB.items() if k != "reply_to"}
    with pytest.raises(JobDecodeError, match="reply_to"):
        parse_job(doc)


@pytest.mark.parametrize("body", [b"{not json", b"[1, 2]", b'"a string"', b"[" * 100_000 + b"]" * 100_000])
def test_a_body_that_is_not_a_job_object_is_refused(body: bytes) -> None:
    with pytest.raises(JobDecodeError):
        parse_job_json(body)
