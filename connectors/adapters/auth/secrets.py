"""The secrets a connector's spec names: environment variables read when its adapter is built.

The one place in connectors/adapters that reads the process environment (the variables are catalog
data, not fleet settings); every reader takes an ``environ`` to read instead, so tests inject theirs.
"""

from __future__ import annotations

import os
from collections.abc import Mapping


class MissingSecret(RuntimeError):
    """A connector's auth names an environment variable that is not set (or a file or key that cannot be used)."""


def environment(environ: Mapping[str, str] | None) -> Mapping[str, str]:
    """``environ``, or the process environment (read now, never at import) when it is None."""
    return os.environ if environ is None else environ


def secret(environ: Mapping[str, str], var: str | None, connector: str) -> str:
    """The value of ``var`` in ``environ``; raises MissingSecret when it is unset or empty."""
    value = environ.get(var or "")
    if not value:
        raise MissingSecret(f"connector {connector}: auth needs the environment variable {var}, which is not set")
    return value


def read_secret(var: str | None, connector: str, environ: Mapping[str, str] | None = None) -> str:
    """The value of the environment variable a connector names (``dsn_env``, ``url_env``, ...);
    raises MissingSecret when it is not set. Every adapter reads its secrets through here."""
    return secret(environment(environ), var, connector)
