"""Jobs onto connector queues, published ``mandatory`` so that a job no queue takes is never taken
for sent.

The fleet declares every connector queue when it starts. A queue deleted while it runs (by an
operator, a migration, a broker that lost it) is declared again only by its own pool, once that
pool reconnects. Meanwhile reach.dispatch has no queue for the job: the broker would confirm it
and drop it, and the router would ack an intent nobody will ever answer. Published mandatory, the
job comes back instead; the connector's queue is declared again (with the fleet's arguments) and
the job published once more, so it waits there for its pool. A job that comes back a second time
raises :class:`~workers.transport.publisher.Unroutable` for the caller to answer.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from kombu import Connection

from workers.transport.app import JobMessages
from workers.transport.job import Job
from workers.transport.publisher import Publisher, Unroutable
from workers.transport.topology import (
    DEFAULT_QUEUE_TYPE,
    DISPATCH_EXCHANGE,
    QueueType,
    connector_queue,
    connector_queue_name,
    declare_queue,
)

log = logging.getLogger("reach.dispatch")


class Dispatcher:
    """Publishes jobs; ``connect`` (None: never declare, let the caller retry later) opens a broker
    connection to declare a connector queue found missing."""

    def __init__(
        self,
        publisher: Publisher,
        jobs: JobMessages,
        connect: Callable[[], Connection] | None = None,
        queue_type: QueueType = DEFAULT_QUEUE_TYPE,
    ) -> None:
        self.publisher = publisher
        self.jobs = jobs
        self.connect = connect
        self.queue_type = queue_type

    def dispatch(self, job: Job) -> None:
        """Returns once the job is confirmed in its connector's queue.

        Raises:
            Unroutable: The queue is missing and could not be declared again (or ``connect`` is None).
        """
        body, headers, properties = self.jobs.build(job, f"{job.intent_id}:{time.time_ns()}")
        queue = connector_queue_name(job.connector)

        def publish() -> None:
            self.publisher.publish(
                body, exchange=DISPATCH_EXCHANGE, routing_key=queue, headers=headers, mandatory=True, **properties
            )

        try:
            publish()
            return
        except Unroutable as exc:
            if self.connect is None:
                raise
            log.warning("%s is missing (%s); declaring it again for intent %s", queue, exc, job.intent_id)
        self._declare(job.connector)
        publish()

    def _declare(self, connector: str) -> None:
        assert self.connect is not None
        with self.connect() as connection:
            refused = declare_queue(connection, connector_queue(connector, self.queue_type))
        if refused is not None:  # it exists (declared meanwhile, with other arguments): publish again
            log.warning("declaring %s was refused (%s)", connector_queue_name(connector), refused)
