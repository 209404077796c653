"""A pool's dead letters: jobs it cannot finish, and messages on its queue that are not jobs,
kept in reach.dlq for operators. Params are redacted (and the letter marked so `reach dlq replay`
never sends the marker to a system); a full reach.dlq refuses a letter, which is counted, not
retried."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from connectors.catalog import Catalog
from producers.wire import AMQP_SHORT_STRING_BYTES
from workers.observability import metrics
from workers.observability.redaction import REDACTED, REDACTED_HEADER, redact_params
from workers.transport.delivery import Delivery, Refused
from workers.transport.publisher import Publisher
from workers.transport.topology import DEFAULT_EXCHANGE, DLQ, connector_queue_name

log = logging.getLogger("reach.pool")


@dataclass(frozen=True)
class Letter:
    body: bytes
    message_id: str
    headers: dict[str, Any]
    kept: str  # how much of the message is in it: "full" or "redacted"


def job_letter(catalog: Catalog, connector: str, job: dict[str, Any], reason: str) -> Letter:
    """The letter of a job (or of a job object that does not parse), params redacted."""
    ref = catalog.refs.get((str(job.get("connector")), str(job.get("action"))))
    params = job.get("params")
    safe_params = redact_params(params, ref.action.input) if ref else REDACTED
    intent_id = _short(str(job.get("intent_id") or ""))
    headers = {
        "x-reach-reason": reason[:1000],
        "x-reach-intent-id": intent_id,
        "x-reach-agent-id": _short(str(job.get("agent_id") or "")),
        "x-reach-connector": connector,
    }
    kept = "full"
    if safe_params != params:
        headers[REDACTED_HEADER] = "true"  # `reach dlq replay` must not send the marker downstream
        kept = "redacted"
    return Letter(json.dumps(dict(job, params=safe_params), default=str).encode(), intent_id, headers, kept)


def raw_letter(connector: str, message: Delivery, reason: str) -> Letter:
    """The letter of a message on the pool's queue that is not a job: kept as it came."""
    # no x-reach-connector: `reach dlq replay` sends letters with one back to that pool as jobs
    queue = connector_queue_name(connector)
    headers = {"x-reach-reason": f"{reason} (found on {queue})"[:1000], "x-reach-queue": queue}
    return Letter(message.body, _short(message.message_id or ""), headers, "full")


def post(publisher: Publisher, letter: Letter) -> None:
    """Publish one dead letter (counted by how much of it was kept); a full reach.dlq refuses it,
    which is counted, not retried."""
    try:
        publisher.publish(
            letter.body,
            exchange=DEFAULT_EXCHANGE,
            routing_key=DLQ.name,
            message_id=letter.message_id,
            headers=letter.headers,
        )
    except Refused:
        reason = letter.headers["x-reach-reason"][:200]
        log.warning("reach.dlq is full; dead letter %s dropped (%s)", letter.message_id, reason)
        metrics.DEAD_LETTERS_DROPPED.labels(reason="dlq_full").inc()
        return
    metrics.DEAD_LETTERS.labels(kept=letter.kept).inc()


def _short(text: str) -> str:
    """At most an AMQP short string's 255 bytes of ``text``."""
    return text.encode("utf-8")[:AMQP_SHORT_STRING_BYTES].decode("utf-8", "ignore")
