"""Keeping a connector's own credentials out of what its failures say.

A system may echo what it was sent in its error text ("token abc123 is not allowed here"); an
adapter passes a system's message on to the agent, so the credential would reach a receipt. A
:class:`Scrubber` replaces each of the connector's secret values in a failed Outcome's text.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from connectors.adapters.auth.secrets import environment
from connectors.adapters.base import Outcome
from connectors.spec import AuthSpec

MASK = "[redacted]"
MIN_SECRET_CHARS = 4  # shorter values would mask ordinary words
_SECRET_ENV_KEYS = ("token_env", "password_env", "client_secret_env", "refresh_token_env", "key_env", "signing_key_env")


def auth_secrets(auth: AuthSpec, environ: Mapping[str, str] | None) -> list[str]:
    """The values of the secrets ``auth`` names that are set (paths of key files included: harmless)."""
    env = environment(environ)
    names = [getattr(auth, key) for key in _SECRET_ENV_KEYS]
    return [env[name] for name in names if name and env.get(name)]


class Scrubber:
    """Replaces given secret values in failed outcomes."""

    def __init__(self, secrets: Iterable[str]) -> None:
        # longest first: a secret that contains another is masked whole
        self._secrets = sorted({s for s in secrets if len(s) >= MIN_SECRET_CHARS}, key=len, reverse=True)

    def outcome(self, outcome: Outcome) -> Outcome:
        if outcome.ok or not self._secrets:
            return outcome
        return dataclasses.replace(
            outcome,
            message=self.text(outcome.message),
            suggestion=self.text(outcome.suggestion),
            details=self._walk(outcome.details),
            data=self._walk(outcome.data),
        )

    def text(self, value: str) -> str:
        for secret in self._secrets:
            if secret in value:
                value = value.replace(secret, MASK)
        return value

    def _walk(self, value: Any) -> Any:
        # iterative: a failure's data is a system's, bounded in depth by the adapter already
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, list):
            return [self._walk(v) for v in value]
        if isinstance(value, dict):
            return {k: self._walk(v) for k, v in value.items()}
        return value
