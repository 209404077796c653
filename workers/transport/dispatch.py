"""Jobs onto connector queues, published ``mandatory`` so that a job no queue takes is never taken
for sent.

The fleet declares every connector queue when it starts. A queue deleted while it runs (by an
operator, a migration, a broker that lost it) is declared again only by its own pool, once that
pool reconnects. Meanwhile reach.dispatch has no queue for the job: the broker would confirm it
and drop it, and the router would ack an intent nobody will ever answer. Published mandatory, the
job comes back instead; the connector's queue is declared again (with the fleet's arguments) and
the job published once more, so it waits there for its pool. A job that comes back a second time
raises :class:`~workers.transport.publisher.Unroutable` for the caller to answer.

A nacked job is published again after a pause, a few times. The fleet declares connector queues
without a length bound, so a nack is not a full queue: it is the broker failing to take the
message, as a quorum queue does while its leader stops and another is elected (a second or
two). Only a nack that outlasts ``NACK_PAUSES_SECONDS`` reaches the caller, as ``Refused``. For
``REFUSED_MEMORY_SECONDS`` after that, jobs for the same connector get one try each: a queue that
keeps refusing (say, bounded by an operator's policy) must not hold the router's threads, shared
by every agent and connector, for seconds per intent.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from kombu import Connection, Queue

from producers.wire import NACK_PAUSES_SECONDS
from workers.transport.app import JobMessages
from workers.transport.delivery import Refused
from workers.transport.job import Job
from workers.transport.publisher import Publisher, Unroutable
from workers.transport.topology import (
    DEFAULT_QUEUE_TYPE,
    DISPATCH_EXCHANGE,
    WORKFLOW_JOB_CONNECTOR,
    QueueType,
    connector_queue,
    declare_queue,
    workflows_queue,
)

log = logging.getLogger("reach.dispatch")

REFUSED_MEMORY_SECONDS = 5.0


class Dispatcher:
    """Publishes jobs; ``connect`` (None: never declare, let the caller retry later) opens a broker
    connection to declare a connector queue found missing."""

    def __init__(
        self,
        publisher: Publisher,
        jobs: JobMessages,
        connect: Callable[[], Connection] | None = None,
        queue_type: QueueType = DEFAULT_QUEUE_TYPE,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.publisher = publisher
        self.jobs = jobs
        self.connect = connect
        self.queue_type = queue_type
        self.sleep = sleep
        self.clock = clock
        self._refused_until: dict[str, float] = {}  # queue -> monotonic time (one per catalog connector)

    def dispatch(self, job: Job) -> None:
        """Returns once the job is confirmed in its connector's queue (a workflow's start job: in
        reach.workflows).

        Raises:
            Unroutable: The queue is missing and could not be declared again (or ``connect`` is None).
            Refused: The broker nacked the job on every try (it is not in the queue).
        """
        if job.connector == WORKFLOW_JOB_CONNECTOR:  # a workflow run's start: the runner's queue
            self.dispatch_to(workflows_queue(self.queue_type), job)
        else:
            self.dispatch_to(connector_queue(job.connector, self.queue_type), job)

    def dispatch_to(self, target: Queue, job: Job) -> None:
        """``dispatch`` to a queue of the fleet bound on reach.dispatch by its own name: a
        connector's, or the workflow runner's (``topology.workflows_queue``). Raises as ``dispatch``."""
        body, headers, properties = self.jobs.build(job, f"{job.intent_id}:{time.time_ns()}")
        queue = target.name
        pauses = iter(NACK_PAUSES_SECONDS)
        declared = False
        while True:
            try:
                self.publisher.publish(
                    body, exchange=DISPATCH_EXCHANGE, routing_key=queue, headers=headers, mandatory=True, **properties
                )
                if self._refused_until:
                    self._refused_until.pop(queue, None)
                return
            except Unroutable as exc:
                if self.connect is None or declared:
                    raise
                log.warning("%s is missing (%s); declaring it again for intent %s", queue, exc, job.intent_id)
                self._declare(target)
                declared = True
            except Refused:
                refusing = self._refused_until.get(queue, 0.0) > self.clock()
                pause = None if refusing else next(pauses, None)
                if pause is None:
                    self._refused_until[queue] = self.clock() + REFUSED_MEMORY_SECONDS
                    raise
                log.warning(
                    "the broker nacked the job of intent %s on %s; publishing it again in %g s",
                    job.intent_id,
                    queue,
                    pause,
                )
                self.sleep(pause)

    def _declare(self, queue: Queue) -> None:
        assert self.connect is not None
        with self.connect() as connection:
            refused = declare_queue(connection, queue)
        if refused is not None:  # it exists (declared meanwhile, with other arguments): publish again
            log.warning("declaring %s was refused (%s)", queue.name, refused)
