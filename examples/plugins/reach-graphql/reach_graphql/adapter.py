"""The GraphQL adapter: one action -> one POST of ``{"query", "variables"}`` -> one Outcome.

Every failure is an Outcome at this boundary (the fleet's pool retries, never this adapter):

    connection refused / DNS / TLS before sending   DOWNSTREAM_UNREACHABLE   sent False
    no answer in time                               DOWNSTREAM_TIMEOUT if the action is safe to repeat,
                                                    else OUTCOME_UNKNOWN (a mutation may have run)
    HTTP 401/403, 429, other non-2xx                AUTH_FAILED, RATE_LIMITED, DOWNSTREAM_ERROR
    ``errors`` in the answer                        by the first error's ``extensions.code``
    answer over max_response_bytes, nested deeper   DOWNSTREAM_CONTRACT_VIOLATION (never parsed)
    than max_depth, not JSON, no result field

A system's error text is passed on with the connector's token replaced, so a server that echoes
the credential cannot put it in a receipt.
"""

from __future__ import annotations

import json
import time
from typing import Any

import httpx

from connectors.adapters.base import AdapterOptions, CallContext, Outcome, ProbeResult
from connectors.spec import ActionSpec, ConnectorSpec
from producers.wire import ErrorCode
from reach_graphql.plugin import GraphqlAction, GraphqlConnector

MAX_MESSAGE = 300
_BY_EXTENSION = {
    "UNAUTHENTICATED": ErrorCode.DOWNSTREAM_AUTH_FAILED,
    "FORBIDDEN": ErrorCode.DOWNSTREAM_AUTH_FAILED,
    "BAD_USER_INPUT": ErrorCode.DOWNSTREAM_VALIDATION_FAILED,
    "GRAPHQL_VALIDATION_FAILED": ErrorCode.DOWNSTREAM_VALIDATION_FAILED,
    "NOT_FOUND": ErrorCode.DOWNSTREAM_NOT_FOUND,
    "CONFLICT": ErrorCode.DOWNSTREAM_CONFLICT,
}


class TooLarge(Exception):
    pass


def depth_past(raw: bytes, limit: int) -> bool:
    """Whether the JSON text ``raw`` nests deeper than ``limit`` (a scan, no recursion, no parse)."""
    level, in_string, escaped = 0, False, False
    for byte in raw:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x7B, 0x5B):
            level += 1
            if level > limit:
                return True
        elif byte in (0x7D, 0x5D):
            level -= 1
    return False


class GraphqlAdapter:
    """One connector's GraphQL endpoint; one httpx client shared by the pool's threads."""

    def __init__(self, connector: ConnectorSpec, config: GraphqlConnector | None, options: AdapterOptions) -> None:
        if connector.endpoint is None:
            raise ValueError(f"connector {connector.name}: a graphql connector needs `endpoint`")
        self.connector = connector
        self.config = config or GraphqlConnector()
        self.max_depth = options.max_depth or 32
        environ = options.environ
        if environ is None:
            import os

            environ = os.environ
        self.token: str | None = None
        if self.config.token_env:
            self.token = environ.get(self.config.token_env) or None
            if self.token is None:
                raise ValueError(f"connector {connector.name}: {self.config.token_env} is not set")
        # each action's operation, checked once (the fleet checked it against GraphqlAction already)
        self.actions = {a.action: GraphqlAction.model_validate(a.config or {}) for a in connector.actions}
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        self.client = httpx.Client(
            headers=headers,
            follow_redirects=False,
            trust_env=False,
            limits=httpx.Limits(
                max_connections=options.max_connections, max_keepalive_connections=options.max_connections
            ),
        )

    def call(self, action: ActionSpec, params: dict[str, Any], ctx: CallContext) -> Outcome:
        """One attempt. Never raises for anything the system or the network does."""
        operation = self.actions.get(action.action)
        if operation is None:
            return Outcome(
                False, code=ErrorCode.VALIDATION_FAILED, message=f"no operation for {action.action}", sent=False
            )
        timeout = ctx.timeout if ctx.timeout is not None else action.timeout_seconds
        headers = {}
        if self.connector.idempotency_header and ctx.idempotency_key:
            headers[self.connector.idempotency_header] = ctx.idempotency_key
        if ctx.traceparent:
            headers["traceparent"] = ctx.traceparent
        started = time.perf_counter()
        try:
            body = json.dumps({"query": operation.query, "variables": params}, ensure_ascii=False)
        except (TypeError, ValueError) as exc:
            return Outcome(False, code=ErrorCode.VALIDATION_FAILED, message=f"params cannot be sent: {exc}", sent=False)
        try:
            with self.client.stream(
                "POST",
                self.connector.endpoint or "",
                content=body.encode("utf-8", "surrogatepass"),
                headers={"Content-Type": "application/json", **headers},
                timeout=httpx.Timeout(timeout, connect=min(timeout, 5.0)),
            ) as response:
                raw = self._read(response, started + timeout)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            return self._failed(ErrorCode.DOWNSTREAM_UNREACHABLE, f"{type(exc).__name__}", started, sent=False)
        except (httpx.TimeoutException, TimeoutError):
            code = ErrorCode.DOWNSTREAM_TIMEOUT if self.connector.safe_to_repeat(action) else ErrorCode.OUTCOME_UNKNOWN
            return self._failed(code, f"no answer within {timeout:g} s", started)
        except TooLarge:
            return self._failed(ErrorCode.DOWNSTREAM_CONTRACT_VIOLATION, "the answer is too large", started)
        except httpx.HTTPError as exc:  # the connection broke after sending: the call may have run
            code = ErrorCode.DOWNSTREAM_ERROR if self.connector.safe_to_repeat(action) else ErrorCode.OUTCOME_UNKNOWN
            return self._failed(code, f"the exchange broke: {type(exc).__name__}", started)
        return self._answer(response.status_code, raw, operation, started)

    def _read(self, response: httpx.Response, deadline: float) -> bytes:
        chunks, size = [], 0
        for chunk in response.iter_bytes():
            size += len(chunk)
            if size > self.config.max_response_bytes:
                raise TooLarge()
            if time.perf_counter() > deadline:
                raise TimeoutError()
            chunks.append(chunk)
        return b"".join(chunks)

    def _answer(self, status: int, raw: bytes, operation: GraphqlAction, started: float) -> Outcome:
        if status in (401, 403):
            return self._failed(ErrorCode.DOWNSTREAM_AUTH_FAILED, f"HTTP {status}", started, status=status)
        if status == 429:
            return self._failed(ErrorCode.DOWNSTREAM_RATE_LIMITED, "HTTP 429", started, status=status)
        if depth_past(raw, self.max_depth + 3):  # {"data": {"field": ...}} wraps the result
            return self._failed(ErrorCode.DOWNSTREAM_CONTRACT_VIOLATION, "the answer is nested too deeply", started)
        try:
            doc = json.loads(raw)
        except ValueError:
            code = ErrorCode.DOWNSTREAM_ERROR if status >= 500 else ErrorCode.DOWNSTREAM_CONTRACT_VIOLATION
            return self._failed(code, f"HTTP {status}: the answer is not JSON", started, status=status)
        errors = doc.get("errors") if isinstance(doc, dict) else None
        if isinstance(errors, list) and errors:
            first = errors[0] if isinstance(errors[0], dict) else {}
            found = first.get("extensions")
            extensions: dict[str, Any] = found if isinstance(found, dict) else {}
            code = _BY_EXTENSION.get(str(extensions.get("code", "")), ErrorCode.DOWNSTREAM_ERROR)
            return self._failed(code, str(first.get("message", "the system answered an error")), started, status=status)
        if status >= 300:
            return self._failed(ErrorCode.DOWNSTREAM_ERROR, f"HTTP {status}", started, status=status)
        data = doc.get("data") if isinstance(doc, dict) else None
        if not isinstance(data, dict) or operation.result not in data:
            return self._failed(
                ErrorCode.DOWNSTREAM_CONTRACT_VIOLATION, f"the answer has no data.{operation.result}", started
            )
        result = data[operation.result]
        return Outcome(
            True,
            data=result if isinstance(result, dict) else {"result": result},
            http_status=status,
            downstream_ms=(time.perf_counter() - started) * 1000,
        )

    def _failed(
        self, code: ErrorCode, message: str, started: float, *, sent: bool = True, status: int | None = None
    ) -> Outcome:
        text = message.replace(self.token, "[redacted]") if self.token else message
        text = text[:MAX_MESSAGE]  # cut after redacting: a cut could leave part of the token
        return Outcome(
            False,
            code=code,
            message=f"{self.connector.name}: {text}",
            suggestion="Retry later." if code.retryable else "Check the params and the system's state.",
            sent=sent,
            http_status=status,
            downstream_ms=(time.perf_counter() - started) * 1000,
        )

    def probe(self, timeout: float) -> ProbeResult:
        """The endpoint answers ``{ __typename }``."""
        try:
            response = self.client.post(
                self.connector.endpoint or "", json={"query": "{ __typename }"}, timeout=timeout
            )
        except httpx.HTTPError as exc:
            return ProbeResult(False, type(exc).__name__)
        return ProbeResult(response.status_code == 200, f"HTTP {response.status_code}")

    def close(self) -> None:
        self.client.close()
