"""Where and how the system is reached: the endpoint from servers (or host and basePath), and
the connector's auth from a security scheme, with credentials named by environment variable."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urljoin, urlsplit

from connectors.openapi.document import OptionsError
from connectors.openapi.text import one_line
from connectors.spec import PATH_PARAM, header_name_problem


def endpoint_of(doc: Mapping[str, Any], version: str, given: str | None) -> str:
    """The connector's endpoint: ``given`` (--endpoint), else servers[0] with its variables' defaults
    (3.x), else scheme, host and basePath (2.0).

    Raises:
        OptionsError: It is relative or missing (then --endpoint is needed), or not an http(s) URL.
    """
    if given is not None:
        return _checked_endpoint(given, "--endpoint")
    if version == "2.0":
        host = doc.get("host")
        if not isinstance(host, str) or not host:
            raise OptionsError("the document names no host: pass --endpoint https://HOST/BASE-PATH")
        schemes = [s for s in doc.get("schemes") or [] if s in ("http", "https")]
        scheme = "https" if "https" in schemes or not schemes else schemes[0]
        base = doc.get("basePath") if isinstance(doc.get("basePath"), str) else ""
        return _checked_endpoint(f"{scheme}://{host}{base}", "the document's host and basePath")
    servers = doc.get("servers")
    server: dict[str, Any] = (
        servers[0] if isinstance(servers, list) and servers and isinstance(servers[0], dict) else {}
    )
    url: str = server["url"] if isinstance(server.get("url"), str) else "/"
    variables: dict[str, Any] = server["variables"] if isinstance(server.get("variables"), dict) else {}

    def default(match: re.Match[str]) -> str:
        variable = variables.get(match.group(1))
        value = variable.get("default") if isinstance(variable, dict) else None
        if not isinstance(value, str):
            raise OptionsError(
                f"servers[0] variable {{{one_line(match.group(1), 40)}}} has no default: pass --endpoint"
            )
        return value

    if "${" in url:
        _checked_endpoint(url, "servers[0].url")  # refused before a variable is filled into it
    url = PATH_PARAM.sub(default, url)
    if not urlsplit(url).scheme:
        raise OptionsError(
            f"the document's server URL {one_line(url, 100)!r} is relative: pass --endpoint with the system's "
            "full base URL (e.g. --endpoint https://api.example.com"
            + (url if url.startswith("/") else "").rstrip("/")
            + ")"
        )
    return _checked_endpoint(url, "servers[0].url")


def _checked_endpoint(url: str, where: str) -> str:
    """``url`` without a trailing slash, if the connector can use it as its endpoint."""
    if "${" in url and where != "--endpoint":
        # the loader expands ${VAR} in endpoints from the fleet's environment: a document must not choose which
        raise OptionsError(f"{where} {one_line(url, 100)!r} contains '${{': pass --endpoint instead")
    probe = re.sub(r"\$\{[^}]*\}", "x", url)  # an --endpoint may name ${VAR}s of the catalog's own
    parts = urlsplit(probe)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
        raise OptionsError(f"{where} {one_line(url, 100)!r} is not an http(s) URL with a host (and no query)")
    if parts.username or parts.password:
        raise OptionsError(f"{where} must not carry credentials")
    return url.rstrip("/")


def scheme_kind(scheme: dict[str, Any]) -> str:
    """``oauth2 implicit``, ``apiKey cookie``: a security scheme in two words, for a note."""
    kind = str(scheme.get("type"))
    detail = scheme.get("scheme") or scheme.get("in") or scheme.get("flow") or ",".join(scheme.get("flows") or {})
    return f"{kind} {detail}".strip()


def why_not_expressible(scheme: dict[str, Any]) -> str:
    """Why ``auth_for`` found no auth for ``scheme``, for the header's note."""
    name = scheme.get("name")
    if scheme.get("type") == "apiKey" and scheme.get("in") == "header" and isinstance(name, str):
        problem = header_name_problem("its header name", name)
        if problem is not None:
            return f"left out: {one_line(problem, 200)}"
    return "cannot be expressed by the catalog"


def auth_for(
    scheme: dict[str, Any], prefix: str, endpoint: str, scopes: Callable[[], list[str]]
) -> tuple[dict[str, Any] | None, list[str], tuple[str, str] | None]:
    """The catalog's auth for one security scheme, with env variable names; None when it has none
    (``why_not_expressible`` says why)."""
    kind = scheme.get("type")
    if kind == "apiKey" and scheme.get("in") in ("header", "query") and isinstance(scheme.get("name"), str):
        if scheme["in"] == "header" and header_name_problem("", scheme["name"]) is not None:
            return None, [], None  # `reach validate` would refuse the name
        env = f"{prefix}_API_KEY"
        return (
            {"type": "api_key", "in": scheme["in"], "name": scheme["name"], "key_env": env},
            [env],
            (scheme["in"], scheme["name"]),
        )
    if kind == "basic" or (kind == "http" and str(scheme.get("scheme", "")).lower() == "basic"):
        user, password = f"{prefix}_USERNAME", f"{prefix}_PASSWORD"
        return {"type": "basic", "username_env": user, "password_env": password}, [user, password], None
    if kind == "http" and str(scheme.get("scheme", "")).lower() == "bearer":
        return {"type": "bearer", "token_env": f"{prefix}_TOKEN"}, [f"{prefix}_TOKEN"], None
    if kind == "mutualTLS":
        cert, key = f"{prefix}_CLIENT_CERT", f"{prefix}_CLIENT_KEY"
        return {"type": "mtls", "cert_env": cert, "key_env": key}, [cert, key], None
    if kind == "oauth2":
        flows = scheme.get("flows")
        flow = flows.get("clientCredentials") if isinstance(flows, dict) else None
        if flow is None and scheme.get("flow") == "application":  # Swagger 2.0
            flow = scheme
        token_url = flow.get("tokenUrl") if isinstance(flow, dict) else None
        if isinstance(token_url, str) and token_url:
            absolute = urljoin(endpoint + "/", token_url)
            if urlsplit(absolute).scheme in ("http", "https") and "${" not in absolute:
                client_id, secret = f"{prefix}_CLIENT_ID", f"{prefix}_CLIENT_SECRET"
                auth: dict[str, Any] = {
                    "type": "oauth2_client_credentials",
                    "token_url": absolute,
                    "client_id_env": client_id,
                    "client_secret_env": secret,
                }
                wanted = scopes()
                if wanted:
                    auth["scope"] = " ".join(wanted)
                return auth, [client_id, secret], None
    return None, [], None
