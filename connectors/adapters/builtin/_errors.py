"""The failures the built-in adapters share, named as a manifest's ``errors`` names them."""

from __future__ import annotations

from producers.wire import ErrorCode

SHARED_ERRORS: dict[str, ErrorCode] = {
    "params the client cannot send (refused before sending)": ErrorCode.VALIDATION_FAILED,
    "no connection to the system (nothing sent)": ErrorCode.DOWNSTREAM_UNREACHABLE,
    "no answer in time, repeating is safe": ErrorCode.DOWNSTREAM_TIMEOUT,
    "no answer in time to a call that may have landed": ErrorCode.OUTCOME_UNKNOWN,
    "the system failed (server side)": ErrorCode.DOWNSTREAM_ERROR,
    "the system refused the params": ErrorCode.DOWNSTREAM_VALIDATION_FAILED,
    "an answer that breaks the declared output or cannot be read": ErrorCode.DOWNSTREAM_CONTRACT_VIOLATION,
    "the adapter failed": ErrorCode.INTERNAL,
}
