"""Fusion: one score per candidate from the embedding path, the lexical path and the domain rules.

    score = w.semantic * (cosine(request, action text)
                          + w.examples * max(0, cosine(request, best example) - cosine(request, action text)))
          + w.lexical  * BM25(request, action text) / the most the request could score
          + w.domain   * [connector domain == context.domain]
          + w.agent_domain * [connector domain == the agent app's domain]

A weighted sum, not a rank fusion: the router dispatches only when the best candidate leads the
next by the catalog's ``margin``, and a lead needs scores on one scale (ranks would make a tie
and a landslide look the same).

The lead also sets the tier of the answer (``Ranking.tier``): ``dispatch`` at the margin or more;
``confirm`` from the catalog's ``confirm_margin`` up to the margin (the agent asks its user one
yes/no question about the best two); ``open`` below it (the user chooses among every candidate).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from connectors.catalog import ActionRef
from connectors.routing.index import ActionIndex, request_text
from connectors.routing.lexical import tokens
from connectors.spec import RoutingWeights

Tier = Literal["dispatch", "confirm", "open"]
TIERS: tuple[Tier, ...] = ("dispatch", "confirm", "open")


@dataclass(frozen=True)
class Scored:
    """One candidate's score and what it is made of (None: that path did not run)."""

    ref: ActionRef
    score: float
    semantic: float | None = None
    lexical: float | None = None
    rules: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"action": self.ref.qualified, "score": round(self.score, 4)}
        for part in ("semantic", "lexical"):
            value = getattr(self, part)
            if value is not None:
                doc[part] = round(value, 4)
        if self.rules:
            doc["rules"] = round(self.rules, 4)
        return doc


@dataclass(frozen=True)
class Ranking:
    """Candidates, best first."""

    ranked: list[Scored]

    @property
    def lead(self) -> float:
        """How far the best is ahead of the next (infinite for a single candidate)."""
        if len(self.ranked) < 2:
            return math.inf
        return self.ranked[0].score - self.ranked[1].score

    def winner(self, margin: float) -> Scored | None:
        """The best candidate if it leads by at least ``margin``."""
        if self.ranked and self.lead >= margin:
            return self.ranked[0]
        return None

    def tier(self, margin: float, confirm_margin: float) -> Tier:
        """``dispatch`` (the lead is at least ``margin``), ``confirm`` (at least
        ``confirm_margin``: the best two are offered, the first suggested) or ``open``."""
        if not self.ranked:
            return "open"
        lead = self.lead
        if lead >= margin:
            return "dispatch"
        if len(self.ranked) >= 2 and lead >= confirm_margin and lead > 0:
            return "confirm"  # a tie suggests nothing: it stays open
        return "open"


def rule_score(ref: ActionRef, weights: RoutingWeights, context_domain: str | None, agent_domain: str | None) -> float:
    domain = ref.connector.domain
    if domain is None:
        return 0.0
    return weights.domain * (domain == context_domain) + weights.agent_domain * (domain == agent_domain)


def telling_terms(index: ActionIndex, rows: npt.NDArray[np.int64], terms: list[str]) -> list[str]:
    """The request's terms less those every candidate's text has: the bare action's own words
    ("ticket" for create_ticket) cannot tell the candidates apart, and through BM25's length
    normalisation they favour the shortest text (the routing set's dev split: leaving them out
    defers fewer clear requests at zero ambiguous dispatches)."""
    if len(rows) < 2 or not terms:
        return terms
    shared = set(terms).intersection(*(index.terms(r) for r in rows.tolist()))
    return [t for t in terms if t not in shared] if shared else terms


def rank(
    index: ActionIndex | None,
    refs: Sequence[ActionRef],
    description: str | None,
    weights: RoutingWeights,
    *,
    context_domain: str | None = None,
    agent_domain: str | None = None,
) -> Ranking:
    """Score ``refs`` for a request; without a description only the rules count (no model runs,
    and ``index`` may be None)."""
    rules = [rule_score(r, weights, context_domain, agent_domain) for r in refs]
    text = request_text(description or "")
    if not text:
        return Ranking(sorted((Scored(r, s, rules=s) for r, s in zip(refs, rules)), key=_best_first))
    if index is None:
        raise ValueError("ranking a description needs the action index")
    rows = np.array([index.row(r) for r in refs], dtype=np.int64)
    semantic = index.semantic(text, rows, weights.examples)
    lexical = index.lexical.scores(telling_terms(index, rows, tokens(text)), rows)
    scored = []
    for i, ref in enumerate(refs):
        sem = None if semantic is None else float(semantic[i])
        lex = float(lexical[i])
        total = weights.semantic * (sem or 0.0) + weights.lexical * lex + rules[i]
        scored.append(Scored(ref, total, sem, lex, rules[i]))
    return Ranking(sorted(scored, key=_best_first))


def top_k(
    index: ActionIndex,
    refs: Sequence[ActionRef],
    description: str,
    k: int,
    weights: RoutingWeights,
    rows: npt.NDArray[np.int64] | None = None,
) -> list[Scored]:
    """The ``k`` actions of ``refs`` that best match a request; ``rows``: their rows in the
    index, when the caller keeps them."""
    if rows is None:
        rows = np.array([index.row(r) for r in refs], dtype=np.int64)
    return [
        Scored(refs[found.at], found.score, found.semantic, found.lexical)
        for found in best_rows(index, rows, description, k, weights)
    ]


@dataclass(frozen=True)
class RowScore:
    """One row's score for a request; ``at``: its position in the rows that were ranked."""

    at: int
    score: float
    semantic: float | None
    lexical: float


def best_rows(
    index: ActionIndex,
    rows: npt.NDArray[np.int64],
    description: str,
    k: int,
    weights: RoutingWeights,
) -> list[RowScore]:
    """The ``k`` of ``rows`` (actions or workflows) that best match a request, best first
    (reach.find_tools: the action name tells tools apart, so no term is dropped)."""
    text = request_text(description)
    if not len(rows) or not text:
        return []
    semantic = index.semantic(text, rows, weights.examples)
    lexical = index.lexical.scores(tokens(text), rows)
    total = weights.lexical * lexical
    if semantic is not None:
        total = total + weights.semantic * semantic
    k = min(k, len(rows))
    best = np.argpartition(-total, k - 1)[:k] if k < len(rows) else np.arange(len(rows))
    best = best[np.argsort(-total[best], kind="stable")]
    return [
        RowScore(int(i), float(total[i]), None if semantic is None else float(semantic[i]), float(lexical[i]))
        for i in best
    ]


def _best_first(s: Scored) -> tuple[float, str]:
    return (-s.score, s.ref.qualified)  # ties in catalog-name order, so a ranking is repeatable
