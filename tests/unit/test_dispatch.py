"""Jobs are published mandatory: a job no queue took comes back, its connector's queue is declared
again and the job published once more; a second return reaches the caller. A nacked job is
published again after a pause, a bounded number of times."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
from kombu import Queue

from producers.wire import NACK_PAUSES_SECONDS
from workers.settings import Settings
from workers.transport import dispatch as dispatch_module
from workers.transport.app import JobMessages, create_app
from workers.transport.delivery import Refused
from workers.transport.dispatch import REFUSED_MEMORY_SECONDS, Dispatcher
from workers.transport.job import Job
from workers.transport.publisher import Unroutable
from workers.transport.topology import connector_queue


class ReturningPublisher:
    """Returns (raises Unroutable for) the first ``returns`` publishes, confirms the rest."""

    def __init__(self, returns: int) -> None:
        self.returns = returns
        self.published: list[dict[str, Any]] = []

    def publish(self, body: bytes, **kwargs: Any) -> None:
        self.published.append(kwargs)
        if len(self.published) <= self.returns:
            raise Unroutable(f"{kwargs['routing_key']}: NO_ROUTE")


def job() -> Job:
    return Job(
        intent_id="i-1",
        agent_id="bot",
        connector="tickets",
        action="create_ticket",
        params={"title": "x"},
        idempotency_key="i-1",
        reply_to="bot",
        deadline=None,
        trace_id="0" * 32,
        traceparent=None,
        format="native",
        received_at=1.0,
        dispatched_at=1.0,
    )


@pytest.fixture
def declared(monkeypatch: pytest.MonkeyPatch) -> list[Queue]:
    seen: list[Queue] = []
    monkeypatch.setattr(dispatch_module, "declare_queue", lambda connection, queue: seen.append(queue))
    return seen


@contextlib.contextmanager
def no_connection() -> Iterator[None]:
    yield None


def jobs() -> JobMessages:
    return JobMessages(create_app(Settings.from_env({}), [connector_queue("tickets")]))


def test_a_returned_job_declares_its_queue_again_and_is_published_there(declared: list[Queue]) -> None:
    publisher = ReturningPublisher(returns=1)
    Dispatcher(publisher, jobs(), no_connection, "classic").dispatch(job())  # type: ignore[arg-type]
    assert [q.name for q in declared] == ["reach.connector.tickets"]
    assert declared[0].queue_arguments == connector_queue("tickets", "classic").queue_arguments
    assert [p["routing_key"] for p in publisher.published] == ["reach.connector.tickets"] * 2
    assert all(p["mandatory"] for p in publisher.published)


def test_a_job_returned_twice_reaches_the_caller(declared: list[Queue]) -> None:
    with pytest.raises(Unroutable):
        Dispatcher(ReturningPublisher(returns=2), jobs(), no_connection).dispatch(job())  # type: ignore[arg-type]
    assert len(declared) == 1


def test_without_a_way_to_declare_the_return_reaches_the_caller_at_once(declared: list[Queue]) -> None:
    publisher = ReturningPublisher(returns=1)
    with pytest.raises(Unroutable):
        Dispatcher(publisher, jobs()).dispatch(job())  # type: ignore[arg-type]
    assert declared == [] and len(publisher.published) == 1


def test_a_routed_job_is_published_once(declared: list[Queue]) -> None:
    publisher = ReturningPublisher(returns=0)
    Dispatcher(publisher, jobs(), no_connection).dispatch(job())  # type: ignore[arg-type]
    assert declared == [] and len(publisher.published) == 1


class NackingPublisher:
    """Nacks (raises Refused for) the first ``nacks`` publishes, confirms the rest."""

    def __init__(self, nacks: int) -> None:
        self.nacks = nacks
        self.published = 0

    def publish(self, body: bytes, **kwargs: Any) -> None:
        self.published += 1
        if self.published <= self.nacks:
            raise Refused()


def test_a_nacked_job_is_published_again_after_a_pause(declared: list[Queue]) -> None:
    publisher = NackingPublisher(nacks=2)
    pauses: list[float] = []
    Dispatcher(publisher, jobs(), no_connection, sleep=pauses.append).dispatch(job())  # type: ignore[arg-type]
    assert publisher.published == 3
    assert pauses == list(NACK_PAUSES_SECONDS[:2])
    assert declared == []  # a nack is not a missing queue


def test_a_job_nacked_on_every_try_reaches_the_caller_as_refused(declared: list[Queue]) -> None:
    publisher = NackingPublisher(nacks=100)
    pauses: list[float] = []
    with pytest.raises(Refused):
        Dispatcher(publisher, jobs(), no_connection, sleep=pauses.append).dispatch(job())  # type: ignore[arg-type]
    assert publisher.published == len(NACK_PAUSES_SECONDS) + 1
    assert pauses == list(NACK_PAUSES_SECONDS)
    assert 2.0 < sum(pauses) < 10.0  # longer than a quorum queue's election, short enough to answer


def test_after_a_refusal_jobs_for_that_connector_get_one_try_for_a_while(declared: list[Queue]) -> None:
    now = [1000.0]
    publisher = NackingPublisher(nacks=100)
    pauses: list[float] = []
    dispatcher = Dispatcher(
        publisher,  # type: ignore[arg-type]
        jobs(),
        no_connection,
        sleep=pauses.append,
        clock=lambda: now[0],
    )
    with pytest.raises(Refused):
        dispatcher.dispatch(job())
    tries = publisher.published
    with pytest.raises(Refused):
        dispatcher.dispatch(job())  # at once: one try, no pauses
    assert publisher.published == tries + 1 and len(pauses) == len(NACK_PAUSES_SECONDS)
    now[0] += REFUSED_MEMORY_SECONDS + 1
    publisher.nacks = 0  # the queue takes messages again
    dispatcher.dispatch(job())
    assert publisher.published == tries + 2
