"""The WSDL of a soap connector: how it is parsed, what of it the adapter keeps (the SOAP port, its
operations' input parts), and why it cannot be used (WsdlError)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import zeep
from zeep.wsdl.bindings.soap import SoapBinding

from producers.wire import ErrorCode

MAX_DOCUMENT_BYTES = 16 << 20  # the WSDL and each schema it imports
LOAD_TIMEOUT = 10.0  # seconds for loading the WSDL (and its imports) on first use
# the parser of every document: no DOCTYPE (so no entity expansion), libxml2's own depth and size limits
SETTINGS = zeep.Settings(strict=True, forbid_dtd=True, forbid_entities=True, xml_huge_tree=False)


class WsdlError(Exception):
    """The WSDL cannot be used. ``code`` is what a call answers meanwhile: DOWNSTREAM_UNREACHABLE
    (it could not be fetched), DOWNSTREAM_AUTH_FAILED (401/403) or DOWNSTREAM_CONTRACT_VIOLATION
    (not a usable WSDL)."""

    def __init__(self, message: str, code: ErrorCode = ErrorCode.DOWNSTREAM_CONTRACT_VIOLATION) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Operation:
    name: str
    parts: tuple[str, ...]  # the input parts, in the WSDL's order
    required: tuple[str, ...]  # parts that must be present (minOccurs >= 1)


@dataclass(frozen=True)
class Service:
    """The loaded WSDL: the zeep client, the port called, and its operations' inputs."""

    client: Any
    proxy: Any
    address: str
    operations: dict[str, Operation] = field(default_factory=dict)


def origin(url: str) -> tuple[str, str, int | None] | None:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        return None
    return parts.scheme, (parts.hostname or "").lower(), parts.port


def operations(binding: Any) -> dict[str, Operation]:
    """Each operation's input parts: the children of its body (document: the wrapper element's,
    rpc: the message's parts)."""
    found = {}
    for name, operation in binding.all().items():
        body = getattr(operation.input, "body", None) if operation.input is not None else None
        elements = getattr(getattr(body, "type", None), "elements", None) or []
        parts = tuple(part for part, _ in elements)
        required = tuple(part for part, element in elements if getattr(element, "min_occurs", 0) >= 1)
        found[name] = Operation(name, parts, required)
    return found


def soap_port(client: Any) -> Any:
    for service in client.wsdl.services.values():
        for port in service.ports.values():
            if isinstance(port.binding, SoapBinding):
                return port
    raise WsdlError("the WSDL has no SOAP port")
