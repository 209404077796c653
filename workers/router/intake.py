"""Turning raw AMQP messages into intents, or into a precise reason why not.

Nothing a message contains may crash this step: every failure is a ``ParseFailure`` value that
the router turns into an INVALID_INTENT receipt (when it can tell who sent it) and a dead letter.
"""

from __future__ import annotations

import re
import secrets
import uuid
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit

from pydantic import ValidationError

from producers.formats import (
    DEFAULT_MAX_DEPTH,
    ENVELOPE_DEPTH,
    FormatError,
    TooDeep,
    loads_strict,
    normalize,
    top_level_string,
    value_depth,
)
from producers.wire import AGENT_ID_PATTERN, AMQP_SHORT_STRING_BYTES, INTENT_ID_PATTERN, ErrorCode, Intent
from workers.transport.delivery import Delivery, text_or_none
from workers.transport.topology import ON_BEHALF_OF_HEADER, RUN_ID_HEADER, WORKFLOW_REPLY_KEY

_TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")

# The agent the fleet's own broker login publishes for (`reach dlq replay`, workflow steps): the
# identity only when the AMQP user_id is that login, which RabbitMQ checks; refused from anyone else.


def fleet_login(broker_url: str) -> str:
    """The fleet's own RabbitMQ login: the user of (the first node of) REACH_BROKER_URL, as kombu
    logs in with it (``guest`` when the URL names none)."""
    return unquote(urlsplit(broker_url.split(";")[0].strip()).username or "") or "guest"


RawMessage = Delivery  # the router's name for what the broker delivered


@dataclass(frozen=True)
class ParsedIntent:
    intent: Intent  # intent_id and agent_id are always set here
    format: str
    trace_id: str
    traceparent: str | None
    run_id: str | None = None  # a workflow run's step, sent by the fleet's login (RUN_ID_HEADER)


@dataclass(frozen=True)
class ParseFailure:
    """Why a message is not an intent, and whatever identity could still be recovered."""

    reason: str
    intent_id: str
    agent_id: str | None
    reply_to: str | None  # where the receipt goes; None: nobody can be told (dead letter only)
    details: list[dict[str, Any]] = field(default_factory=list)
    code: ErrorCode = ErrorCode.INVALID_INTENT
    dead_letter: bool = True  # unreadable messages are kept for operators; refused identities are not


def reply_allowed(agent_id: str, reply_to: str) -> bool:
    """Receipts go to the agent's own routing keys only: ``agent`` or ``agent.<anything>``.

    RabbitMQ topic permissions can then confine each agent to reading its own receipts.
    """
    return reply_to == agent_id or reply_to.startswith(agent_id + ".")


def usable_reply_to(agent_id: str, reply_to: str) -> bool:
    """The agent's own, and a routing key the broker takes (at most 255 bytes, no wildcards)."""
    return (
        reply_allowed(agent_id, reply_to)
        and not any(c in reply_to for c in "*#")
        and len(reply_to.encode("utf-8", "surrogatepass")) <= AMQP_SHORT_STRING_BYTES
    )


def new_trace_id() -> str:
    return secrets.token_hex(16)


def trace_from(traceparent: Any) -> tuple[str, str | None]:
    """Continue a valid W3C traceparent, else start a new trace."""
    if isinstance(traceparent, str):
        match = _TRACEPARENT.match(traceparent.strip())
        if match and match.group(1) != "0" * 32:
            return match.group(1), traceparent.strip()
    return new_trace_id(), None


def _header_text(headers: dict[str, Any], name: str) -> str | None:
    value = headers.get(name)
    if isinstance(value, bytes):
        try:
            value = value.decode("utf-8")
        except UnicodeDecodeError:
            return None
    return value if isinstance(value, str) else None


def _valid_agent(name: str | None) -> str | None:
    return name if name is not None and AGENT_ID_PATTERN.match(name) else None


def fail_identity(raw: RawMessage) -> tuple[str, str | None]:
    """Intent id and agent of a message the router could not handle, from its properties only."""
    intent_id = raw.message_id if raw.message_id and INTENT_ID_PATTERN.match(raw.message_id) else uuid.uuid4().hex
    agent = raw.user_id or _header_text(raw.headers, "agent_id")
    return intent_id, agent if agent and AGENT_ID_PATTERN.match(agent) else None


def vouched_identity(raw: RawMessage, fleet_user: str | None) -> str | None:
    """The identity the broker vouches for: ``user_id``, or the ``x-reach-on-behalf-of`` agent when
    ``user_id`` is the fleet's own login (``fleet_user``)."""
    behalf = _header_text(raw.headers, ON_BEHALF_OF_HEADER)
    if behalf is not None and fleet_user is not None and raw.user_id == fleet_user:
        return behalf
    return raw.user_id or None


def parse(
    raw: RawMessage,
    max_bytes: int,
    require_user_id: bool = False,
    max_depth: int = DEFAULT_MAX_DEPTH,
    fleet_user: str | None = None,
) -> ParsedIntent | ParseFailure:
    """Decode, detect the format, fix identity and ids, and type-check the intent.

    ``require_user_id`` (REACH_REQUIRE_USER_ID): only the broker-validated AMQP user_id counts
    as identity; an intent without one is refused. Size and nesting are checked before anything
    recursive reads the body; params may nest ``max_depth`` levels. ``fleet_user``: the fleet's
    own broker login, the only one whose ``x-reach-on-behalf-of`` header names the identity.
    """
    intake = _Intake(raw, require_user_id, fleet_user)
    refused = intake.check_envelope(max_bytes)
    if refused is not None:
        return refused
    decoded = intake.decode(max_depth)
    if isinstance(decoded, ParseFailure):
        return decoded
    document, shape = decoded
    settled = intake.with_identity(document)
    if isinstance(settled, ParseFailure):
        return settled
    return intake.typed(settled, shape)


class _Intake:
    """One message on its way to an intent. Every step returns a ``ParseFailure`` that names the
    best identity known so far, so whoever can be told gets the receipt."""

    def __init__(self, raw: RawMessage, require_user_id: bool, fleet_user: str | None = None) -> None:
        self.raw = raw
        self.require_user_id = require_user_id
        self.user_id = vouched_identity(raw, fleet_user)
        # the header from anyone but the fleet's login: a claim to act for another agent
        self.forged_behalf = ON_BEHALF_OF_HEADER in raw.headers and (fleet_user is None or raw.user_id != fleet_user)
        # a workflow run's step: only from the fleet's login, acting for the run's owner (the
        # router then checks the run: workers.router.workflow_starts)
        run_header = _header_text(raw.headers, RUN_ID_HEADER)
        delegated = not self.forged_behalf and _header_text(raw.headers, ON_BEHALF_OF_HEADER) is not None
        well_formed = run_header is not None and INTENT_ID_PATTERN.match(run_header) is not None
        self.forged_run = RUN_ID_HEADER in raw.headers and not (delegated and well_formed)
        self.run_id = run_header if RUN_ID_HEADER in raw.headers and not self.forged_run else None
        header_agent = _header_text(raw.headers, "agent_id")
        self.header_agent = header_agent if header_agent is not None and AGENT_ID_PATTERN.match(header_agent) else None
        message_id = raw.message_id
        self.intent_id = message_id if message_id and INTENT_ID_PATTERN.match(message_id) else uuid.uuid4().hex
        self.agent = self.trusted(self.header_agent)
        self.reply_to: str | None = None

    def trusted(self, *claims: str | None) -> str | None:
        """Who may be told: in production mode only the broker-validated login (anything else
        could push receipts into another agent's stream), else the login or the first claim."""
        if self.require_user_id:
            return self.user_id
        return self.user_id or next((c for c in claims if c), None)

    def fail(
        self,
        reason: str,
        *,
        agent: str | None | bool = True,
        details: list[dict[str, Any]] | None = None,
        code: ErrorCode = ErrorCode.INVALID_INTENT,
        dead_letter: bool = True,
    ) -> ParseFailure:
        """``agent`` True: the best identity known so far."""
        who = self.agent if agent is True else (agent or None)
        reply_to = self.reply_to
        usable = reply_to is not None and (
            (who is not None and usable_reply_to(who, reply_to))
            or (self.run_id is not None and reply_to == WORKFLOW_REPLY_KEY)
        )
        route = reply_to if usable else who
        return ParseFailure(reason, self.intent_id, who, route, details or [], code, dead_letter)

    def check_envelope(self, max_bytes: int) -> ParseFailure | None:
        """What can be judged without reading the body: the login's name, the properties, the size."""
        if self.user_id is not None and not AGENT_ID_PATTERN.match(self.user_id):
            return self.fail(
                f"the broker login {self.user_id[:64]!r} is not a valid agent name (lowercase letters, digits and _)",
                agent=None,
                code=ErrorCode.PERMISSION_DENIED,
            )
        if self.forged_behalf:
            return self.fail(
                f"only the fleet's own broker login may send the {ON_BEHALF_OF_HEADER} header",
                code=ErrorCode.PERMISSION_DENIED,
                dead_letter=False,
            )
        if self.forged_run:
            return self.fail(
                f"only the fleet's own broker login, sending for an agent, may send the {RUN_ID_HEADER} header",
                code=ErrorCode.PERMISSION_DENIED,
                dead_letter=False,
            )
        if self.raw.unreadable is not None:
            # the headers are gone (the agent_id header too): only the broker's user_id can be told
            return self.fail(f"unreadable AMQP properties: {self.raw.unreadable}", agent=self.user_id)
        if self.raw.size > max_bytes:
            return self.fail(f"the intent is {self.raw.size} bytes; the limit is {max_bytes} bytes")
        return None

    def decode(self, max_depth: int) -> tuple[dict[str, Any], str] | ParseFailure:
        """Strict JSON within the depth limit, any accepted shape, as a native intent document."""
        try:
            normalized = normalize(loads_strict(self.raw.body, max_depth + ENVELOPE_DEPTH))
        except TooDeep as exc:
            # the message cannot be parsed, but its sender can be told: the same claims, found cheaply
            text = self.raw.body.decode("utf-8", "replace")
            claimed_id = top_level_string(text, "intent_id")
            if claimed_id and INTENT_ID_PATTERN.match(claimed_id):
                self.intent_id = claimed_id
            return self.fail(
                f"the intent nests {exc.depth} levels deep; params may nest at most {max_depth} levels: flatten them",
                agent=self.trusted(_valid_agent(top_level_string(text, "agent_id")), self.header_agent),
            )
        except FormatError as exc:
            return self.fail(str(exc))
        doc = dict(normalized.intent)
        # best-effort identity from the body, for the receipt of an intent that fails below
        body_intent = doc.get("intent_id")
        if isinstance(body_intent, str) and INTENT_ID_PATTERN.match(body_intent):
            self.intent_id = body_intent
        self.agent = self.trusted(_valid_agent(text_or_none(doc.get("agent_id"))), self.header_agent)
        self.reply_to = text_or_none(doc.get("reply_to"))
        if (depth := value_depth(doc.get("params"))) > max_depth:
            return self.fail(f"params nest {depth} levels deep; at most {max_depth} are accepted: flatten them")
        return doc, normalized.format

    def with_identity(self, doc: dict[str, Any]) -> dict[str, Any] | ParseFailure:
        """The document with its agent, intent id and traceparent settled."""
        user_id, header_agent = self.user_id, self.header_agent
        if user_id is not None:
            # the broker vouches for user_id; anything claiming otherwise is refused, and the
            # receipt goes to the authenticated agent, never to the claimed one
            if doc.get("agent_id") not in (None, user_id):
                self.reply_to = None
                return self.fail(
                    f"agent_id {str(doc.get('agent_id'))[:128]!r} does not match the authenticated user {user_id!r}",
                    agent=user_id,
                    code=ErrorCode.PERMISSION_DENIED,
                    dead_letter=False,
                )
            doc["agent_id"] = user_id
        elif self.require_user_id:
            # nobody the broker vouched for can be told: kept for operators in the dead-letter queue
            return self.fail(
                "this fleet accepts intents only with the AMQP user_id property set to your broker login",
                agent=None,
                code=ErrorCode.PERMISSION_DENIED,
            )
        elif doc.get("agent_id") is None and header_agent is not None:
            doc["agent_id"] = header_agent
        elif header_agent is not None and doc.get("agent_id") != header_agent:
            return self.fail("the agent_id header and the agent_id field disagree", agent=None)
        if doc.get("intent_id") is None:
            doc["intent_id"] = self.intent_id
        header_trace = _header_text(self.raw.headers, "traceparent")
        if doc.get("traceparent") is None and header_trace is not None:
            doc["traceparent"] = header_trace[:128]
        return doc

    def typed(self, doc: dict[str, Any], shape: str) -> ParsedIntent | ParseFailure:
        """The contract's types and the rules that need the whole intent (identity, reply_to)."""
        try:
            intent = Intent.model_validate(doc)
        except ValidationError as exc:
            details = [
                {"field": ".".join(str(p) for p in e["loc"]) or "(intent)", "code": e["type"], "message": e["msg"]}
                for e in exc.errors(include_url=False, include_input=False)
            ][:20]
            summary = "; ".join(f"{d['field']}: {d['message']}" for d in details[:5])
            return self.fail(f"the intent does not match the contract: {summary}", details=details)
        self.reply_to = None
        if intent.agent_id is None:
            return self.fail("no agent identity: set agent_id in the intent or the agent_id header", agent=None)
        runner_reply = self.run_id is not None and intent.reply_to == WORKFLOW_REPLY_KEY
        if intent.reply_to is not None and not runner_reply and not reply_allowed(intent.agent_id, intent.reply_to):
            return self.fail(
                f"reply_to {intent.reply_to!r} is not yours: use {intent.agent_id!r} or {intent.agent_id!r} + '.<suffix>'",
                agent=intent.agent_id,
            )
        trace_id, traceparent = trace_from(intent.traceparent)
        return ParsedIntent(intent, shape, trace_id, traceparent, self.run_id)
