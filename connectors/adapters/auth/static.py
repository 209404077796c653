"""The kinds that set the same header (or query param) on every request: ``api_key``, ``bearer``
(``basic`` is httpx's own BasicAuth)."""

from __future__ import annotations

from collections.abc import Generator

import httpx


class StaticAuth(httpx.Auth):
    """api_key (header or query), bearer."""

    def __init__(self, headers: dict[str, str], query: dict[str, str]) -> None:
        self._headers = headers
        self._query = query

    def __repr__(self) -> str:
        return "StaticAuth(<redacted>)"

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        for name, value in self._headers.items():
            request.headers[name] = value
        if self._query:
            request.url = request.url.copy_merge_params(self._query)
        yield request
