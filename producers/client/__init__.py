"""The Python client an agent uses to publish intents and read their receipts.

Errors::

    ReachError            the broker refused or lost something, or a receipt reports a failure
                          (then ``.receipt`` holds it)
    ReceiptTimeout        no receipt arrived in time (a TimeoutError; the intent may still run)

Any language can do the same with a plain AMQP client; this package is just the shortest correct
way to do it from Python (docs/contract.md sections 1-3).

One module per part of the client::

    errors       what it raises
    bodies       the bytes it sends and reads (an intent's body; a receipt or approval notice)
    session      the broker connection, the receipt queue, the move to another node
    publishing   publishing with confirms, nack pauses and one retry on another node
    receiving    buffering receipts, dropping repeats, keeping approval notices
    reach        ReachClient: those parts together, and ``call`` and ``tools`` on top
"""

# importable from here but not in __all__ (the MCP facade reads and writes the same bodies)
from producers.client.bodies import intent_body as intent_body
from producers.client.bodies import read_reply as read_reply
from producers.client.errors import ApprovalPending, ReachError, ReceiptTimeout
from producers.client.reach import ReachClient
from producers.client.receiving import KEPT_NOTICES as KEPT_NOTICES
from producers.client.receiving import SEEN_RECEIPTS as SEEN_RECEIPTS
from producers.client.session import INTENTS_EXCHANGE, RECEIPTS_EXCHANGE
from producers.client_settings import DEFAULT_BROKER_URL
from producers.wire import INTENT_ROUTING_KEY

__all__ = [
    "DEFAULT_BROKER_URL",
    "INTENTS_EXCHANGE",
    "INTENT_ROUTING_KEY",
    "RECEIPTS_EXCHANGE",
    "ApprovalPending",
    "ReachClient",
    "ReachError",
    "ReceiptTimeout",
]
