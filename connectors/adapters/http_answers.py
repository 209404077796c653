"""What the HTTP-based adapters (http, soap) share about an exchange's answer, or its failure: the
status -> reach code table and its suggestions, Retry-After, the bounded read of a body, the
outcome of a failed exchange, and the checks of a successful one against the declared output.

This is the one place that turns httpx's exceptions, the auth's and HTTP statuses into reach error
codes (the boundary translation of httpx's own ``map_httpcore_exceptions``); nothing above the
adapters looks at status codes or exception strings.
"""

from __future__ import annotations

import time
from typing import Any

import httpx

from connectors.adapters.auth import CredentialsUnavailable, TokenError, tls_refusal
from connectors.adapters.base import Outcome
from connectors.adapters.common import check_output
from connectors.adapters.errors import violation_suggestion
from connectors.schema import Check
from connectors.spec import ActionSpec, ConnectorSpec
from producers.wire import ErrorCode

SUGGESTIONS = {
    ErrorCode.DOWNSTREAM_VALIDATION_FAILED: "The system rejected the params; fix them as its message says and send again.",
    ErrorCode.DOWNSTREAM_AUTH_FAILED: "The connector's credentials were refused; do not retry. Tell an operator.",
    ErrorCode.DOWNSTREAM_NOT_FOUND: "The record does not exist; check the id (for example with a search or list action).",
    ErrorCode.DOWNSTREAM_CONFLICT: "The record changed or already exists; read its current state before trying again.",
    ErrorCode.DOWNSTREAM_RATE_LIMITED: "The system is throttling requests; wait retry_after_ms (or a few seconds) and send again.",
    ErrorCode.DOWNSTREAM_ERROR: "The system failed; retry later.",
    ErrorCode.DOWNSTREAM_CONTRACT_VIOLATION: "The system answered in an unexpected way; tell an operator.",
}
TLS_REFUSED = "The connector's client certificate is missing or not accepted; do not retry. Tell an operator."
UNCHECKABLE = "The answer cannot be checked against the declared output; tell an operator."
RETRY_AFTER_STATUSES = (429, 503)


def default_suggestion(code: ErrorCode) -> str:
    return SUGGESTIONS.get(code, "See the error message.")


def status_code(status: int) -> ErrorCode:
    """The reach code for an HTTP status that is not a success."""
    if status in (400, 422):
        return ErrorCode.DOWNSTREAM_VALIDATION_FAILED
    if status in (401, 403):
        return ErrorCode.DOWNSTREAM_AUTH_FAILED
    if status in (404, 410):
        return ErrorCode.DOWNSTREAM_NOT_FOUND
    if status == 409:
        return ErrorCode.DOWNSTREAM_CONFLICT
    if status == 429:
        return ErrorCode.DOWNSTREAM_RATE_LIMITED
    if status >= 500:
        return ErrorCode.DOWNSTREAM_ERROR
    if 400 <= status < 500:
        return ErrorCode.DOWNSTREAM_VALIDATION_FAILED
    return ErrorCode.DOWNSTREAM_CONTRACT_VIOLATION  # 1xx/3xx: not an answer we can use


def retry_after_ms(value: str | None) -> int | None:
    """A Retry-After header (seconds or an HTTP date) in milliseconds from now."""
    if not value:
        return None
    try:
        return max(0, int(float(value) * 1000))
    except ValueError:
        from email.utils import parsedate_to_datetime

        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        return max(0, int((when.timestamp() - time.time()) * 1000))


def status_retry_after(status: int, value: str | None) -> int | None:
    """The wait an answer asks for: its Retry-After, read only on 429 and 503."""
    return retry_after_ms(value) if status in RETRY_AFTER_STATUSES else None


class ResponseTooLarge(Exception):
    """The answer's body is past the size limit; the read stopped there."""

    def __init__(self, response: httpx.Response, limit: int) -> None:
        super().__init__(f"the system's answer is larger than {limit} bytes, the limit")
        self.response = response
        length = response.headers.get("Content-Length", "")
        self.declared_bytes = int(length) if length.isascii() and length.isdigit() and len(length) < 20 else None


def read_capped(response: httpx.Response, limit: int, deadline: float) -> bytes:
    """The body up to ``limit`` bytes, read within ``deadline`` (``time.perf_counter``) as a whole:
    httpx's timeouts apply per read, so a system trickling bytes could otherwise hold a thread for ever.

    Raises:
        ResponseTooLarge: the body is longer than ``limit``.
        httpx.ReadTimeout: the deadline passed.
    """
    chunks: list[bytes] = []
    size = 0
    for chunk in response.iter_bytes():
        if time.perf_counter() > deadline:
            raise httpx.ReadTimeout("the response did not complete within the action's timeout")
        size += len(chunk)
        if size > limit:
            raise ResponseTooLarge(response, limit)
        chunks.append(chunk)
    return b"".join(chunks)


def failed(
    code: ErrorCode,
    message: str,
    suggestion: str,
    started: float,
    *,
    sent: bool = True,
    status: int | None = None,
    retry_after_ms: int | None = None,
    details: list[dict[str, Any]] | None = None,
) -> Outcome:
    """A failed attempt that began at ``started`` (``time.perf_counter``)."""
    return Outcome(
        False,
        code=code,
        message=message,
        suggestion=suggestion,
        details=details or [],
        sent=sent,
        http_status=status,
        retry_after_ms=retry_after_ms,
        downstream_ms=(time.perf_counter() - started) * 1000,
    )


def unknown(connector: ConnectorSpec, action: ActionSpec, message: str, started: float) -> Outcome:
    """The request was sent and its outcome is unknown: look before resending."""
    return failed(ErrorCode.OUTCOME_UNKNOWN, message, connector.check_first_suggestion(action.action), started)


def exchange_failure(
    exc: BaseException, connector: ConnectorSpec, action: ActionSpec, timeout: float, started: float
) -> Outcome | None:
    """The outcome of an exchange that got no usable answer: no credentials, the TLS client
    certificate refused, no connection (nothing sent), no answer in time or a broken connection
    (after sending: DOWNSTREAM_TIMEOUT / DOWNSTREAM_ERROR when the action is safe to repeat, else
    OUTCOME_UNKNOWN). None for anything else, which the adapter handles (an
    ``httpx.LocalProtocolError``: the request could not be formed, nothing was sent)."""
    name = connector.name
    if isinstance(exc, TokenError):
        code = ErrorCode.DOWNSTREAM_AUTH_FAILED
        return failed(code, f"could not obtain credentials for {name}: {exc}", SUGGESTIONS[code], started, sent=False)
    if isinstance(exc, CredentialsUnavailable):
        return failed(
            ErrorCode.DOWNSTREAM_UNREACHABLE,
            f"could not obtain credentials for {name}: {exc}",
            "The system's sign-in is unreachable; retry later.",
            started,
            sent=False,
        )
    if not isinstance(exc, (httpx.TransportError, httpx.DecodingError)):
        return None
    # the handshake failed, so the system never read the request (only a connect or read error
    # carries a TLS alert: a timeout or a request refused before writing never does)
    if refused := tls_refusal(exc):
        return failed(ErrorCode.DOWNSTREAM_AUTH_FAILED, f"{name}: {refused}", TLS_REFUSED, started, sent=False)
    if isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)):
        return failed(
            ErrorCode.DOWNSTREAM_UNREACHABLE,
            f"could not connect to {name}: {type(exc).__name__}",
            "The system is unreachable; retry later.",
            started,
            sent=False,
        )
    if isinstance(exc, httpx.LocalProtocolError):
        return None
    safe = connector.safe_to_repeat(action)
    if isinstance(exc, httpx.TimeoutException):
        if safe:
            return failed(
                ErrorCode.DOWNSTREAM_TIMEOUT,
                f"{name} did not answer within {timeout:g}s",
                "Retry later; the action is safe to repeat.",
                started,
            )
        return unknown(
            connector, action, f"{name} did not answer within {timeout:g}s after the request was sent", started
        )
    if safe:
        return failed(
            ErrorCode.DOWNSTREAM_ERROR,
            f"connection to {name} failed: {type(exc).__name__}",
            "Retry later; the action is safe to repeat.",
            started,
        )
    return unknown(
        connector,
        action,
        f"the connection to {name} broke after the request was sent ({type(exc).__name__})",
        started,
    )


def _answered(connector: str, status: int | None) -> str:
    return f"{connector} answered" if status is None else f"{connector} answered {status}"


def checked_success(
    connector: str,
    action: ActionSpec,
    checks: dict[str, Check],
    data: dict[str, Any],
    elapsed_ms: float,
    status: int | None = None,
) -> Outcome:
    """A successful answer's ``data``, checked against the action's declared output."""
    problems = check_output(checks, data)
    if problems:
        return Outcome(
            False,
            code=ErrorCode.DOWNSTREAM_CONTRACT_VIOLATION,
            message=f"{_answered(connector, status)} but the response breaks the declared output",
            suggestion=violation_suggestion(action, "ask an operator to check the connector's output schema."),
            details=problems,
            http_status=status,
            downstream_ms=elapsed_ms,
        )
    return Outcome(True, data=data, http_status=status, downstream_ms=elapsed_ms)


def omitted_success(
    connector: str,
    omitted: dict[str, Any],
    elapsed_ms: float,
    *,
    uncheckable: bool,
    status: int | None = None,
) -> Outcome:
    """A successful answer too large or deep to pass on, with the ``_reach_omitted`` marker as its
    ``data``. A write stays a success (its effect happened, the system said so); ``uncheckable``: a
    read whose declared output now cannot be checked, DOWNSTREAM_CONTRACT_VIOLATION instead."""
    if uncheckable:
        return Outcome(
            False,
            code=ErrorCode.DOWNSTREAM_CONTRACT_VIOLATION,
            message=f"{_answered(connector, status)} but {omitted['_reach_omitted']}",
            suggestion=UNCHECKABLE,
            http_status=status,
            downstream_ms=elapsed_ms,
        )
    return Outcome(True, data=omitted, http_status=status, downstream_ms=elapsed_ms)
