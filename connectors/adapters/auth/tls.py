"""TLS for the HTTP-based adapters: the context (system CAs or the connector's CA bundle, plus the
client certificate of an ``mtls`` connector) and how a refused client certificate shows."""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass

import httpx

from connectors.adapters.auth.secrets import MissingSecret, environment, secret
from connectors.spec import AuthSpec


@dataclass(frozen=True)
class TlsFiles:
    """mtls: the client certificate and key (and the CA bundle that signed the server), as paths."""

    cert: str
    key: str
    ca: str | None


def tls_files(spec: AuthSpec, connector: str, environ: Mapping[str, str] | None = None) -> TlsFiles | None:
    """The files an ``mtls`` connector presents (None for other auth types). Every HTTP-based
    adapter (http, soap) loads them into its TLS context."""
    if spec.type != "mtls":
        return None
    env = environment(environ)
    files = TlsFiles(
        secret(env, spec.cert_env, connector),
        secret(env, spec.key_env, connector),
        env.get(spec.ca_env) if spec.ca_env else None,
    )
    for path in (files.cert, files.key, files.ca):
        if path is not None and not os.path.isfile(path):
            raise MissingSecret(f"connector {connector}: mtls file {path} does not exist")
    return files


def ssl_context(spec: AuthSpec, connector: str, environ: Mapping[str, str] | None = None) -> ssl.SSLContext:
    """The TLS context of an HTTP-based adapter: the system's CAs (or the connector's CA bundle),
    plus the client certificate for ``mtls``.

    Raises:
        MissingSecret: a named variable is unset, or a named file is missing or not a usable
            certificate, key or CA bundle.
    """
    files = tls_files(spec, connector, environ)
    try:
        context = (
            httpx.create_ssl_context()
            if files is None or files.ca is None
            else ssl.create_default_context(cafile=files.ca)
        )
        if files is not None:
            context.load_cert_chain(files.cert, files.key)
    except (ssl.SSLError, OSError) as exc:
        reason = getattr(exc, "reason", None) or type(exc).__name__
        raise MissingSecret(
            f"connector {connector}: the mtls certificate, key or CA cannot be used ({reason})"
        ) from exc
    return context


# alerts a TLS server sends when it refuses this side's client certificate (or its absence)
_CLIENT_CERT_ALERTS = frozenset(
    {
        "TLSV13_ALERT_CERTIFICATE_REQUIRED",
        "SSLV3_ALERT_HANDSHAKE_FAILURE",  # TLS 1.2: how most servers say "no certificate"
        "SSLV3_ALERT_BAD_CERTIFICATE",
        "SSLV3_ALERT_UNSUPPORTED_CERTIFICATE",
        "SSLV3_ALERT_CERTIFICATE_REVOKED",
        "SSLV3_ALERT_CERTIFICATE_EXPIRED",
        "SSLV3_ALERT_CERTIFICATE_UNKNOWN",
        "TLSV1_ALERT_UNKNOWN_CA",
        "TLSV1_ALERT_ACCESS_DENIED",
    }
)


def tls_refusal(exc: BaseException) -> str | None:
    """Why the system refused this side's TLS client certificate, if that is what ``exc`` (an
    httpx transport error) comes from; None otherwise. The handshake failed, so the system never
    read the request (with TLS 1.3 the refusal only shows on the first read)."""
    seen = 0
    cause: BaseException | None = exc
    while cause is not None and seen < 8:
        if isinstance(cause, ssl.SSLError) and cause.reason in _CLIENT_CERT_ALERTS:
            return f"the system refused the TLS client certificate ({cause.reason})"
        cause = cause.__cause__ or cause.__context__
        seen += 1
    return None
