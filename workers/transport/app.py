"""The Celery application shared by the router and the pools, configured for safety first.

JSON only (never pickle), persistent messages, publisher confirms, and no result backend:
outcomes travel as receipts, not Celery results. Neither the router nor the pools run Celery
tasks (``workers.transport.consuming`` reads each message as data and acks it only once it was handled);
the task settings below are kept safe for anyone who does run a task on this app.
"""

from __future__ import annotations

import json
from typing import Any

from celery import Celery
from kombu import Queue

from workers.settings import Settings
from workers.transport.inbound import make_frame_handler
from workers.transport.job import Job
from workers.transport.topology import typed

EXECUTE_TASK = "reach.execute"


def create_app(settings: Settings, queues: list[Queue], **extra: Any) -> Celery:
    """The Celery app of a router or pool consuming ``queues`` (fleet work queues: they are given
    the arguments of ``REACH_QUEUE_TYPE`` here, so Celery declares them as ``declare_all`` does).

    ``REACH_BROKER_URL`` may name several nodes of a cluster, split by ``;``: kombu connects to the
    first that answers and, when a connection is lost, to the next (round-robin)."""
    queues = [typed(queue, settings.queue_type) for queue in queues]
    app = Celery("reach", broker=settings.broker_url, set_as_current=False)
    app.conf.update(
        task_serializer="json",
        accept_content=["json"],
        result_backend=None,
        task_ignore_result=True,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_default_delivery_mode="persistent",
        task_queues=queues,
        task_default_queue=queues[0].name,
        task_create_missing_queues=False,
        worker_prefetch_multiplier=1,
        worker_cancel_long_running_tasks_on_connection_loss=True,
        worker_send_task_events=False,
        task_send_sent_event=False,
        worker_hijack_root_logger=False,
        worker_redirect_stdouts=False,
        broker_connection_retry_on_startup=True,
        broker_connection_max_retries=None,
        broker_heartbeat=30,
        broker_failover_strategy="round-robin",
        broker_pool_limit=16,
        broker_transport_options={
            # py-amqp waits for the broker's ack on every publish: a dispatch or receipt that
            # returns has been written by RabbitMQ
            "confirm_publish": True,
            # every message is read by workers.transport.inbound: bounded properties, a capped body;
            # a job can be up to ~3x its intent (JSON escapes), so the cap leaves room for that
            "frame_handler": make_frame_handler(settings.max_intent_bytes * 4 + 65536),
        },
    )
    app.conf.update(extra)
    return app


class JobMessages:
    """``reach.execute`` task messages (Celery protocol 2) built straight from a :class:`Job`.

    ``app.send_task`` rebuilds every header, reprs the arguments and runs kombu's retry wrapper on
    each call, costing more CPU than the publish itself. The headers here come from Celery's own
    ``as_task_v2`` once, so the pools' Celery reads them as it reads any task; per job only the id
    and the JSON body change. ``argsrepr`` is fixed: Celery would otherwise copy the params
    (sensitive ones too) into the headers.
    """

    def __init__(self, app: Celery) -> None:
        template = app.amqp.as_task_v2("", EXECUTE_TASK, args=(), kwargs={}, argsrepr="(job)", kwargsrepr="{}")
        self._headers: dict[str, Any] = dict(template.headers)
        # the body is ``[[job], {}, embed]``: everything but the job is the same for every message
        self._tail = b"],{}," + json.dumps(dict(template.body[2]), separators=(",", ":")).encode() + b"]"

    def build(self, job: Job, task_id: str) -> tuple[bytes, dict[str, Any], dict[str, Any]]:
        """(body, headers, properties) for one job."""
        headers = {**self._headers, "id": task_id, "root_id": task_id}
        # fields at their defaults are left out, so a pool that predates them reads the job
        unset = {
            name
            for name, default in (
                ("hops", job.hops == 0),
                ("routing", job.routing is None),
                ("run_id", job.run_id is None),
            )
            if default
        }
        body = b"[[" + job.model_dump_json(exclude=unset or None).encode() + self._tail
        return body, headers, {"correlation_id": task_id, "reply_to": ""}
