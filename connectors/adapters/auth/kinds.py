"""The auth ``type`` of a connector's spec -> the httpx auth its HTTP-based adapter sends with."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx

from connectors.adapters.auth.form_login import FormLoginAuth
from connectors.adapters.auth.jwt_signing import JwtAuth, signing_key
from connectors.adapters.auth.oauth2 import ClientCredentialsAuth, RefreshTokenAuth
from connectors.adapters.auth.secrets import environment, secret
from connectors.adapters.auth.static import StaticAuth
from connectors.adapters.auth.tls import ssl_context
from connectors.adapters.auth.token_store import MemoryTokens, RedisTokens
from connectors.spec import AuthSpec


def build_auth(
    spec: AuthSpec, connector: str, environ: Mapping[str, str] | None = None, *, redis: Any = None
) -> httpx.Auth | None:
    """The httpx auth for a connector, or None for ``type: none`` and ``mtls``.

    The variables are the ones the spec names (catalog data, not fleet settings), read from
    ``environ`` (default: the process environment, read now, never at import). ``redis``: where an
    ``oauth2_refresh_token`` connector's rotating tokens are shared by its processes (None: kept in
    this process's memory).

    Raises:
        MissingSecret: a named environment variable is not set, or a jwt key cannot be used.
    """
    env = environment(environ)
    if spec.type in ("none", "mtls"):  # mtls is in the TLS context (ssl_context), not a header
        return None
    if spec.type == "api_key":
        value = secret(env, spec.key_env, connector)
        assert spec.name is not None
        if spec.in_ == "query":
            return StaticAuth({}, {spec.name: value})
        return StaticAuth({spec.name: value}, {})
    if spec.type == "bearer":
        return StaticAuth({"Authorization": f"Bearer {secret(env, spec.token_env, connector)}"}, {})
    if spec.type == "basic":
        return httpx.BasicAuth(secret(env, spec.username_env, connector), secret(env, spec.password_env, connector))
    if spec.type == "form_login":
        assert spec.login_url is not None
        form = {
            spec.username_field: secret(env, spec.username_env, connector),
            spec.password_field: secret(env, spec.password_env, connector),
        }
        return FormLoginAuth(spec.login_url, form, ssl_context(spec, connector, env))
    if spec.type == "jwt":
        assert spec.audience is not None
        key = signing_key(spec, connector, env)
        return JwtAuth(connector, key, spec.algorithm, spec.issuer, spec.audience, spec.ttl)
    assert spec.token_url is not None
    if spec.type == "oauth2_refresh_token":
        first = secret(env, spec.refresh_token_env, connector)
        return RefreshTokenAuth(
            spec.token_url,
            secret(env, spec.client_id_env, connector),
            secret(env, spec.client_secret_env, connector) if spec.client_secret_env else None,
            first,
            spec.scope,
            ssl_context(spec, connector, env),
            MemoryTokens() if redis is None else RedisTokens(redis, connector, first),
        )
    return ClientCredentialsAuth(
        spec.token_url,
        secret(env, spec.client_id_env, connector),
        secret(env, spec.client_secret_env, connector),
        spec.scope,
    )
