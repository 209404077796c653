"""The conformance fixture (``reach plugins check graphql``): a real graphql-core server whose
resolvers answer as the kit's script says."""

from __future__ import annotations

import socket
import threading
from typing import Any

from graphql import GraphQLError, build_schema

from connectors.adapters.kit import Downstream, Fixture, KitContext, Received, Reply
from reach_graphql.server import Early, GraphqlServer

SECRET = "kit-graphql-token-93c1d0"
SCHEMA = build_schema(
    """
    type Answer { seen: String, blob: String }
    type Query { kitRead(q: String!): Answer }
    type Mutation { kitWrite(q: String!): Answer }
    """
)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


class Script:
    """Asks the kit once per request (in ``before``) and hands the reply to the resolvers; both
    run on the request's own server thread, so the reply waits in a thread-local."""

    def __init__(self, downstream: Downstream) -> None:
        self.downstream = downstream
        self.local = threading.local()

    def before(self, body: bytes, headers: Any) -> Early:
        reply = self.downstream.handle(Received(headers.get("Idempotency-Key"), body.decode("utf-8", "replace")))
        if reply.kind == "hang":
            return reply.seconds
        if reply.kind == "deep":  # no schema can say this; the server writes it as a broken one would
            nested = b'{"a":' * reply.depth + b"1" + b"}" * reply.depth
            return 200, b'{"data": {"kitRead": ' + nested + b"}}"
        self.local.reply = reply
        return None

    def root(self, body: bytes, headers: Any) -> Any:
        reply: Reply = self.local.reply

        def resolve(info: Any, q: str) -> Any:
            if reply.kind == "fail":
                raise GraphQLError(reply.message, extensions={"code": "INTERNAL_SERVER_ERROR"})
            if reply.kind == "huge":
                return {"blob": "x" * reply.size}
            return reply.data

        return {"kitRead": resolve, "kitWrite": resolve}


def fixture(downstream: Downstream, context: KitContext) -> Fixture:
    script = Script(downstream)
    server = GraphqlServer(SCHEMA, root=script.root, before=script.before, token=SECRET)

    def connector(reachable: bool, idempotency: bool) -> dict[str, Any]:
        endpoint = server.url if reachable else f"http://127.0.0.1:{_closed_port()}/graphql"
        doc: dict[str, Any] = {
            "name": "kit",
            "type": "graphql",
            "endpoint": endpoint,
            "config": {"token_env": "KIT_GRAPHQL_TOKEN"},
            "actions": [
                {
                    "action": "kit_read",
                    "description": "Read something from the kit's GraphQL server.",
                    "input": {"q": {"type": "string"}},
                    "config": {"query": "query($q: String!) { kitRead(q: $q) { seen blob } }", "result": "kitRead"},
                },
                {
                    "action": "kit_write",
                    "description": "Write something to the kit's GraphQL server.",
                    "permission": "write",
                    "input": {"q": {"type": "string"}},
                    "config": {
                        "query": "mutation($q: String!) { kitWrite(q: $q) { seen blob } }",
                        "result": "kitWrite",
                    },
                },
            ],
        }
        if idempotency:
            doc["idempotency_header"] = "Idempotency-Key"
        return doc

    return Fixture(connector=connector, close=server.close, secret=SECRET, environ={"KIT_GRAPHQL_TOKEN": SECRET})
