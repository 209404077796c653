"""What an auth raises during a call, before the request is sent, and the hold on a refusal.

::

    CredentialsError            the auth could not produce credentials (nothing reached the system)
    ├── TokenError              the credentials were refused (wrong secret, burned refresh
    │                           token, login refused): DOWNSTREAM_AUTH_FAILED, not retried
    └── CredentialsUnavailable  the login page, token endpoint or shared token store did not
                                answer: DOWNSTREAM_UNREACHABLE, retried
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

AUTH_TIMEOUT = 10.0  # seconds for a login or token request, and to wait for another process's refresh
REFUSAL_HOLD = 30.0  # seconds a refused login or refresh token is not tried again (account lockouts)


class CredentialsError(RuntimeError):
    """The auth could not produce credentials for a call; the request was not sent."""


class TokenError(CredentialsError):
    """The token endpoint or login page refused the credentials, or answered something that is not a token."""


class CredentialsUnavailable(CredentialsError):
    """The login page, token endpoint or shared token store did not answer (try again later)."""


class Refusals:
    """The last refusal, repeated without asking again for ``REFUSAL_HOLD`` seconds: a pool's
    threads must not hammer a login page with a wrong password (systems lock such accounts), nor
    present a burned refresh token over and over. Used under its auth's lock."""

    def __init__(self) -> None:
        self._last: tuple[float, str] | None = None

    def check(self) -> None:
        if self._last is not None and time.monotonic() - self._last[0] < REFUSAL_HOLD:
            raise TokenError(self._last[1])

    @contextmanager
    def remembered(self) -> Iterator[None]:
        try:
            yield
        except TokenError as exc:
            self._last = (time.monotonic(), str(exc))
            raise
        self._last = None
