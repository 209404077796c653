"""``reach validate`` for a soap connector: its actions checked against the operations of its WSDL."""

from __future__ import annotations

import difflib

from connectors.adapters.auth import MissingSecret
from connectors.adapters.base import AdapterOptions
from connectors.adapters.soap.adapter import SoapAdapter
from connectors.adapters.soap.wsdl import LOAD_TIMEOUT, WsdlError
from connectors.spec import ConnectorSpec


def wsdl_problems(connector: ConnectorSpec) -> list[str]:
    """What ``reach validate`` finds by reading a soap connector's WSDL: operations it lacks, params
    that are not input parts, required parts the input leaves out; or why the WSDL cannot be loaded."""
    try:
        adapter = SoapAdapter(connector, AdapterOptions(max_connections=1))
    except (MissingSecret, OSError, ValueError) as exc:
        return [f"the WSDL {connector.wsdl} cannot be loaded: {exc}"]
    try:
        service = adapter.service(LOAD_TIMEOUT)
    except WsdlError as exc:  # its message names the WSDL
        return [f"the WSDL cannot be loaded: {exc}"]
    finally:
        adapter.close()
    problems = []
    for action in connector.actions:
        operation = service.operations.get(action.operation or "")
        if operation is None:
            near = difflib.get_close_matches(action.operation or "", list(service.operations), n=1)
            hint = f" (did you mean {near[0]}?)" if near else f" (it has {', '.join(sorted(service.operations))})"
            problems.append(f"action {action.action}: operation {action.operation} is not in the WSDL{hint}")
            continue
        wire = {(spec.name or name): name for name, spec in action.input.items()}
        for part, name in wire.items():
            if part not in operation.parts:
                problems.append(
                    f"action {action.action}: input {name} is not an input part of {operation.name} "
                    f"(its parts: {', '.join(operation.parts) or 'none'})"
                )
        for part in operation.required:
            if part not in wire:
                problems.append(f"action {action.action}: {operation.name} requires part {part}, which input lacks")
    return problems
