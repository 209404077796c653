"""``reach.history`` (tool name ``reach__history``): the router answers an agent what it already
did, from its own history records (connectors/history.py, workers/state/history.py).

Asked by ``entity`` + ``id`` (an entity one of its bound actions or workflows declares) or by
``action`` (``connector.action``, or a workflow's name, bound to it), with ``since``, ``status``, ``limit`` (at most 50) and
``cursor``; newest first. Only the caller's records are read (every key and row is the agent's
own), and only those of actions bound to it now: a binding removed takes its past with it. A
param that cannot be answered is a VALIDATION_FAILED receipt naming the field, as for any action.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from connectors import history
from connectors.catalog import Catalog, split_action_name
from connectors.schema import FieldProblem
from producers.wire import HISTORY_ACTION, ErrorCode
from workers.observability import metrics
from workers.router.built_ins import built_in_answer, unregistered
from workers.router.decisions import Answer
from workers.router.intake import ParsedIntent
from workers.state.history import HistoryError, HistoryStore, Query, parse_cursor
from workers.transport.delivery import TRANSIENT_ERRORS

log = logging.getLogger("reach.router")
STORE_RETRY_MS = 5000

NAMES = (HISTORY_ACTION, history.TOOL_NAME)  # what an intent may call it: the action, or the tool
SUGGESTION = (
    'Send {"entity": "<name>", "id": "<value>"} or {"action": "connector.action"}, optionally with '
    '"since" (ISO 8601), "status", "limit" (1-50) and the "cursor" of the last answer.'
)


class HistoryAnswers:
    """The router's answers to ``reach.history`` (``store`` None: the fleet keeps no history)."""

    def __init__(self, catalog: Catalog, store: HistoryStore | None, max_details: int = 50) -> None:
        self.catalog = catalog
        self.store = store
        self.max_details = max_details
        self._entities: dict[str, list[str]] = {}  # agent -> entity names its bound actions declare

    def entities_of(self, agent_id: str) -> list[str]:
        found = self._entities.get(agent_id)
        if found is None:
            names: dict[str, None] = {}
            for ref in self.catalog.refs.values():
                if self.catalog.allows(agent_id, ref):
                    names.update((entity, None) for _, _, entity in history.entity_fields(ref.action))
            for name, flow in self.catalog.workflows.items():
                if self.catalog.allows_workflow(agent_id, name):
                    names.update((f.entity, None) for f in flow.input.values() if f.entity)
            found = self._entities[agent_id] = list(names)
        return found

    def visible(self, agent_id: str, connector: str, action: str) -> bool:
        """Whether the agent is bound now to the action (connector "": to the workflow)."""
        if not connector:
            return self.catalog.allows_workflow(agent_id, action)
        ref = self.catalog.refs.get((connector, action))
        return ref is not None and self.catalog.allows(agent_id, ref)

    def answer(self, parsed: ParsedIntent, received_at: float) -> Answer:
        intent = parsed.intent
        agent_id = intent.agent_id or ""

        def receipt(**outcome: Any) -> Answer:
            return built_in_answer(parsed, received_at, HISTORY_ACTION, **outcome)

        if agent_id not in self.catalog.agents:
            return unregistered(parsed, received_at, HISTORY_ACTION)
        query = self.query(agent_id, intent.params)
        if isinstance(query, list):
            metrics.INTENTS_REJECTED.labels(code=ErrorCode.VALIDATION_FAILED.value).inc()
            return receipt(
                code=ErrorCode.VALIDATION_FAILED,
                message="invalid params for reach.history: " + "; ".join(f"{p.field} {p.message}" for p in query[:3]),
                suggestion=SUGGESTION,
                details=[p.to_detail() for p in query[: self.max_details]],
            )
        if self.store is None:
            return receipt(
                code=ErrorCode.CONNECTOR_UNAVAILABLE,
                message="this fleet keeps no history",
                suggestion="Ask an operator; the router was started without a history store.",
                retry_after_ms=STORE_RETRY_MS,
            )
        try:
            page = self.store.query(agent_id, query, lambda c, a: self.visible(agent_id, c, a))
        except HistoryError as exc:
            return receipt(
                code=ErrorCode.VALIDATION_FAILED,
                message=f"invalid params for reach.history: cursor {exc}",
                suggestion=SUGGESTION,
                details=[{"field": "cursor", "code": "format", "message": str(exc)}],
            )
        except TRANSIENT_ERRORS:
            raise  # Redis away: the router requeues the intent, as for its guards
        except Exception as exc:  # the PostgreSQL store did not answer: a retryable refusal, not INTERNAL
            log.warning("history store did not answer for %s: %s: %s", agent_id, type(exc).__name__, exc)
            return receipt(
                code=ErrorCode.CONNECTOR_UNAVAILABLE,
                message="the history store did not answer",
                suggestion="Ask again in a few seconds.",
                retry_after_ms=STORE_RETRY_MS,
            )
        return receipt(data={"records": page.records, "next_cursor": page.next_cursor})

    def query(self, agent_id: str, params: dict[str, Any]) -> Query | list[FieldProblem]:
        """The store's query for ``params``, or what is wrong with them."""
        given = dict(params)
        if isinstance(given.get("id"), int) and not isinstance(given.get("id"), bool):
            given["id"] = str(given["id"])  # an integer entity's value, as the tool schema's string
        checked, problems = history.PARAMS.validate(given, max_problems=self.max_details)
        found: list[FieldProblem] = list(problems)
        if found:
            return found
        entity, value, action = checked.get("entity"), checked.get("id"), checked.get("action")
        query: dict[str, Any] = {"limit": checked.get("limit", 20), "status": checked.get("status")}
        if entity is None and action is None:
            found.append(FieldProblem("entity", "required", "give entity and id, or action"))
        if entity is not None:
            known = self.entities_of(agent_id)
            if entity not in known:
                listed = ", ".join(known[:15]) or "none"
                found.append(
                    FieldProblem("entity", "enum", f"is no entity of your actions (yours: {listed})", known[:15])
                )
            if value is None:
                found.append(FieldProblem("id", "required", "is required with entity"))
            query["entity"] = (entity, value)
        elif value is not None:
            found.append(FieldProblem("entity", "required", "is required with id"))
        if action is not None:
            connector, name = split_action_name(action)
            if not self.visible(agent_id, connector or "", name):
                found.append(FieldProblem("action", "enum", "is no connector.action (or workflow) bound to you"))
            else:
                query["action"] = (connector or "", name)
        since = checked.get("since")
        if since is not None:
            query["since_ms"] = int(datetime.fromisoformat(str(since).replace("Z", "+00:00")).timestamp() * 1000)
        cursor = checked.get("cursor")
        if cursor is not None:
            try:
                parse_cursor(cursor)
            except HistoryError as exc:
                found.append(FieldProblem("cursor", "format", str(exc)))
            query["cursor"] = cursor
        return found or Query(**query)
