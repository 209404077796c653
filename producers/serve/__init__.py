"""The agent side of an ``agent`` connector: answer the fleet's requests from Python in a few lines.

A connector with ``type: agent`` and ``agent: NAME`` is answered by the agent NAME. The fleet checks
each intent as for any other connector (permission, params, rate limit, idempotency, breaker), then
its pool sends the agent a request and waits for the answer::

    from producers.serve import AgentError, serve

    def lookup_order(params, request):
        order = orders.get(params["order_id"])
        if order is None:
            raise AgentError("DOWNSTREAM_NOT_FOUND", f"no order {params['order_id']}", "Check the order id.")
        return {"status": order.status}

    serve("orders_bot", "amqp://orders_bot:<password>@broker:5672//", {"lookup_order": lookup_order})

Intents a handler sends through ``request.call`` carry the request's hop count (``context.hops``),
so a chain of agents calling agents is refused past the fleet's limit instead of looping.

The wire, for agents written in other languages (docs/contract.md section 5, "Agent connectors")::

    request   queue reach.agent.<agent> (consume with manual ack; only this agent may read it)
              properties: correlation_id, reply_to, message_id = intent id, expiration
              body: AgentRequest as JSON
    answer    publish to exchange reach.agent-replies, routing key = the request's reply_to,
              correlation_id = the request's, content_type application/json
              body: {"status": "succeeded", "data": {...}}
                 or {"status": "failed", "error": {"code", "message", "suggestion"?, "details"?, "retry_after_ms"?}}
              then ack the request

Errors::

    AgentError        raised by a handler: the request failed with one of ANSWER_CODES
    AgentServeError   the fleet's queue or exchange is missing, or the broker refused the agent

One module per part::

    contract   the fleet's names for an agent's queue and exchanges, the request and answer models
    handlers   what a handler sees (Request) and raises (AgentError)
    server     AgentServer and serve(): consuming requests, running handlers, publishing answers
"""

from producers.serve.contract import (
    AGENT_QUEUE_PREFIX,
    AGENT_REPLIES_EXCHANGE_NAME,
    AGENTS_EXCHANGE_NAME,
    ANSWER_CODES,
    MAX_ANSWER_DETAILS,
    MAX_MESSAGE_CHARS,
    MAX_SUGGESTION_CHARS,
    REQUEST_VERSION,
    AgentAnswer,
    AgentRequest,
    AnswerError,
    agent_queue_name,
)
from producers.serve.handlers import AgentError, Handler, Request
from producers.serve.server import AgentServeError, AgentServer, serve

__all__ = [
    "AGENTS_EXCHANGE_NAME",
    "AGENT_QUEUE_PREFIX",
    "AGENT_REPLIES_EXCHANGE_NAME",
    "ANSWER_CODES",
    "MAX_ANSWER_DETAILS",
    "MAX_MESSAGE_CHARS",
    "MAX_SUGGESTION_CHARS",
    "REQUEST_VERSION",
    "AgentAnswer",
    "AgentError",
    "AgentRequest",
    "AgentServeError",
    "AgentServer",
    "AnswerError",
    "Handler",
    "Request",
    "agent_queue_name",
    "serve",
]
