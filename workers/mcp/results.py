"""A receipt as an MCP tool result, written so that the model reading it can correct itself.

- ``isError`` unless the receipt's status is ``succeeded``.
- ``structuredContent`` on success only: the receipt's ``data``. MCP wants a JSON object there
  (protocol versions up to 2025-11-25 refuse anything else), and the HTTP adapter already hands
  every non-object answer on as ``{"result": value}``; any other adapter's non-object ``data``
  (a list, a scalar, null) is wrapped the same way. An action that declares ``output`` always
  has an object: the pool refuses anything else as DOWNSTREAM_CONTRACT_VIOLATION.
- ``content``: one text block. On success the JSON of ``structuredContent`` (MCP asks tools with
  structured results to send it as text too); otherwise the code, whether it may be retried,
  the message, the suggestion and the field details, and for ``unknown`` a plain "outcome
  unknown: the action may or may not have taken effect". A workflow's failed run adds a line per
  step (its status, code, and whether it was undone), so the model knows what still stands.
- ``_meta["agent-reach/receipt"]``: the whole receipt as it came off the wire.

A call that got no receipt says so. When the intent may have been published (a publish that
failed half-way, or no answer within REACH_MCP_WAIT) the outcome is unknown, and the text says
how to learn it without running the action twice: call again with the same
``_meta.idempotency_key`` (the intent id when the caller gave none), which the fleet answers from
its idempotency ledger. A call that waits for a person's approval is no exception: the repeat joins
that same approval (the router never asks a person twice for one key and payload) and, once it is
approved, gets the approved call's outcome. When surely nothing was published, calling again is
safe. A workflow's call is the exception: its run's id is the intent's id, and a call with the same
key is a second run, so the text says not to call again and names the run to look up instead.
Nothing here raises; every case is a result.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import mcp_types as types

from producers.wire import Receipt

RECEIPT_META_KEY = "agent-reach/receipt"
INTENT_META_KEY = "agent-reach/intent_id"
MAX_DETAILS_SHOWN = 20  # the receipt in _meta keeps them all (bounded by REACH_MAX_DETAILS)

# checks a success's data against the tool's outputSchema: None when it conforms, else why not
OutputCheck = Callable[[dict[str, Any]], str | None]


def from_receipt(receipt: Receipt, check_output: OutputCheck | None = None) -> types.CallToolResult:
    """The tool result for a receipt.

    Args:
        receipt: The fleet's one receipt for the intent.
        check_output: The check of the called tool's declared output, if it has one.
    """
    meta = {RECEIPT_META_KEY: receipt.to_doc()}
    if receipt.status != "succeeded":
        return _error(_failure_text(receipt), meta)
    data = receipt.data if isinstance(receipt.data, dict) else {"result": receipt.data}
    problem = check_output(data) if check_output is not None else None
    if problem is not None:
        # the pool checked the declared output already; this only happens when the catalog changed in between
        return _error(
            f"The action succeeded, but its data does not match this tool's output schema ({problem}). "
            f"It took effect: do not call it again for the same purpose. The data is in "
            f"_meta[{RECEIPT_META_KEY!r}]. {_reference(receipt)}",
            meta,
        )
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=json.dumps(data, ensure_ascii=False, separators=(",", ":")))],
        structured_content=data,
        is_error=False,
        _meta=meta,
    )


def refused(code: str, message: str, suggestion: str) -> types.CallToolResult:
    """A call the facade refused before publishing anything (nothing ran; fix it and call again)."""
    return _error(f"{code} (rejected, nothing was sent): {message}\nSuggestion: {suggestion}", {})


def not_sent(why: str) -> types.CallToolResult:
    """A call that surely published nothing (the broker could not be reached or refused the
    facade's connection): calling again is safe."""
    return _error(f"NOT SENT: {why}. Nothing was published, so calling again is safe once that is fixed.", {})


def no_receipt(intent_id: str, idempotency_key: str, tool: str, why: str) -> types.CallToolResult:
    """A call whose outcome the facade cannot tell: the intent may or may not have been published
    or run (broker trouble, or no receipt within REACH_MCP_WAIT)."""
    return _error(
        f"Outcome unknown: {why}. The action may or may not have taken effect. To learn its outcome "
        f"without running it twice, call {tool} again with the same arguments and "
        f'_meta {{"idempotency_key": "{idempotency_key}"}}: the fleet answers a repeated key with '
        f"the first outcome (or CONNECTOR_UNAVAILABLE while it still runs). If it waits for a person's "
        f"approval, that call joins the same approval (no second one is asked for) and gets its outcome "
        f"once decided. A call without that key is a new request. Intent {intent_id}.",
        {INTENT_META_KEY: intent_id},
    )


def no_final_receipt(run_id: str, workflow: str, why: str) -> types.CallToolResult:
    """A workflow's call whose outcome the facade cannot tell: the run may be going on, done or
    never started. Unlike an action's, calling again is no way to learn it: a second call starts
    a second run, whatever its idempotency key."""
    return _error(
        f"Outcome unknown: {why}. The workflow {workflow} may or may not have started; if it did, its run "
        f"{run_id} goes on and undoes its done steps if one fails. Do not call {workflow} again for the same "
        f"purpose: a second call starts a second run. Ask an operator to look the run up "
        f"(reach workflow show {run_id}).",
        {INTENT_META_KEY: run_id},
    )


def _failure_text(receipt: Receipt) -> str:
    error = receipt.error
    if error is None:  # not in the contract; say what we know
        return f"The intent ended {receipt.status} without an error. {_reference(receipt)}"
    retry = "may be retried" if error.retryable else "not retryable"
    if error.retry_after_ms is not None:
        retry += f" after {error.retry_after_ms} ms"
    lines = []
    if receipt.status == "unknown":
        lines.append("Outcome unknown: the action may or may not have taken effect.")
    lines.append(f"{error.code} ({receipt.status}, {retry}): {error.message}")
    if error.suggestion:
        lines.append(f"Suggestion: {error.suggestion}")
    if error.code == "AMBIGUOUS_ACTION":
        lines.extend(_candidate_lines(receipt))
    for detail in [] if error.code == "AMBIGUOUS_ACTION" else error.details[:MAX_DETAILS_SHOWN]:
        allowed = detail.get("allowed")
        also = f" (allowed: {', '.join(map(str, allowed))})" if isinstance(allowed, list) else ""
        lines.append(f"- {detail.get('field')}: {detail.get('message')}{also}")
    if len(error.details) > MAX_DETAILS_SHOWN:
        lines.append(f"- and {len(error.details) - MAX_DETAILS_SHOWN} more (see the receipt)")
    steps = receipt.execution.steps or []
    if steps:
        lines.append("Steps of the run:")
        lines.extend(_step_line(step) for step in steps[:MAX_DETAILS_SHOWN])
    lines.append(_reference(receipt))
    return "\n".join(lines)


def _candidate_lines(receipt: Receipt) -> list[str]:
    """An AMBIGUOUS_ACTION's tier and candidates, best first, as the model reads them: the tool
    to call for each (``connector__action``) and what its system is for."""
    error = receipt.error
    assert error is not None
    routing = receipt.execution.routing or {}
    tier = routing.get("tier")
    lines = [f"Routing tier: '{tier}'." if isinstance(tier, str) else "Candidates:"]
    for detail in error.details[:MAX_DETAILS_SHOWN]:
        tool = str(detail.get("action", "")).replace(".", "__", 1)
        mark = " (suggested)" if detail.get("suggested") is True else ""
        lines.append(f"- {tool}{mark}: {detail.get('description') or detail.get('connector')}")
    return lines


def _step_line(step: dict[str, Any]) -> str:
    """One row of a workflow receipt's ``execution.steps``, as the model reads it."""
    code = f" {step['code']}" if step.get("code") else ""
    undone = ", undone" if step.get("undone") else ""
    return f"- {step.get('step')}: {step.get('status')}{code}{undone}"


def _reference(receipt: Receipt) -> str:
    return f"Intent {receipt.intent_id}, trace {receipt.execution.trace_id}."


def _error(text: str, meta: dict[str, Any]) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=True, _meta=meta or None)
