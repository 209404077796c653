"""``auth:`` of a connector: how it proves who the fleet is, credentials named by env variable."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from connectors.durations import Duration
from connectors.spec.base import Spec
from connectors.spec.http_parts import header_name_problem

AuthType = Literal[
    "none",
    "api_key",
    "bearer",
    "basic",
    "oauth2_client_credentials",
    "oauth2_refresh_token",
    "form_login",
    "mtls",
    "jwt",
]


class AuthSpec(Spec):
    """Credentials are named by environment variable, never written inline."""

    type: AuthType = "none"
    in_: Literal["header", "query"] = Field(default="header", alias="in")
    name: str | None = None  # api_key: header or query parameter name
    token_env: str | None = None  # bearer
    username_env: str | None = None  # basic
    password_env: str | None = None  # basic
    token_url: str | None = None  # oauth2_client_credentials
    client_id_env: str | None = None
    client_secret_env: str | None = None
    scope: str | None = None
    refresh_token_env: str | None = None  # oauth2_refresh_token: the first refresh token
    login_url: str | None = None  # form_login: where the credentials are POSTed
    username_field: str = "username"  # form_login: form field names
    password_field: str = "password"
    cert_env: str | None = None  # mtls: path of the client certificate (PEM)
    key_env: str | None = None  # mtls: path of its private key; api_key: the key itself
    ca_env: str | None = None  # mtls (optional): path of the CA bundle that signed the server
    signing_key_env: str | None = None  # jwt: HS256 secret or RS256 private key (PEM)
    algorithm: Literal["HS256", "RS256"] = "HS256"  # jwt
    issuer: str = "agent-reach"  # jwt `iss`
    audience: str | None = None  # jwt `aud`
    ttl: Duration = 60.0  # jwt lifetime, at most 5 minutes

    @model_validator(mode="after")
    def _complete(self) -> AuthSpec:
        needed = {
            "none": [],
            "api_key": ["name", "key_env"],
            "bearer": ["token_env"],
            "basic": ["username_env", "password_env"],
            "oauth2_client_credentials": ["token_url", "client_id_env", "client_secret_env"],
            "oauth2_refresh_token": ["token_url", "client_id_env", "refresh_token_env"],
            "form_login": ["login_url", "username_env", "password_env"],
            "mtls": ["cert_env", "key_env"],
            "jwt": ["signing_key_env", "audience"],
        }[self.type]
        if self.type == "jwt" and not 0 < self.ttl <= 300:
            raise ValueError("jwt ttl must be between 0 and 5m")
        missing = [k for k in needed if getattr(self, k) is None]
        if missing:
            raise ValueError(f"auth type {self.type} needs {', '.join(missing)}")
        if self.type == "api_key" and self.in_ == "header" and self.name is not None:
            if problem := header_name_problem("api_key header name", self.name):
                raise ValueError(problem)
        return self
