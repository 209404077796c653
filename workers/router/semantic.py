"""Choosing between the connectors that offer one bare action (docs/contract.md "Semantic routing").

For a bare action the agent may use on several connectors, in this order:

1. ``context.domain`` names exactly one candidate's domain: that one (as before semantic routing).
2. The router's rule checks (time windows, params) remove the candidates that could not run the
   intent; if one is left, it is the answer.
3. The rest are ranked (``connectors.routing.rank``): the request in ``context.description``
   against each action's text by embedding and BM25, plus the domain rules. The best is
   dispatched when it leads the next by the catalog's ``routing.margin``; otherwise the agent gets
   AMBIGUOUS_ACTION, so it can ask its user: with the best two, the first suggested, when the lead
   is at least ``routing.confirm_margin`` (tier ``confirm``: one yes/no question settles it), else
   with every candidate (tier ``open``).

Every choice carries a note (method, tier, candidates, scores, lead) that the router puts in the job,
the receipt's ``execution.routing`` and the audit trail. The model is loaded at start-up when the
catalog has an action that several connectors offer, else on first use; an intent that names an
exact action, or a bare action only one of its connectors offers, never reaches this module.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from connectors.catalog import ActionRef, Candidates, Catalog, tool_spec, workflow_tool
from connectors.routing import ActionIndex, ModelUnavailable, Ranking, Scored, Tier, VectorCache, load_embedder, rank
from connectors.routing.index import request_text
from connectors.routing.ranking import best_rows
from producers.tools import ToolSpec

log = logging.getLogger("reach.routing")

NOTE_CANDIDATES = 10  # candidates a note lists (scored, then removed); the rest are counted
DETAIL_CANDIDATES = 5  # candidates an AMBIGUOUS_ACTION receipt lists in its details (tier open)


@dataclass(frozen=True)
class Choice:
    """The chosen candidate (None: ambiguous, or not allowed to rank now) and why."""

    ref: ActionRef | None
    note: dict[str, Any]
    ranking: Ranking | None = None
    retry_after_ms: int | None = None  # the agent's allowance of model work is spent
    removed: dict[str, str] = field(default_factory=dict)  # qualified action -> why it could not run

    @property
    def tier(self) -> Tier | None:
        """``dispatch``, ``confirm`` or ``open`` (None: not ranked now, the agent must wait)."""
        tier: Tier | None = self.note.get("tier")
        return tier


@dataclass(frozen=True)
class FoundTool:
    """One of reach.find_tools' answers: an action's or a workflow's tool, and its score."""

    tool: ToolSpec
    score: float


class SemanticRouting:
    """The catalog's action index (loaded once) and the choice between candidates."""

    def __init__(
        self,
        catalog: Catalog,
        cache: VectorCache | None = None,
        loader: Callable[[str], Any] = load_embedder,
        *,
        embed_all: bool = True,
    ) -> None:
        """``embed_all`` False: embed an action only when it is ranked (``reach route``: a tool
        that ranks a few candidates need not embed a whole catalog the cache does not hold)."""
        self.catalog = catalog
        self.embed_all = embed_all
        self.spec = catalog.routing
        self.cache = cache
        self._loader = loader
        self._index: ActionIndex | None = None
        self._lock = threading.Lock()
        self._tools: dict[str, tuple[list[ToolSpec], npt.NDArray[np.int64]]] = {}
        self.load_seconds: float | None = None

    @property
    def loaded(self) -> ActionIndex | None:
        """The index if it was built (the benchmark and tests look at its counters)."""
        return self._index

    def index(self) -> ActionIndex:
        """The index of every action, built on first use: the model loaded and every action's
        embedding taken from the cache or computed."""
        if self._index is not None:
            return self._index
        with self._lock:
            if self._index is None:
                started = time.monotonic()
                try:
                    embedder = self._loader(self.spec.model)
                except ModelUnavailable as exc:
                    # keep routing: BM25 and the rules still rank, and the notes say model none
                    log.error("semantic routing without a model: %s", exc)
                    embedder = None
                index = ActionIndex(self.catalog, embedder, self.cache)
                if self.embed_all:
                    index.prepare()
                self.load_seconds = time.monotonic() - started
                log.info(
                    "semantic routing: model %s, %d action(s) (%d from the cache, %d embedded) in %.1f s",
                    embedder.name if embedder else "none",
                    len(index.refs),
                    index.from_cache,
                    index.embedded,
                    self.load_seconds,
                )
                self._index = index
        return self._index

    def warm(self) -> None:
        """Build the index now if some bare action is offered by several connectors (start-up)."""
        if self.catalog.shares_actions():
            self.index()

    def choose(
        self,
        candidates: Candidates,
        agent_id: str,
        description: str | None,
        context_domain: str | None,
        runnable: Callable[[ActionRef], str | None],
        allowance: Callable[[], int | None] = lambda: None,
    ) -> Choice:
        """Pick one of ``candidates`` for the agent's intent.

        Args:
            runnable: why a candidate could not run this intent (closed window, bad params), or None.
            allowance: asked once before a model runs: None when the agent may spend model work
                now, else the milliseconds until it may.
        """
        refs = candidates.refs
        if context_domain:
            in_domain = [r for r in refs if r.connector.domain == context_domain]
            if len(in_domain) == 1:
                return Choice(in_domain[0], self._note("domain", [], {}, None, refs=refs, tier="dispatch"))
        removed: dict[str, str] = {}
        kept = []
        for ref in refs:
            reason = runnable(ref)
            if reason is None:
                kept.append(ref)
            else:
                removed[ref.qualified] = reason
        if len(kept) == 1:
            note = self._note("rules", [], removed, None, refs=kept, tier="dispatch")
            return Choice(kept[0], note, removed=removed)
        pool = kept or refs  # none could run: rank them all; the winner's own refusal is then the answer
        text = request_text(description or "")
        agent = self.catalog.agents.get(agent_id)
        agent_domain = agent.domain if agent else None
        if text:
            wait_ms = allowance()
            if wait_ms is not None:
                return Choice(None, self._note("rate_limited", [], removed, None), retry_after_ms=wait_ms)
            index = self.index()
            method = "semantic" if index.embedder is not None else "lexical"
            ranking = rank(
                index,
                pool,
                text,
                self.spec.weights,
                context_domain=context_domain,
                agent_domain=agent_domain,
            )
        else:
            method = "rules"
            ranking = rank(
                None, pool, None, self.spec.weights, context_domain=context_domain, agent_domain=agent_domain
            )
        tier = ranking.tier(self.spec.margin, self.spec.confirm_margin)
        note = self._note(method, ranking.ranked, removed, ranking, tier=tier)
        return Choice(ranking.ranked[0].ref if tier == "dispatch" else None, note, ranking, removed=removed)

    def find_tools(self, agent_id: str, description: str, k: int) -> list[FoundTool]:
        """The agent's ``k`` tools that best match ``description``: the actions it may use and the
        workflows it is bound to, ranked together."""
        index = self.index()
        tools = self._tools.get(agent_id)
        if tools is None:
            catalog = self.catalog
            refs = [r for r in catalog.refs.values() if catalog.allows(agent_id, r)]
            agent = catalog.agents.get(agent_id)
            flows = [catalog.workflows[n] for n in (agent.workflows if agent else []) if n in catalog.workflows]
            specs = [tool_spec(r) for r in refs] + [workflow_tool(w) for w in flows]
            rows = [index.row(r) for r in refs] + [index.workflow_rows[w.name] for w in flows]
            tools = (specs, np.array(rows, dtype=np.int64))
            self._tools[agent_id] = tools  # agents are the catalog's: bounded
        return [
            FoundTool(tools[0][found.at], found.score)
            for found in best_rows(index, tools[1], description, k, self.spec.weights)
        ]

    def model_name(self) -> str:
        index = self._index
        if index is None:
            return self.spec.model
        return index.embedder.name if index.embedder else "none"

    def _note(
        self,
        method: str,
        ranked: list[Scored],
        removed: dict[str, str],
        ranking: Ranking | None,
        refs: list[ActionRef] | None = None,
        tier: Tier | None = None,
    ) -> dict[str, Any]:
        """What the receipt and the audit trail say about the choice (bounded in size)."""
        listed: list[dict[str, Any]] = [s.to_dict() for s in ranked[:NOTE_CANDIDATES]]
        if not ranked and refs:
            listed = [{"action": r.qualified} for r in refs[:NOTE_CANDIDATES]]
        listed += [{"action": q, "removed": why[:200]} for q, why in list(removed.items())[:NOTE_CANDIDATES]]
        note: dict[str, Any] = {"method": method, "candidates": listed}
        if tier is not None:
            note["tier"] = tier
        hidden = max(0, len(ranked) - NOTE_CANDIDATES) + max(0, len(removed) - NOTE_CANDIDATES)
        if hidden:
            note["more_candidates"] = hidden
        if method in ("semantic", "lexical"):
            note["model"] = self.model_name()
        if ranking is not None and len(ranking.ranked) > 1:
            note["lead"] = round(ranking.lead, 4)
            note["margin"] = self.spec.margin
            note["confirm_margin"] = self.spec.confirm_margin
        return note


def candidate_details(choice: Choice, candidates: Candidates) -> list[dict[str, Any]]:
    """The ``details`` of an AMBIGUOUS_ACTION receipt, best first, each with what its connector
    is for and its score, so the agent can ask its user: in the confirm tier exactly the best two,
    the first ``suggested``; else the best ``DETAIL_CANDIDATES``."""
    if choice.ranking is not None:
        scored: list[tuple[ActionRef, float | None]] = [(s.ref, s.score) for s in choice.ranking.ranked]
    else:
        scored = [(r, None) for r in candidates.refs]
    confirm = choice.tier == "confirm"
    details = []
    for i, (ref, score) in enumerate(scored[: 2 if confirm else DETAIL_CANDIDATES]):
        detail: dict[str, Any] = {
            "action": ref.qualified,
            "connector": ref.connector.name,
            "description": describe(ref),
        }
        if score is not None:
            detail["score"] = round(score, 4)
        if confirm:
            detail["suggested"] = i == 0
        details.append(detail)
    return details


def describe(ref: ActionRef) -> str:
    """What a candidate's connector is for, as the user is asked about it (bounded)."""
    return (ref.connector.description or ref.action.description or "")[:300]
