"""What ``reach history`` does: an agent's history as ``reach.history`` answers it, a purge, and the
PostgreSQL schema. The commands in workers/cli/history.py are thin over these."""

from __future__ import annotations

from typing import Any

from connectors.catalog import Catalog
from connectors.history import longest_retention
from connectors.schema import FieldProblem
from workers.router.history_answers import HistoryAnswers
from workers.settings import Settings
from workers.state.client import connect_redis
from workers.state.history import HistoryStore, Page
from workers.state.history_stores import open_store


class BadQuery(ValueError):
    """The question cannot be asked as given (the same problems an agent's VALIDATION_FAILED names)."""

    def __init__(self, problems: list[FieldProblem]) -> None:
        super().__init__("; ".join(f"{p.field} {p.message}" for p in problems))
        self.problems = problems


def open_history(settings: Settings, catalog: Catalog | None) -> HistoryStore:
    """The fleet's history store, as its pools and router open it."""
    actions = [ref.action for ref in catalog.refs.values()] if catalog is not None else []
    return open_store(
        connect_redis(settings), settings.history_url, longest_retention(actions, settings.history_ttl_seconds)
    )


def entity_arg(text: str) -> tuple[str, str]:
    """``order:123`` -> ("order", "123"); raises ValueError without a ``:``."""
    name, sep, value = text.partition(":")
    if not sep or not name or not value:
        raise ValueError(f"{text!r} is not NAME:ID (e.g. order:123)")
    return name, value


def show(store: HistoryStore, catalog: Catalog, agent: str, params: dict[str, Any]) -> Page:
    """What ``reach.history`` with ``params`` answers ``agent`` (its records of actions bound to it now)."""
    answers = HistoryAnswers(catalog, store)
    query = answers.query(agent, params)
    if isinstance(query, list):
        raise BadQuery(query)
    return store.query(agent, query, lambda c, a: answers.visible(agent, c, a))


def migrate(settings: Settings, catalog: Catalog) -> list[str]:
    """Create (or bring up to date) the PostgreSQL schema and drop months past the longest retention."""
    from workers.state.history_pg import PostgresHistory

    if not settings.history_url:
        raise ValueError("REACH_HISTORY_URL is not set: history is kept in Redis, which needs no schema")
    store = PostgresHistory(settings.history_url)
    try:
        actions = [ref.action for ref in catalog.refs.values()]
        return store.migrate(longest_retention(actions, settings.history_ttl_seconds))
    finally:
        store.close()
