"""What a handler sees and raises: the :class:`Request` beside its params (with ``request.call``
to send intents while handling it), and :class:`AgentError` for a failure a model can act on."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from producers.client import ReachClient
from producers.serve.contract import MAX_ANSWER_DETAILS, MAX_MESSAGE_CHARS, MAX_SUGGESTION_CHARS, AnswerError
from producers.wire import ErrorCode, Receipt


class Serving(Protocol):
    """What a request needs from the server that handed it out (an AgentServer)."""

    def client(self) -> ReachClient:
        """This handler thread's client."""
        ...


class AgentError(Exception):
    """Raised by a handler: the request failed, for the reason a model can act on.

    Args:
        code: One of :data:`ANSWER_CODES`, e.g. ``"DOWNSTREAM_NOT_FOUND"``.
        message: What went wrong, in words a model can use.
        suggestion: What to do next.
        retry_after_ms: With ``DOWNSTREAM_RATE_LIMITED``: when to try again.
    """

    def __init__(
        self,
        code: str | ErrorCode,
        message: str,
        suggestion: str = "",
        *,
        details: list[dict[str, Any]] | None = None,
        retry_after_ms: int | None = None,
    ) -> None:
        super().__init__(message)
        # checked here, so a handler's typo fails in the handler's own traceback
        self.error = AnswerError(
            code=str(code),
            message=message[:MAX_MESSAGE_CHARS] or "failed",
            suggestion=suggestion[:MAX_SUGGESTION_CHARS],
            details=(details or [])[:MAX_ANSWER_DETAILS],
            retry_after_ms=retry_after_ms,
        )


@dataclass(frozen=True)
class Request:
    """One request as a handler sees it (its params come as the handler's first argument)."""

    intent_id: str
    caller: str  # the agent whose intent this is
    connector: str
    action: str
    hops: int
    idempotency_key: str | None
    deadline: datetime | None
    traceparent: str | None
    redelivered: bool  # the broker delivered it before (the agent died before answering)
    _server: Serving | None = field(default=None, repr=False, compare=False)

    @property
    def seconds_left(self) -> float | None:
        """Until the fleet stops waiting for the answer (None: no deadline was sent)."""
        return None if self.deadline is None else self.deadline.timestamp() - time.time()

    def context(self, **extra: Any) -> dict[str, Any]:
        """The intent ``context`` for intents sent while handling this request: it carries the hop
        count, so the fleet can stop a loop of agents calling each other."""
        return {**extra, "hops": self.hops}

    def call(
        self, action: str, params: dict[str, Any] | None = None, *, timeout: float | None = None, **kw: Any
    ) -> Receipt:
        """Send an intent as this agent while handling the request, and wait for its receipt.

        Args:
            action: As for :meth:`ReachClient.publish`.
            params: The action's inputs.
            timeout: Seconds to wait; default: the time left before this request's deadline.
            **kw: The other keyword arguments of :meth:`ReachClient.publish`; ``context`` gets
                the hop count added, ``traceparent`` defaults to this request's.

        Raises:
            ReceiptTimeout: No receipt in time.
            ReachError: The broker did not accept the intent.
        """
        if self._server is None:
            raise RuntimeError("this request is not being served: send intents with your own ReachClient")
        kw["context"] = self.context(**(kw.get("context") or {}))
        kw.setdefault("traceparent", self.traceparent)
        if timeout is None:
            left = self.seconds_left
            timeout = 30.0 if left is None else max(0.1, left)
        return self._server.client().call(action, params, timeout=timeout, **kw)


Handler = Callable[[dict[str, Any], Request], Any]
