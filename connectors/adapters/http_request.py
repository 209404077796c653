"""The HTTP adapter's requests: one action and its params -> one httpx request, or UnsafeRequest.

The scheme, host, port and path template come from the catalog only. Path parameters are
percent-encoded (``/`` and dot segments too) and the finished URL is checked against the endpoint
before anything is sent. A value too long for a URL or header, or one HTTP cannot carry, is
refused (never sent).
"""

from __future__ import annotations

from typing import Any, cast
from urllib.parse import quote

import httpx

from connectors.adapters.auth import bind_call
from connectors.adapters.base import CallContext
from connectors.adapters.common import OMIT, convert_for_system, header_safe, scalar_text
from connectors.adapters.errors import Unsendable
from connectors.adapters.http_body import Body
from connectors.schema import MAX_HEADER_VALUE_BYTES, MAX_PATH_SEGMENT_BYTES, MAX_URL_BYTES
from connectors.spec import PATH_PARAM, ActionSpec, ConnectorSpec, split_path


class UnsafeRequest(Unsendable):
    """The request would leave the connector's endpoint or template, or cannot be formed; it is never sent.

    ``field`` names the param at fault, when one is, and ``code`` the problem as the params
    validator names it (``max_length``, ``header``).
    """

    def __init__(self, message: str, field: str | None = None, code: str = "max_length") -> None:
        super().__init__(message, field, code)


def encode_path_segment(value: Any) -> str:
    """Percent-encode a path parameter so it stays exactly one segment."""
    text = scalar_text(value)
    encoded = quote(text, safe="")
    if encoded.strip(".") == "":
        # "." and ".." are dot segments that HTTP clients and servers collapse
        encoded = encoded.replace(".", "%2E")
    return encoded


class RequestBuilder:
    """Builds one connector's requests against its endpoint; shared by every thread of the adapter."""

    def __init__(self, connector: ConnectorSpec, base: httpx.URL) -> None:
        self.connector = connector
        self._base = base
        self._base_path = base.raw_path.decode("ascii").rstrip("/")
        self._urls: dict[str, httpx.URL] = {}

    def url(self, path: str) -> httpx.URL:
        """The endpoint's URL with ``path`` (already encoded) below the endpoint's own path."""
        return self._base.copy_with(raw_path=(self._base_path + path).encode("ascii"))

    def build(
        self, client: httpx.Client, action: ActionSpec, params: dict[str, Any], ctx: CallContext
    ) -> httpx.Request:
        """The request for one call, built with ``client`` (its auth, headers and timeouts).

        Raises:
            UnsafeRequest: the params would leave the endpoint or cannot be formed.
        """
        if action.path is None:
            raise ValueError(f"action {action.action} has no path")
        method, template = split_path(action.path)
        in_template = set(PATH_PARAM.findall(template))
        default_place = "query" if method in ("GET", "DELETE") else "body"
        path_values: dict[str, str] = {}
        query: list[tuple[str, str]] = []
        headers: dict[str, str] = {}
        body = Body(action.body or "json")
        for name, value in params.items():
            spec = action.input.get(name)
            if spec is None:
                raise UnsafeRequest(f"param {name!r} is not declared")  # validation runs first; never reached
            place = spec.in_ or ("path" if name in in_template else default_place)
            wire = spec.name or name
            converted = convert_for_system(value, spec, name)
            if converted is OMIT:
                continue
            if place == "path":
                segment = encode_path_segment(converted)
                if len(segment) > MAX_PATH_SEGMENT_BYTES:
                    raise UnsafeRequest(
                        f"path parameter {name!r} is longer than {MAX_PATH_SEGMENT_BYTES} bytes once URL-encoded",
                        field=name,
                    )
                path_values[name] = segment
            elif place == "query":
                if converted is None:
                    continue
                items = converted if isinstance(converted, list) else [converted]
                query.extend((wire, scalar_text(v)) for v in items)
            elif place == "header":
                if converted is None:
                    continue
                text = scalar_text(converted)
                if not header_safe(text):
                    raise UnsafeRequest(
                        f"header value for {name!r} must be plain ASCII without control characters",
                        field=name,
                        code="header",
                    )
                if len(text) > MAX_HEADER_VALUE_BYTES:
                    raise UnsafeRequest(
                        f"header value for {name!r} is longer than {MAX_HEADER_VALUE_BYTES} bytes", field=name
                    )
                headers[wire] = text
            else:  # body, file (base64 text, bounded before decoding) or whole_body
                body.add(place, wire, converted, spec, name)
        path = PATH_PARAM.sub(lambda m: path_values[m.group(1)], template)
        for header, value in (
            (self.connector.idempotency_header, ctx.idempotency_key),
            ("traceparent", ctx.traceparent),
        ):
            if header and value:
                if not header_safe(value) or len(value) > MAX_HEADER_VALUE_BYTES:
                    raise UnsafeRequest(
                        f"the {header} value must be plain ASCII without control characters, "
                        f"at most {MAX_HEADER_VALUE_BYTES} bytes"
                    )
                headers[header] = value
        content = None
        if method not in ("GET", "DELETE") or not body.empty():
            content = body.encode(headers)
        headers.setdefault("Accept", "application/json")
        try:
            url = self._urls.get(path) if path == template else None
            if url is None:
                url = self.url(path)
                if path == template:  # no path params: the same URL every time (one per action)
                    self._urls[path] = url
            request = client.build_request(
                method, url, params=cast(Any, query) or None, headers=headers, content=content
            )
        except httpx.InvalidURL as exc:  # httpx's own bound (64 KiB a component): far past ours
            raise UnsafeRequest(f"the request URL is longer than {MAX_URL_BYTES} bytes") from exc
        if len(request.url.raw_path) > MAX_URL_BYTES:
            raise UnsafeRequest(f"the request URL is longer than {MAX_URL_BYTES} bytes")
        self._check_destination(request, template, path)
        bind_call(request, ctx)  # for an auth that names the caller (jwt)
        return request

    def _check_destination(self, request: httpx.Request, template: str, path: str) -> None:
        url = request.url
        if (url.scheme, url.host, url.port) != (self._base.scheme, self._base.host, self._base.port):
            raise UnsafeRequest("the request would leave the connector's endpoint")
        expected = (self._base_path + path).encode("ascii")
        if url.raw_path.split(b"?", 1)[0] != expected:
            raise UnsafeRequest("the request path was rewritten")
