"""The agent side of agent-reach: the wire contract, the client, format adapters, tool export.

This package imports nothing from ``workers`` or ``connectors``; both of them import it.
"""

from producers.client import ApprovalPending, ReachClient, ReachError, ReceiptTimeout
from producers.formats import FormatError, Normalized, normalize
from producers.tools import ToolSpec, export, to_anthropic, to_mcp, to_openai
from producers.wire import ErrorCode, ErrorInfo, Execution, Intent, Receipt

__all__ = [
    "ApprovalPending",
    "ErrorCode",
    "ErrorInfo",
    "Execution",
    "FormatError",
    "Intent",
    "Normalized",
    "ReachClient",
    "ReachError",
    "Receipt",
    "ReceiptTimeout",
    "ToolSpec",
    "export",
    "normalize",
    "to_anthropic",
    "to_mcp",
    "to_openai",
]
