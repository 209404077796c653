"""The Celery application shared by the router and the pools, configured for safety first.

JSON only (never pickle), persistent messages, publisher confirms, late acks that survive a
worker dying, and no result backend: outcomes travel as receipts, not Celery results.
"""
from __future__ import annotations

from typing import Any

from celery import Celery
from kombu import Queue

from workers.settings import Settings

EXECUTE_TASK = "reach.execute"


def create_app(settings: Settings, queues: list[Queue], **extra: Any) -> Celery:
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
        broker_pool_limit=16,
        # py-amqp waits for the broker's ack on every publish: a dispatch or receipt that
        # returns has been written by RabbitMQ
        broker_transport_options={"confirm_publish": True},
    )
    app.conf.update(extra)
    return app
