"""Credentials for a connector, read from the environment variables its spec names.

Secrets are read once when the pool starts (a missing one stops the pool with a clear message)
and are never logged, put in receipts or repr'd.

What can go wrong, and what a call's receipt says then::

    MissingSecret               at start: a named variable is unset, a named file unusable
    CredentialsError            during a call, before the request is sent (nothing reached the system)
    ├── TokenError              the credentials were refused (wrong secret, burned refresh
    │                           token, login refused): DOWNSTREAM_AUTH_FAILED, not retried
    └── CredentialsUnavailable  the login page, token endpoint or shared token store did not
                                answer: DOWNSTREAM_UNREACHABLE, retried

Per auth ``type`` (:func:`build_auth`, in kinds.py): ``api_key``, ``bearer``, ``basic`` set a header
(static.py; httpx.BasicAuth); ``oauth2_client_credentials`` and ``oauth2_refresh_token`` fetch and
cache access tokens (oauth2.py, the rotating ones shared through token_store.py); ``form_login``
keeps a session cookie (form_login.py); ``jwt`` signs a short token per call (jwt_signing.py: it
needs the call's context, which the adapter puts in the request with :func:`bind_call`); ``mtls``
is in the TLS context (tls.py, :func:`ssl_context`), not in the request. secrets.py reads the
variables, errors.py holds the error tree.
"""

from connectors.adapters.auth.errors import CredentialsError, CredentialsUnavailable, TokenError
from connectors.adapters.auth.form_login import FormLoginAuth
from connectors.adapters.auth.jwt_signing import CALL_EXTENSION, JwtAuth, bind_call
from connectors.adapters.auth.kinds import build_auth
from connectors.adapters.auth.oauth2 import ClientCredentialsAuth, RefreshTokenAuth
from connectors.adapters.auth.secrets import MissingSecret, read_secret
from connectors.adapters.auth.static import StaticAuth
from connectors.adapters.auth.tls import TlsFiles, ssl_context, tls_files, tls_refusal
from connectors.adapters.auth.token_store import AUTH_KEY_PREFIX, Tokens, state_key

__all__ = [
    "AUTH_KEY_PREFIX",
    "CALL_EXTENSION",
    "ClientCredentialsAuth",
    "CredentialsError",
    "CredentialsUnavailable",
    "FormLoginAuth",
    "JwtAuth",
    "MissingSecret",
    "RefreshTokenAuth",
    "StaticAuth",
    "TlsFiles",
    "TokenError",
    "Tokens",
    "bind_call",
    "build_auth",
    "read_secret",
    "ssl_context",
    "state_key",
    "tls_files",
    "tls_refusal",
]
