"""The pool's side of the queue: each ``reach.execute`` message is read as data, parsed with
the one :class:`~workers.transport.job.Job` model and handed to the ``PoolRuntime``; what
happens to the message afterwards (ack, requeue, dead letter) is decided here."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable

from workers.observability import metrics
from workers.pool.runtime import PoolRuntime
from workers.transport.app import EXECUTE_TASK
from workers.transport.delivery import TRANSIENT_ERRORS, Delivery, Settle
from workers.transport.job import Job, JobDecodeError, parse_job

log = logging.getLogger("reach.pool")
REQUEUE_PAUSE_SECONDS = 1.0


def decode_job(message: Delivery) -> Job:
    """The job in a ``reach.execute`` task message (Celery protocol 2: ``[[job], {}, {...}]``).

    Raises:
        JobDecodeError: why not; its ``doc`` is the argument when that was a JSON object.
    """
    task = (message.headers or {}).get("task")
    if task != EXECUTE_TASK:
        raise JobDecodeError(f"not a {EXECUTE_TASK} message (task header {str(task)[:100]!r})")
    try:
        args = json.loads(message.body)[0]
    except (ValueError, TypeError, IndexError, KeyError, RecursionError) as exc:
        raise JobDecodeError("the message body is not a task message of JSON") from exc
    if not isinstance(args, list) or len(args) != 1:
        raise JobDecodeError("the task's argument is not a job object")
    return parse_job(args[0])


def job_handler(runtime: PoolRuntime, requeue_pause: float = REQUEUE_PAUSE_SECONDS) -> Callable[[Delivery], Settle]:
    """One message -> what to do with it. A job is acked after its receipt went out. A job that
    could not be finished because Redis or the broker failed goes back to the queue (after a
    pause, so an outage does not become a redelivery storm) instead of being acked without a
    receipt; a message that is not a job is dead-lettered once, with the reason."""

    def handle(message: Delivery) -> Settle:
        try:
            job = decode_job(message)
        except JobDecodeError as exc:
            return _not_a_job(runtime, message, exc, requeue_pause)
        try:
            runtime.execute(job, redelivered=message.redelivered)
        except TRANSIENT_ERRORS:
            log.exception("could not finish intent %s; it goes back to the queue", job.intent_id)
            time.sleep(requeue_pause)
            return "requeue"
        except Exception as exc:
            # not the broker or Redis: the same job would fail the same way on every delivery
            log.exception("giving up on intent %s", job.intent_id)
            metrics.MESSAGES_DROPPED.labels(reason=type(exc).__name__[:40]).inc()
            try:
                runtime.dead_letter_job(job, f"could not be finished: {type(exc).__name__}: {exc}"[:1000])
            except Exception as again:
                log.error("could not dead-letter intent %s either (%s); dropped", job.intent_id, again)
                metrics.DEAD_LETTERS_DROPPED.labels(reason="publish_failed").inc()
        return "ack"

    return handle


def _not_a_job(runtime: PoolRuntime, message: Delivery, problem: JobDecodeError, requeue_pause: float) -> Settle:
    """Dead-letter a message that is not a job this pool can run (a job object that does not
    parse is kept like a job, params redacted; anything else as it came), then ack it."""
    log.error("dead-lettering a message that is not a job: %s", problem.reason)
    try:
        if problem.doc is not None:
            runtime.dead_letter_job(problem.doc, problem.reason)
        else:
            runtime.dead_letter_raw(message, problem.reason)
    except Exception:
        log.exception("could not dead-letter it; it will be redelivered")
        time.sleep(requeue_pause)
        return "requeue"
    metrics.MESSAGES_DROPPED.labels(reason="JobDecodeError").inc()
    return "ack"
