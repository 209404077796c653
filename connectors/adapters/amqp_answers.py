"""What an answer message (or its absence) means for an AMQP-based adapter: its JSON read within
bounds, an error it reports checked against the agreed shape, the declared output checked, and the
outcome of a request that got no answer. Shared by the amqp and agent adapters."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from connectors.adapters.amqp_rpc import Lost, NoAnswer, NotSent
from connectors.adapters.base import Outcome
from connectors.adapters.errors import violation_suggestion
from connectors.adapters.json_nesting import json_depth
from connectors.schema import Check, FieldProblem, Problems
from connectors.spec import ActionSpec, ConnectorSpec
from producers.serve import AnswerError
from producers.wire import ErrorCode


class BadAnswer(ValueError):
    """An answer that cannot be read: too large, too deep, not JSON, or not the agreed shape."""


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def parse_answer(body: bytes, max_bytes: int, max_depth: int) -> Any:
    """The JSON value of an answer's body, within bounds checked before any parsing. Raises BadAnswer."""
    if len(body) > max_bytes:
        raise BadAnswer(f"the answer is {len(body)} bytes; the limit is {max_bytes}")
    depth = json_depth(body)
    if depth > max_depth:
        raise BadAnswer(f"the answer nests {depth} levels; the limit is {max_depth}")
    try:
        return json.loads(body.decode("utf-8-sig"), parse_constant=_no_constants)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise BadAnswer(f"the answer is not UTF-8 JSON: {str(exc)[:200]}") from exc


def answer_error(doc: Any) -> AnswerError:
    """An error reported in an answer, checked against the agreed shape. Raises BadAnswer."""
    try:
        return AnswerError.model_validate(doc)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '(error)'}: {e['msg']}"
            for e in exc.errors(include_url=False, include_input=False)[:5]
        )
        raise BadAnswer(f"the answer's error is malformed: {problems}") from exc


def error_outcome(error: AnswerError, elapsed_ms: float) -> Outcome:
    return Outcome(
        False,
        code=ErrorCode(error.code),
        message=error.message,
        suggestion=error.suggestion or _SUGGESTIONS.get(ErrorCode(error.code), "See the error message."),
        details=list(error.details),
        retry_after_ms=error.retry_after_ms,
        downstream_ms=elapsed_ms,
    )


def output_problems(checks: Mapping[str, Check], data: dict[str, Any]) -> list[dict[str, Any]]:
    """What ``data`` breaks of the declared output, as receipt details (bounded)."""
    problems = Problems()
    for name, check in checks.items():
        if name not in data:
            problems.append(FieldProblem(name, "required", "is missing from the answer"))
            continue
        check(data[name], name, problems)
    return [p.to_detail() for p in problems]


def success_outcome(
    connector: str, action: ActionSpec, checks: Mapping[str, Check], value: Any, elapsed_ms: float
) -> Outcome:
    """An answer's value as ``data`` (an object as it is, anything else as ``{"result": value}``),
    checked against the declared output."""
    data = value if isinstance(value, dict) else {"result": value}
    problems = output_problems(checks, data)
    if problems:
        return Outcome(
            False,
            code=ErrorCode.DOWNSTREAM_CONTRACT_VIOLATION,
            message=f"{connector} answered, but the answer breaks the declared output",
            suggestion=violation_suggestion(action, "ask an operator to check the connector's output schema."),
            details=problems,
            downstream_ms=elapsed_ms,
        )
    return Outcome(True, data=data, downstream_ms=elapsed_ms)


def violation(connector: str, action: ActionSpec, reason: str, elapsed_ms: float) -> Outcome:
    return Outcome(
        False,
        code=ErrorCode.DOWNSTREAM_CONTRACT_VIOLATION,
        message=f"{connector} answered in a way that breaks the agreed answer format: {reason}",
        suggestion=violation_suggestion(action, "tell an operator (the answer cannot be read)."),
        downstream_ms=elapsed_ms,
    )


def failure_outcome(
    exc: NotSent | Lost | NoAnswer, connector: ConnectorSpec, action: ActionSpec, timeout: float, elapsed_ms: float
) -> Outcome:
    """What a request that got no answer means: never sent, lost in flight, or unanswered."""
    name = connector.name
    if isinstance(exc, NotSent):
        return Outcome(
            False,
            code=ErrorCode.DOWNSTREAM_UNREACHABLE,
            message=f"{name} could not be reached: {exc}",
            suggestion="The system is unreachable; retry later.",
            sent=False,
            downstream_ms=elapsed_ms,
        )
    safe = connector.safe_to_repeat(action)
    if isinstance(exc, Lost):
        if safe:
            return Outcome(
                False,
                code=ErrorCode.DOWNSTREAM_ERROR,
                message=f"the request to {name} was sent but {exc}",
                suggestion="Retry later; the action is safe to repeat.",
                downstream_ms=elapsed_ms,
            )
        message = f"the request to {name} was sent but {exc}"
    else:
        if safe:
            return Outcome(
                False,
                code=ErrorCode.DOWNSTREAM_TIMEOUT,
                message=f"{name} did not answer within {timeout:g}s{_why(exc)}",
                suggestion="Retry later; the action is safe to repeat.",
                downstream_ms=elapsed_ms,
            )
        message = f"{name} did not answer within {timeout:g}s after the request was sent{_why(exc)}"
    return Outcome(
        False,
        code=ErrorCode.OUTCOME_UNKNOWN,
        message=message,
        suggestion=connector.check_first_suggestion(action.action),
        downstream_ms=elapsed_ms,
    )


_SUGGESTIONS = {
    ErrorCode.DOWNSTREAM_VALIDATION_FAILED: "The system rejected the params; fix them as its message says and send again.",
    ErrorCode.DOWNSTREAM_AUTH_FAILED: "The system refused the request as unauthorised; do not retry. Tell an operator.",
    ErrorCode.DOWNSTREAM_NOT_FOUND: "The record does not exist; check the id (for example with a search or list action).",
    ErrorCode.DOWNSTREAM_CONFLICT: "The record changed or already exists; read its current state before trying again.",
    ErrorCode.DOWNSTREAM_RATE_LIMITED: "The system is throttling requests; wait retry_after_ms (or a few seconds) and send again.",
    ErrorCode.DOWNSTREAM_ERROR: "The system failed; retry later.",
}


def _why(exc: Exception) -> str:
    return f" ({exc})" if str(exc) else ""
