"""What operators ask of a running fleet: status per connector, one intent's stages, dead letters."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import redis
from kombu import Connection, Producer

from producers.wire import INTENT_ROUTING_KEY, Receipt
from workers.observability.redaction import REDACTED_HEADER, contains_redacted
from workers.router.intake import ON_BEHALF_OF_HEADER, fleet_login
from workers.state import keys
from workers.state.breaker import breaker_state
from workers.state.client import text as _text
from workers.state.control import is_paused, live_workers
from workers.state.health import HealthBoard
from workers.transport.app import JobMessages
from workers.transport.job import Job, JobDecodeError, parse_job_json
from workers.transport.topology import (
    CONNECTOR_QUEUE_PREFIX,
    DISPATCH_EXCHANGE,
    DLQ,
    INTENTS_EXCHANGE,
    connector_queue,
)

# why a letter stays in reach.dlq instead of being replayed (the CLI prints it)
NOT_REPLAYED_NOT_KEPT = "its body was not kept (oversize or unparsable: see x-reach-body-bytes and -sha256)"
NOT_REPLAYED_REDACTED = (
    "its sensitive params were redacted when it was dead-lettered; ask the agent to send the intent again"
)
NOT_REPLAYED_NOT_A_JOB = "its body is not a job this version can run; it cannot be sent to its connector's pool"
NOT_REPLAYED_NO_IDENTITY = (
    "no identity the broker vouched for is known for it, and this fleet accepts only those "
    "(REACH_REQUIRE_USER_ID=1): the router would refuse it again; ask the agent to send the intent again"
)
# how long a replay waits for the router's answer to each intent it sent back
REPLAY_ANSWER_SECONDS = 5.0


@dataclass(frozen=True)
class ConnectorStatus:
    connector: str
    queue_depth: int | None
    consumers: int | None
    in_flight: int
    workers: int
    breaker: str
    health: str
    paused: bool
    last_error: str

    def to_dict(self) -> dict[str, Any]:
        return self.__dict__.copy()


class Unreachable(Exception):
    """RabbitMQ or Redis did not answer: ``service`` says which, the cause why."""

    def __init__(self, service: str, cause: Exception) -> None:
        super().__init__(f"{service} did not answer: {type(cause).__name__}: {cause}")
        self.service = service


def redact_url(url: str) -> str:
    """``url`` with its password, if any, replaced by ``***`` (for messages and logs); each of the
    URLs of a cluster's nodes, split by ``;``."""
    if ";" in url:
        return ";".join(redact_url(part) for part in url.split(";"))
    parts = urlsplit(url)
    return url.replace(f":{parts.password}@", ":***@") if parts.password else url


def discover_connectors(client: redis.Redis) -> list[str]:
    """Connectors that left state in Redis: pools' status, health marks, breakers, pauses, last
    errors (what ``reach status`` shows when no catalog names the connectors)."""
    found = set()
    for prefix in keys.CONNECTOR_PREFIXES:
        for key in client.scan_iter(match=prefix + "*", count=1000):
            name = keys.connector_of(key)
            if name:
                found.add(name)
    return sorted(found)


def fleet_status(connectors: Iterable[str] | None, broker_url: str, client: redis.Redis) -> list[ConnectorStatus]:
    """One row per connector: those named, or (None) those found in Redis.

    Raises:
        Unreachable: Redis or the broker cannot be reached.
    """
    try:
        client.ping()
        names = sorted(connectors) if connectors is not None else discover_connectors(client)
    except redis.RedisError as exc:
        raise Unreachable("Redis", exc) from exc
    conn = Connection(broker_url, connect_timeout=5)
    try:
        conn.ensure_connection(max_retries=1)
    except Exception as exc:  # kombu's OperationalError, or the socket's own
        conn.release()
        raise Unreachable("RabbitMQ", exc) from exc
    with conn:
        channel = conn.channel()
        depths: dict[str, tuple[int | None, int | None]] = {}
        for name in names:
            try:
                declared = channel.queue_declare(connector_queue(name).name, passive=True)
                depths[name] = int(declared.message_count), int(declared.consumer_count)
            except conn.channel_errors:
                depths[name] = (None, None)  # never declared: no pool has started yet
                channel = conn.channel()
    try:
        return [_status(client, name, *depths[name]) for name in names]
    except redis.RedisError as exc:
        raise Unreachable("Redis", exc) from exc


def _status(client: redis.Redis, name: str, depth: int | None, consumers: int | None) -> ConnectorStatus:
    workers = live_workers(client, name)
    raw_error = client.get(keys.last_error(name))
    last_error = ""
    if raw_error:
        err = json.loads(raw_error)
        last_error = f"{err['code']} {int(time.time() - err['at'])}s ago: {err['message']}"
    return ConnectorStatus(
        connector=name,
        queue_depth=depth,
        consumers=consumers,
        in_flight=sum(int(w.get("in_flight", 0)) for w in workers),
        workers=len(workers),
        breaker=breaker_state(client, name),
        health=HealthBoard(client).status(name),
        paused=is_paused(client, name),
        last_error=last_error,
    )


@dataclass(frozen=True)
class DeadLetter:
    message_id: str
    reason: str
    agent: str
    connector: str
    received_at: str
    preview: str
    body: bytes
    headers: dict[str, Any]


def _dead_letter(message: Any) -> DeadLetter:
    headers = dict(message.properties.get("application_headers") or {})
    body = message.body if isinstance(message.body, bytes) else str(message.body).encode()
    preview = body[:160].decode("utf-8", "replace").replace("\n", " ")
    if _text(headers.get("x-reach-body-kept")) == "none":
        preview = f"(body not kept: {headers.get('x-reach-body-bytes')} bytes, sha256 {_text(headers.get('x-reach-body-sha256'))[:16]}…)"
    reason, connector = _text(headers.get("x-reach-reason")), _text(headers.get("x-reach-connector"))
    death = _broker_death(headers)
    if not reason and death is not None:
        # moved here by the broker (a quorum queue's delivery limit): the message as it was queued
        reason, queue = death
        connector = queue.removeprefix(CONNECTOR_QUEUE_PREFIX) if queue.startswith(CONNECTOR_QUEUE_PREFIX) else ""
        preview = f"(not shown: {len(body)} bytes as queued, params not redacted)"
        body_tail = ""
    else:
        body_tail = "…" if len(body) > 160 else ""
    return DeadLetter(
        message_id=_text(message.properties.get("message_id")),
        reason=reason,
        agent=_text(headers.get("x-reach-agent-id")),
        connector=connector,
        received_at=_text(headers.get("x-reach-received-at")),
        preview=preview + body_tail,
        body=body,
        headers=headers,
    )


def _broker_death(headers: dict[str, Any]) -> tuple[str, str] | None:
    """("broker: REASON in QUEUE", QUEUE) for a message the broker dead-lettered (its x-death header)."""
    deaths = headers.get("x-death")
    if not isinstance(deaths, list) or not deaths or not isinstance(deaths[0], dict):
        return None
    queue = _text(deaths[0].get("queue"))
    return f"broker: {_text(deaths[0].get('reason'))} in {queue}", queue


def list_dead_letters(broker_url: str, limit: int = 100) -> list[DeadLetter]:
    """Read without removing: everything taken is returned to the queue when the channel closes."""
    found: list[DeadLetter] = []
    with Connection(broker_url, connect_timeout=5) as conn:
        channel = conn.channel()
        channel.auto_decode = False
        try:
            channel.queue_declare(DLQ.name, passive=True)
        except Exception:
            return found  # never declared: no dead letters yet
        while len(found) < limit:
            message = channel.basic_get(DLQ.name, no_ack=False)
            if message is None:
                break
            found.append(_dead_letter(message))
        channel.close()  # unacked messages go back, in order
    return found


def was_redacted(letter: DeadLetter) -> bool:
    """Whether this letter's sensitive params were replaced by the redaction marker (so not replayable).

    Pools say so in a header; letters without it (the router's, and older pool letters) are
    recognized by the marker in their params."""
    if _text(letter.headers.get(REDACTED_HEADER)).lower() == "true":
        return True
    try:
        doc = json.loads(letter.body)
        return isinstance(doc, dict) and "params" in doc and contains_redacted(doc["params"])
    except (ValueError, RecursionError):
        return False  # not JSON: no params to have lost (the router rejects it again)


@dataclass(frozen=True)
class Replay:
    replayed: list[str]
    kept: list[tuple[str, str]]  # (message id, why it was not replayed): still in reach.dlq
    # (message id, the router's answer): sent back, and refused again (not in ``replayed``)
    refused: list[tuple[str, str]] = field(default_factory=list)


def replay_dead_letters(
    broker_url: str,
    client: redis.Redis,
    ids: set[str] | None,
    jobs: JobMessages,
    *,
    require_user_id: bool = False,
    answer_seconds: float = REPLAY_ANSWER_SECONDS,
) -> Replay:
    """Send dead letters (all, or those whose message id is in ``ids``) back through the fleet.

    A router dead letter (an intent it could not read) goes back to reach.intents; a pool dead
    letter (a job that kept killing workers) goes back to its connector queue as a ``reach.execute``
    message built like the router's, so no param is copied into its headers. Message ids and
    idempotency keys are kept, so the ledger still prevents a second execution; the intent's
    receipt marker is cleared so the replay is answered. A letter whose params were redacted is
    never sent (the system would get placeholders): it stays in reach.dlq and is in ``kept``.

    Identity: a router letter whose agent the broker vouched for (``x-reach-agent-verified``) is
    published as the fleet's own login (the ``user_id`` RabbitMQ checks) with that agent in
    ``x-reach-on-behalf-of``, which the router accepts from that login only; others carry the
    agent in the ``agent_id`` header, as the agent could. Under ``require_user_id`` a letter
    without a vouched agent is kept: the router would refuse it again. Each router letter sent back
    is then watched for ``answer_seconds``: one the router refuses again is in ``refused``, with
    its answer, not in ``replayed``.
    """
    replayed: list[str] = []
    kept: list[tuple[str, str]] = []
    sent_back: list[tuple[str, str, dict[str, bytes | None]]] = []  # router letters: id, agent, receipts before
    login = fleet_login(broker_url)
    with Connection(broker_url, connect_timeout=5, transport_options={"confirm_publish": True}) as conn:
        channel = conn.channel()
        channel.auto_decode = False
        # only the letters there now: one the fleet dead-letters again while this runs (a replayed
        # intent the router still cannot read) comes after them and is not replayed a second time
        waiting = int(channel.queue_declare(DLQ.name, passive=True).message_count)
        producer = conn.Producer(channel=conn.channel())
        for _ in range(waiting):
            message = channel.basic_get(DLQ.name, no_ack=False)
            if message is None:
                break
            letter = _dead_letter(message)
            if ids is not None and letter.message_id not in ids:
                continue  # stays unacked: returned to the queue when the channel closes
            job: Job | None = None
            if letter.connector:
                try:
                    job = parse_job_json(letter.body)  # the model the pools run it with
                except JobDecodeError as exc:
                    why = NOT_REPLAYED_REDACTED if was_redacted(letter) else f"{NOT_REPLAYED_NOT_A_JOB} ({exc.reason})"
                    kept.append((letter.message_id, why))
                    continue  # unacked: returned
            if _text(letter.headers.get("x-reach-body-kept")) == "none":
                kept.append((letter.message_id, NOT_REPLAYED_NOT_KEPT))
                continue  # unacked: returned; there is nothing to send again
            if was_redacted(letter):
                kept.append((letter.message_id, NOT_REPLAYED_REDACTED))
                continue  # unacked: returned, and its markers stay as they are
            vouched = letter.headers.get("x-reach-agent-verified") is True and bool(letter.agent)
            if job is None and require_user_id and not vouched:
                kept.append((letter.message_id, NOT_REPLAYED_NO_IDENTITY))
                continue  # unacked: returned
            if letter.message_id:
                client.delete(
                    keys.sent(letter.agent or None, letter.message_id),
                    keys.deliveries(letter.agent or None, letter.message_id),
                )
            if job is not None:
                _publish_job(producer, jobs, job, letter.connector)
            else:
                # also a letter with x-reach-queue only (not a job, found on a pool's queue): the
                # router reads it as an intent, never a pool as a job
                agent = letter.agent
                if letter.message_id:
                    sent_back.append((letter.message_id, agent, _receipts_now(client, agent, letter.message_id)))
                identity: dict[str, Any] = (
                    {"user_id": login, "headers": {ON_BEHALF_OF_HEADER: agent}}
                    if vouched
                    else {"headers": {"agent_id": agent} if agent else {}}
                )
                producer.publish(
                    letter.body,
                    exchange=INTENTS_EXCHANGE,
                    routing_key=INTENT_ROUTING_KEY,
                    content_type="application/json",
                    content_encoding="utf-8",
                    delivery_mode=2,
                    message_id=letter.message_id or None,
                    **identity,
                )
            channel.basic_ack(message.delivery_info["delivery_tag"])
            replayed.append(letter.message_id)
        channel.close()
    refused = _refused_again(client, sent_back, answer_seconds)
    refused_ids = {message_id for message_id, _ in refused}
    return Replay([m for m in replayed if m not in refused_ids], kept, refused)


def _receipts_now(client: redis.Redis, agent: str, message_id: str) -> dict[str, bytes | None]:
    """The receipts stored for this intent id under its agent and under no agent (the router files a
    refusal whose identity it did not accept there), to tell the router's next answer by."""
    names = {keys.receipt(agent or None, message_id), keys.receipt(None, message_id)}
    return {name: client.get(name) for name in names}


def _refused_again(
    client: redis.Redis, sent_back: list[tuple[str, str, dict[str, bytes | None]]], seconds: float
) -> list[tuple[str, str]]:
    """The router letters sent back that were answered ``rejected`` within ``seconds`` (a receipt
    stored since, other than the one before), with that answer. An intent the router dispatched
    or parked has no new receipt that soon, and counts as replayed."""
    refused: list[tuple[str, str]] = []
    waiting = list(sent_back)
    deadline = time.monotonic() + seconds
    while waiting:
        still = []
        for message_id, agent, before in waiting:
            now = _receipts_now(client, agent, message_id)
            new = next((raw for name, raw in now.items() if raw is not None and raw != before.get(name)), None)
            if new is None:
                still.append((message_id, agent, before))
                continue
            receipt = Receipt.model_validate_json(new)
            if receipt.status == "rejected" and receipt.error is not None:
                why = f"sent back, and refused again: {receipt.error.code.value}: {receipt.error.message}"
                refused.append((message_id, why[:500]))
        waiting = still
        if not waiting or time.monotonic() >= deadline:
            break
        time.sleep(0.1)
    return refused


def _publish_job(producer: Producer, jobs: JobMessages, job: Job, connector: str) -> None:
    """As the router dispatches (confirmed, persistent, on reach.dispatch); the queue is declared
    as the pools declare it, so a letter for a connector whose pool never started is not lost."""
    queue = connector_queue(connector)
    body, headers, properties = jobs.build(job, f"{job.intent_id}:{time.time_ns()}")
    producer.publish(
        body,
        exchange=DISPATCH_EXCHANGE.name,
        routing_key=queue.name,
        headers=headers,
        content_type="application/json",
        content_encoding="utf-8",
        delivery_mode=2,
        declare=[queue],
        **properties,
    )
