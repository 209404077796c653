"""``jwt``: a short token signed per call, naming the calling agent and action. The adapter hands
the call's context to the auth flow inside the request (:func:`bind_call`)."""

from __future__ import annotations

import time
from collections.abc import Generator, Mapping
from typing import Any

import httpx
import jwt

from connectors.adapters.auth.errors import TokenError
from connectors.adapters.auth.secrets import MissingSecret, secret
from connectors.adapters.base import CallContext
from connectors.spec import AuthSpec

CALL_EXTENSION = "reach.call"  # request.extensions key of the CallContext (bind_call)


def bind_call(request: httpx.Request, ctx: CallContext) -> None:
    """Hand the call's context (agent, action, intent) to the auth flow: a ``jwt`` names them."""
    request.extensions[CALL_EXTENSION] = ctx


class JwtAuth(httpx.Auth):
    """A short-lived JWT per call: ``sub`` the calling agent, ``scope`` "connector:action",
    ``jti`` the intent id, signed with the connector's key (HS256 secret or RS256 private key).

    A request without a call context (a health probe) goes out without a token."""

    def __init__(self, connector: str, key: Any, algorithm: str, issuer: str, audience: str, ttl: float) -> None:
        self._connector = connector
        self._key = key
        self._algorithm = algorithm
        self._issuer = issuer
        self._audience = audience
        self._ttl = ttl

    def __repr__(self) -> str:
        return f"JwtAuth({self._connector}, {self._algorithm}, <redacted>)"

    def mint(self, ctx: CallContext) -> str:
        if not ctx.agent_id or not ctx.action:
            raise TokenError("a jwt names the calling agent and action, and this call carries neither")
        now = time.time()
        claims = {
            "iss": self._issuer,
            "aud": self._audience,
            "sub": ctx.agent_id,
            "scope": f"{self._connector}:{ctx.action}",
            "iat": int(now),
            "exp": int(now + self._ttl),
            "jti": ctx.intent_id,
        }
        return jwt.encode(claims, self._key, algorithm=self._algorithm)

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        ctx = request.extensions.get(CALL_EXTENSION)
        if isinstance(ctx, CallContext):
            request.headers["Authorization"] = f"Bearer {self.mint(ctx)}"
        yield request


def signing_key(spec: AuthSpec, connector: str, environ: Mapping[str, str]) -> Any:
    """The jwt signing key, checked now so a bad one stops the pool at start, not every call."""
    value = secret(environ, spec.signing_key_env, connector)
    if spec.algorithm == "HS256":
        key = value.encode()
        if len(key) < 32:  # RFC 7518 3.2: at least as long as the hash
            raise MissingSecret(
                f"connector {connector}: the HS256 key in {spec.signing_key_env} is {len(key)} bytes; "
                "it must be at least 32"
            )
        return key
    from cryptography.hazmat.primitives.asymmetric.rsa import RSAPrivateKey
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    try:
        private = load_pem_private_key(value.encode(), password=None)
    except (ValueError, TypeError) as exc:
        raise MissingSecret(
            f"connector {connector}: {spec.signing_key_env} is not an unencrypted PEM private key"
        ) from exc
    if not isinstance(private, RSAPrivateKey):
        raise MissingSecret(f"connector {connector}: {spec.signing_key_env} is not an RSA key (algorithm RS256)")
    return private
