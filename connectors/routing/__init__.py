"""Semantic routing, the pure part: which of several connectors offering one bare action a
request in natural language means (design.md section 9, docs/contract.md "Semantic routing").

Two recall paths are fused with the domain rules: a multilingual sentence embedding of the
request against each action's text (``embedders``, ``index``), and BM25 over the same texts
(``lexical``); ``ranking`` adds them up and says the tier of the answer (dispatch, confirm, open).
An action's ``examples`` are rows of the index of their own. ``saved`` keeps the vectors in a file
beside the catalog (``reach route warm``). The router (``workers/router/semantic.py``) removes
candidates its rule checks refuse, and dispatches only on a clear lead.
"""

from connectors.routing.embedders import Embedder, ModelUnavailable, load_embedder
from connectors.routing.index import ActionIndex, VectorCache, action_text
from connectors.routing.ranking import TIERS, Ranking, Scored, Tier, rank, top_k

__all__ = [
    "ActionIndex",
    "Embedder",
    "ModelUnavailable",
    "Ranking",
    "Scored",
    "TIERS",
    "Tier",
    "VectorCache",
    "action_text",
    "load_embedder",
    "rank",
    "top_k",
]
