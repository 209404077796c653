"""Celery's consumer as the fleet's consumers (``workers.transport.consuming``) start from, fit for
quorum queues.

Two things change when a consumed queue is a quorum queue (``REACH_QUEUE_TYPE=quorum``):

- Celery then adds its native delayed delivery step, which declares ``celery_delayed_*`` exchanges
  and 28 queues and binds ours to them. Nothing here sends ETA tasks: the step is left out.
- RabbitMQ refuses a channel-wide prefetch on quorum queues, so Celery sets a per-consumer one,
  which a later ``basic.qos`` does not change for a consumer already running. Lowering the prefetch
  to hold off (the router's fair lanes) therefore cannot work there; :meth:`ReachConsumer.hold_off`
  cancels the consumer instead and consumes again on resume. Messages it holds stay unacked on the
  channel meanwhile and are settled as usual.

A broker that cancels a consumer (its queue deleted, e.g. by ``reach setup --migrate-queues``)
must make Celery reconnect, to the next node when the broker URL lists several, and declare and
consume its queue again (tests/integration/test_consumer_cancel.py). py-amqp raises
``ConsumerCancelled`` (a recoverable connection error) where it reads the cancel, but a cancel read
in Celery's first 0.1 s after a (re)connect is read inside ``celery.worker.loops._quick_drain``,
which swallows it and leaves the process consuming nothing, for good. So every consumer tag gets a
cancel callback (``channel.cancel_callbacks``, py-amqp's on_cancel) that raises it from the event
loop's next callback instead, where nothing swallows it. Jobs dispatched while a connector queue
is missing are not lost: ``workers.transport.dispatch`` declares the queue again.
"""

from __future__ import annotations

import logging
from typing import Any

from amqp import spec
from amqp.exceptions import ConsumerCancelled
from celery.worker.consumer import Consumer

log = logging.getLogger("reach.consuming")


class ReachConsumer(Consumer):
    """Celery's consumer without native delayed delivery, able to hold off with per-consumer prefetch."""

    class Blueprint(Consumer.Blueprint):
        default_steps = [s for s in Consumer.Blueprint.default_steps if not s.endswith(":DelayedDelivery")]

    held_off: Any = None  # the task consumer cancelled by hold_off, if any

    def on_ready(self) -> None:
        self.watch_cancels()  # the loop's consume() has just run
        super().on_ready()

    def _task_channel(self) -> Any:
        """The task consumer's channel (None before the first connect)."""
        return getattr(getattr(self, "task_consumer", None), "channel", None)

    def watch_cancels(self) -> None:
        """Give each consumer tag of the task consumer a cancel callback (see the module
        docstring). Call after every consume()."""
        callbacks = getattr(self._task_channel(), "cancel_callbacks", None)
        if callbacks is None:
            return
        for tag in list(getattr(self.task_consumer, "_active_tags", {}).values()):
            callbacks.setdefault(tag, self._cancelled_by_broker)

    def add_task_queue(self, queue: str, *args: Any, **kwargs: Any) -> None:
        super().add_task_queue(queue, *args, **kwargs)
        self.watch_cancels()

    def _cancelled_by_broker(self, tag: str) -> None:
        """py-amqp read a basic.cancel for ``tag``: reconnect, from outside whatever read it."""
        log.warning("the broker cancelled consumer %s (its queue deleted?); connecting again", tag)
        error = ConsumerCancelled(f"consumer {tag} was cancelled by the broker", spec.Basic.Cancel)
        if getattr(self, "hub", None) is None:
            raise error  # no event loop of Celery's here: raised where it was read, as py-amqp would
        channel = self._task_channel()

        def again() -> None:
            # not if the consumer has connected again meanwhile (its channel is another one then)
            if self._task_channel() is channel:
                raise error

        self.call_soon(again)

    @property
    def per_consumer_prefetch(self) -> bool:
        """Celery uses a per-consumer prefetch on this connection (known once it consumes)."""
        return getattr(self, "qos_global", None) is False

    def hold_off(self, paused: bool) -> bool:
        """On the consumer's thread: stop consuming while ``paused``, consume again once not. Only
        with a per-consumer prefetch; False otherwise (lower the prefetch instead)."""
        if not self.per_consumer_prefetch:
            return False
        consumer = getattr(self, "task_consumer", None)
        if consumer is None:
            return True
        try:
            if paused and self.held_off is not consumer:
                self.held_off = consumer  # first: cancel waits for its answer, and deliveries run meanwhile
                consumer.cancel()
            elif not paused and self.held_off is consumer:
                self.held_off = None
                consumer.consume()
                self.watch_cancels()
        except Exception as exc:  # the connection went away: its restart consumes again
            log.warning("could not %s consuming (%s)", "stop" if paused else "resume", exc)
        return True
