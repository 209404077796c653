"""Who is calling ``reach mcp --http``: a bearer token per agent, checked as an OAuth 2.1 resource server.

Two kinds, either or both (each is an MCP SDK ``TokenVerifier``):

- **JWTs** (REACH_MCP_JWT_KEY, REACH_MCP_JWT_ALGORITHM): signed HS256 with a shared secret or
  RS256 with the issuer's private key (the facade holds the public key). ``aud`` must be the MCP
  URL (REACH_MCP_URL), ``sub`` the agent's name, ``exp`` present and not past; with
  REACH_MCP_ISSUER_URL, ``iss`` must equal it.
- **Static tokens** (REACH_MCP_TOKENS_FILE): a YAML or JSON mapping of agent name to the sha256
  hex digest of its token, or a list of digests (two during a rotation)::

      ticket_desk_bot: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08
      ticket_qa_bot: [3a6eb0790f39ac87c94f3856b2dd2c5d110e6811602261a9a923d3bb23adc8b7, ...]

  The file holds no token, only digests, so reading it gives nobody a login. It is read again
  when it changes (a mounted Secret being rotated), at most every few seconds; a broken new
  version is logged and the last good one kept.

Either way the agent is the token's, and nothing in a request can name another. A token that
fits neither gets 401 with the resource metadata URL in ``WWW-Authenticate`` (the SDK's bearer
middleware does that).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jwt
import yaml
from mcp.server.auth.provider import AccessToken, TokenVerifier

from producers.wire import AGENT_ID_PATTERN, NAME_RULE

log = logging.getLogger("reach.mcp")

MAX_TOKEN_CHARS = 8192  # longer is refused before any hashing or decoding
MAX_FILE_BYTES = 4 * 1024 * 1024
RELOAD_EVERY = 5.0  # seconds between looks at the token file's modification time
JWT_LEEWAY = 30  # seconds of clock skew allowed on exp and nbf
_DIGEST = re.compile(r"^[0-9a-f]{64}\Z")


class TokenConfigError(ValueError):
    """The token settings or the token file cannot be used; the message says why."""


def digest(token: str) -> str:
    """The sha256 hex digest of a token, as the token file stores it."""
    return hashlib.sha256(token.encode()).hexdigest()


def read_token_file(path: Path) -> dict[str, str]:
    """Map each digest in the token file to its agent.

    Raises:
        TokenConfigError: The file is missing, too large, not YAML/JSON, or has a bad entry.
    """
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            raise TokenConfigError(f"{path} is larger than {MAX_FILE_BYTES} bytes")
        doc = yaml.safe_load(path.read_text())  # JSON is YAML
    except OSError as exc:
        raise TokenConfigError(f"cannot read {path}: {exc}") from exc
    except yaml.YAMLError as exc:
        raise TokenConfigError(f"{path} is not YAML or JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise TokenConfigError(f"{path} must map agent names to sha256 digests of their tokens")
    agents: dict[str, str] = {}
    for agent, value in doc.items():
        if not isinstance(agent, str) or not AGENT_ID_PATTERN.match(agent):
            raise TokenConfigError(f"{path}: {agent!r} is not an agent name ({NAME_RULE})")
        digests = value if isinstance(value, list) else [value]
        for entry in digests:
            text = entry.strip().lower() if isinstance(entry, str) else ""
            if not _DIGEST.match(text):
                raise TokenConfigError(f"{path}: {agent}: a token is given as its sha256 hex digest (64 hex digits)")
            if agents.setdefault(text, agent) != agent:
                raise TokenConfigError(f"{path}: {agents[text]} and {agent} have the same token")
    return agents


class StaticTokens(TokenVerifier):
    """Tokens whose sha256 digests the token file lists, each for one agent."""

    def __init__(self, path: Path, resource: str) -> None:
        """Read the file once now: a broken one stops the facade from starting.

        Raises:
            TokenConfigError: As :func:`read_token_file`.
        """
        self._path = path
        self._resource = resource
        self._stamp = self._mtime()
        self._agents = read_token_file(path)
        self._looked = time.monotonic()

    def agent_for(self, token: str) -> str | None:
        """The agent whose token this is, or None."""
        if len(token) > MAX_TOKEN_CHARS:
            return None
        self._reload_if_changed()
        return self._agents.get(digest(token))

    async def verify_token(self, token: str) -> AccessToken | None:
        agent = self.agent_for(token)
        if agent is None:
            return None
        return AccessToken(token=token, client_id=agent, subject=agent, scopes=[], resource=self._resource)

    def _mtime(self) -> int | None:
        try:
            return os.stat(self._path).st_mtime_ns
        except OSError:
            return None

    def _reload_if_changed(self) -> None:
        now = time.monotonic()
        if now - self._looked < RELOAD_EVERY:
            return
        self._looked = now
        stamp = self._mtime()
        if stamp == self._stamp:
            return
        self._stamp = stamp
        try:
            self._agents = read_token_file(self._path)
        except TokenConfigError as exc:
            log.error("the token file changed and cannot be used; keeping the previous tokens: %s", exc)
            return
        log.info("token file %s read again: %d token(s)", self._path, len(self._agents))


class JwtTokens(TokenVerifier):
    """JWTs for this MCP URL, signed with the configured key, naming the agent as their subject."""

    def __init__(self, key: str, algorithm: str, audience: str, issuer: str | None = None) -> None:
        """Check the key now: a key the algorithm cannot use stops the facade from starting.

        Raises:
            TokenConfigError: The key does not suit the algorithm (e.g. not a PEM public key for RS256).
        """
        try:
            self._key: Any = jwt.get_algorithm_by_name(algorithm).prepare_key(key)
        except (jwt.exceptions.InvalidKeyError, ValueError, TypeError) as exc:
            raise TokenConfigError(f"REACH_MCP_JWT_KEY is not a usable {algorithm} key: {exc}") from exc
        self._algorithm = algorithm
        self._audience = audience
        self._issuer = issuer

    def agent_and_claims(self, token: str) -> tuple[str, dict[str, Any]] | None:
        """The agent a valid token is for, and its claims; None for anything else."""
        if len(token) > MAX_TOKEN_CHARS:
            return None
        required = ["exp", "sub", "aud"] + (["iss"] if self._issuer else [])
        try:
            claims: dict[str, Any] = jwt.decode(
                token,
                self._key,
                algorithms=[self._algorithm],  # never the token's own choice (no "none", no HS/RS confusion)
                audience=self._audience,
                issuer=self._issuer,
                leeway=JWT_LEEWAY,
                options={"require": required},
            )
        except jwt.PyJWTError as exc:
            log.info("refused a JWT: %s", exc)
            return None
        subject = claims.get("sub")
        if not isinstance(subject, str) or not AGENT_ID_PATTERN.match(subject):
            log.info("refused a JWT: its sub is not an agent name")
            return None
        return subject, claims

    async def verify_token(self, token: str) -> AccessToken | None:
        found = self.agent_and_claims(token)
        if found is None:
            return None
        agent, claims = found
        scope = claims.get("scope")
        return AccessToken(
            token=token,
            client_id=agent,
            subject=agent,
            scopes=scope.split() if isinstance(scope, str) else [],
            expires_at=int(claims["exp"]),
            resource=self._audience,
            claims={k: claims[k] for k in ("iss", "iat") if k in claims},
        )


class AnyOf(TokenVerifier):
    """The first verifier that accepts a token decides who it is."""

    def __init__(self, verifiers: Sequence[TokenVerifier]) -> None:
        self._verifiers = list(verifiers)

    async def verify_token(self, token: str) -> AccessToken | None:
        for verifier in self._verifiers:
            found = await verifier.verify_token(token)
            if found is not None:
                return found
        return None


def verifier(
    resource: str,
    tokens_file: str | None,
    jwt_key: str | None,
    jwt_algorithm: str,
    issuer: str | None,
) -> TokenVerifier:
    """The verifier the settings describe.

    Raises:
        TokenConfigError: Neither kind is configured (the HTTP facade never runs without
            authentication), or one cannot be used.
    """
    verifiers: list[TokenVerifier] = []
    if jwt_key:
        verifiers.append(JwtTokens(jwt_key, jwt_algorithm, resource, issuer))
    if tokens_file:
        verifiers.append(StaticTokens(Path(tokens_file), resource))
    if not verifiers:
        raise TokenConfigError(
            "no way to authenticate agents: set REACH_MCP_TOKENS_FILE (static tokens) and/or REACH_MCP_JWT_KEY (JWTs)"
        )
    return verifiers[0] if len(verifiers) == 1 else AnyOf(verifiers)
