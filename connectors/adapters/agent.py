"""Agent adapter: another agent answers a connector's actions (``type: agent``, ``agent: NAME``).

The actions are in the catalog like any other, so the router's permission, validation and rate
limit, and the pool's ledger, retries and breaker apply before a request reaches the agent. The wire
(docs/contract.md section 5, "Agent connectors"; producers.serve is the agent's side)::

    request   exchange reach.agents, routing key NAME -> durable queue reach.agent.NAME (declared by
              the fleet); persistent, mandatory, publisher-confirmed; correlation_id (new per
              attempt), reply_to "<NAME>.<token>", message_id = the intent id, expiration = the
              attempt's timeout; body producers.serve.AgentRequest (params, who asked, hops, ...)
    answer    exchange reach.agent-replies (topic), routing key = reply_to, same correlation_id;
              body producers.serve.AgentAnswer: {"status": "succeeded", "data"} or
              {"status": "failed", "error": {"code", "message", "suggestion"?, ...}}

Why not direct reply-to, as the amqp adapter uses: answering it means publishing to the default
exchange, and RabbitMQ checks that as write permission on ``amq.default``, which would let an agent
put messages in any queue by name (a pool's, and skip every guardrail). Instead each pool thread
binds an exclusive queue of its own to ``reach.agent-replies`` with ``<NAME>.<token>``, and agent
NAME's broker user may publish there only with keys that start with ``NAME.`` (workers.ops.agents).

Loop guard: a request carries ``hops`` = the job's hops + 1. An agent sending intents while it
handles a request passes that on (intent ``context.hops``), so a chain of agents calling each other
grows it by one per call; past ``MAX_AGENT_HOPS`` the call is refused without publishing
(DOWNSTREAM_VALIDATION_FAILED, sent False). Each level of a chain holds a handler thread, so the
chains looping between two agents at once are bounded too (connectors.adapters.loops, default one per
pair; ``extra["max_loops"]``): a loop past that is refused the same way before it takes a thread.

Failures as in the amqp adapter, plus: nobody consumes the agent's queue (it is not running) ->
DOWNSTREAM_UNREACHABLE, sent False; an answer that is not an AgentAnswer ->
DOWNSTREAM_CONTRACT_VIOLATION.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

import amqp
from amqp.exceptions import AMQPError
from pydantic import ValidationError

from connectors.adapters.amqp import DEFAULT_MAX_ANSWER_BYTES, DEFAULT_MAX_DEPTH
from connectors.adapters.amqp_answers import (
    BadAnswer,
    error_outcome,
    failure_outcome,
    parse_answer,
    success_outcome,
    violation,
)
from connectors.adapters.amqp_rpc import (
    CONNECT_TIMEOUT,
    Lost,
    NoAnswer,
    NotSent,
    RequestMessage,
    RequestReply,
    broker_error_text,
    release_quietly,
)
from connectors.adapters.base import CallContext, Outcome, ProbeResult
from connectors.adapters.common import compile_outputs
from connectors.adapters.errors import Unsendable, refused_outcome
from connectors.adapters.loops import DEFAULT_MAX_LOOPS_PER_PAIR, Entered, PairLoops, chain_of
from connectors.adapters.scrub import Scrubber
from connectors.spec import ActionSpec, ConnectorSpec
from producers.serve import (
    AGENT_REPLIES_EXCHANGE_NAME,
    AGENTS_EXCHANGE_NAME,
    AgentAnswer,
    AgentRequest,
    agent_queue_name,
)
from producers.wire import ErrorCode

MAX_AGENT_HOPS = 8  # agent-to-agent calls in one chain; the job model allows at most 64
REPLY_QUEUE_MAX_LENGTH = 16  # answers held for one thread: it takes them as they come


class AgentAdapter:
    """Sends one request per attempt to the agent that answers this connector, over the fleet's broker."""

    def __init__(self, connector: ConnectorSpec, options: Any) -> None:
        """``options``: connectors.adapters.factory.AdapterOptions; needs ``broker_url`` (``extra`` may
        set ``max_hops``, ``max_answer_bytes`` and ``connect_timeout``)."""
        if connector.agent is None:
            raise ValueError(f"connector {connector.name} names no agent")
        if not options.broker_url:
            raise ValueError(f"connector {connector.name}: the agent adapter needs the fleet's broker URL")
        self.connector = connector
        self.agent = connector.agent
        self._queue = agent_queue_name(connector.agent)
        self._max_hops = int(options.extra.get("max_hops", MAX_AGENT_HOPS))
        self._max_bytes = int(options.extra.get("max_answer_bytes", DEFAULT_MAX_ANSWER_BYTES))
        self._max_depth = options.max_depth if options.max_depth is not None else DEFAULT_MAX_DEPTH
        self._rpc = RequestReply(
            options.broker_url,
            reply_setup=self._reply_queue,
            before_publish=self._someone_listens,
            connect_timeout=float(options.extra.get("connect_timeout", CONNECT_TIMEOUT)),
        )
        self._outputs = compile_outputs(connector)
        self._max_loops = int(options.extra.get("max_loops", DEFAULT_MAX_LOOPS_PER_PAIR))
        # without shared state (single-process tools) only the hop limit guards
        self._loops = PairLoops(options.redis, self._max_loops) if options.redis is not None else None
        # an agent's error text that echoes the fleet's broker password must not pass it on
        self._scrub = Scrubber([urlsplit(options.broker_url).password or ""])

    def _reply_queue(self, channel: amqp.Channel, on_answer: Callable[[amqp.Message], None]) -> str:
        """This thread's reply queue. Bounded: an answer far past the size limit is dropped by the
        broker (the call times out) instead of being read into memory."""
        declared = channel.queue_declare(
            "",
            exclusive=True,
            auto_delete=True,
            arguments={"x-max-length": REPLY_QUEUE_MAX_LENGTH, "x-max-length-bytes": 4 * self._max_bytes},
        )
        key = f"{self.agent}.{uuid.uuid4().hex}"
        channel.queue_bind(declared.queue, AGENT_REPLIES_EXCHANGE_NAME, key)
        channel.basic_consume(declared.queue, callback=on_answer, no_ack=True)
        return key

    def _someone_listens(self, channel: amqp.Channel, request: RequestMessage) -> None:
        """An agent that is not running would only let requests expire in its queue: say so at once
        (DOWNSTREAM_UNREACHABLE, retried) rather than after the timeout as an unknown outcome."""
        consumers = channel.queue_declare(self._queue, passive=True).consumer_count
        if not consumers:
            raise NotSent(f"agent {self.agent} is not consuming {self._queue} (is it running?)")

    def call(self, action: ActionSpec, params: dict[str, Any], ctx: CallContext) -> Outcome:
        """One attempt. Never raises for anything the broker or the agent does."""
        return self._scrub.outcome(self._attempt(action, params, ctx))

    def _attempt(self, action: ActionSpec, params: dict[str, Any], ctx: CallContext) -> Outcome:
        hops = ctx.hops + 1
        if hops > self._max_hops:
            return Outcome(
                False,
                code=ErrorCode.DOWNSTREAM_VALIDATION_FAILED,
                message=(
                    f"refused to call agent {self.agent}: this would be agent-to-agent call {hops} in one chain, "
                    f"and the limit is {self._max_hops} (agents calling each other in a loop?)"
                ),
                suggestion="Answer from what you have, without calling another agent; do not resend unchanged.",
                details=[{"field": "context.hops", "code": "max", "message": f"must be below {self._max_hops}"}],
                sent=False,
            )
        timeout = ctx.timeout if ctx.timeout is not None else action.timeout_seconds
        caller = ctx.agent_id or ""
        entered = (
            self._loops.enter(caller, self.agent, chain_of(ctx.traceparent, ctx.intent_id), timeout)
            if self._loops is not None and caller
            else Entered(True)
        )
        if not entered.allowed:
            return Outcome(
                False,
                code=ErrorCode.DOWNSTREAM_VALIDATION_FAILED,
                message=(
                    f"refused to call agent {self.agent}: {entered.loops} chain(s) of calls between {caller} and "
                    f"{self.agent} already loop back and forth, and the limit is {self._max_loops} at once"
                ),
                suggestion="Answer from what you have, without calling back the agent that asked you; "
                "do not resend unchanged.",
                details=[{"field": "context", "code": "agent_loops", "message": f"at most {self._max_loops} at once"}],
                sent=False,
            )
        try:
            return self._call(action, params, ctx, timeout)
        finally:
            if self._loops is not None:
                self._loops.leave(caller, self.agent, entered)

    def _call(self, action: ActionSpec, params: dict[str, Any], ctx: CallContext, timeout: float) -> Outcome:
        hops = ctx.hops + 1
        try:
            body = AgentRequest(
                intent_id=ctx.intent_id,
                agent_id=ctx.agent_id or "",
                connector=self.connector.name,
                action=action.action,
                params=params,
                idempotency_key=ctx.idempotency_key,
                hops=hops,
                deadline=datetime.fromtimestamp(time.time() + timeout, UTC).isoformat().replace("+00:00", "Z"),
                traceparent=ctx.traceparent,
            ).model_dump_json()
        except ValueError as exc:  # pydantic's serialisation error: text UTF-8 cannot carry
            return refused_outcome(Unsendable(f"the request cannot be written as JSON: {exc}"))
        request = RequestMessage(AGENTS_EXCHANGE_NAME, self.agent, body.encode(), timeout, message_id=ctx.intent_id)
        started = time.perf_counter()
        try:
            answer = self._rpc.request(request)
        except (NotSent, Lost, NoAnswer) as exc:
            return failure_outcome(exc, self.connector, action, timeout, _ms(started))
        except Unsendable as exc:
            return refused_outcome(exc, started=started)
        elapsed = _ms(started)
        max_depth = ctx.max_depth if ctx.max_depth is not None else self._max_depth
        try:
            doc = parse_answer(bytes(answer.body), self._max_bytes, max_depth)
            reply = AgentAnswer.model_validate(doc)
        except BadAnswer as exc:
            return violation(self.connector.name, action, str(exc), elapsed)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or '(answer)'}: {e['msg']}"
                for e in exc.errors(include_url=False, include_input=False)[:5]
            )
            return violation(self.connector.name, action, f"not an agent answer ({problems})", elapsed)
        if reply.error is not None:
            return error_outcome(reply.error, elapsed)
        data = {} if reply.data is None else reply.data
        return success_outcome(self.connector.name, action, self._outputs[action.action], data, elapsed)

    def probe(self, timeout: float) -> ProbeResult:
        """Healthy when the agent consumes its request queue."""
        try:
            conn = self._rpc.connect(timeout)
        except (OSError, AMQPError) as exc:
            return ProbeResult(False, f"cannot connect to the fleet's broker: {broker_error_text(exc)}")
        try:
            consumers = conn.connection.channel().queue_declare(self._queue, passive=True).consumer_count
        except (OSError, AMQPError) as exc:
            return ProbeResult(False, f"{self._queue}: {broker_error_text(exc)}")
        finally:
            release_quietly(conn)
        if not consumers:
            return ProbeResult(False, f"agent {self.agent} is not consuming {self._queue}")
        return ProbeResult(True, f"agent {self.agent}: {consumers} consumer(s)")

    def close(self) -> None:
        self._rpc.close()


def _ms(started: float) -> float:
    return (time.perf_counter() - started) * 1000
