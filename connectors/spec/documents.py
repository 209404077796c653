"""The catalog's document types: what the top-level key of one YAML document holds.

A catalog file holds several documents; each has exactly one top-level key, and the loader picks
the model by that key. A new document type is a wrapper here and a branch in connectors/loader.py.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from connectors.spec.agent_app import AgentApp
from connectors.spec.base import ApproverGroup, Person, Spec
from connectors.spec.connector import ConnectorSpec

# sentence-embedding models semantic routing can use (connectors/routing/embedders.py); "none"
# ranks by the lexical scorer and the domain rules only
EmbeddingModel = Literal["use-m3+e5-small", "use-m3", "e5-small", "none"]


class RoutingWeights(Spec):
    """How much each path counts in a candidate's score (docs/contract.md "Semantic routing")."""

    semantic: float = Field(default=1.0, ge=0, le=10)  # cosine of description and action text
    lexical: float = Field(default=0.05, ge=0, le=10)  # BM25 over the most the request could score, in [0, 1]
    domain: float = Field(default=0.3, ge=0, le=10)  # the connector's domain is the intent's context.domain
    # ... or the agent app's own domain: above the margin, so it decides when nothing else differs,
    # yet a clear description for another connector outweighs it
    agent_domain: float = Field(default=0.05, ge=0, le=10)
    # how far an action's best example request (its `examples:`) may lift its cosine toward that
    # example's: 0 ignores examples, 1 takes the best of text and examples
    examples: float = Field(default=0.25, ge=0, le=1)


class RoutingSpec(Spec):
    """The catalog's ``routing:`` document: how a bare action offered by several of an agent's
    connectors is routed. At most one per catalog; without one these defaults apply."""

    model: EmbeddingModel = "use-m3+e5-small"
    # the winner must lead the runner-up by this much, else AMBIGUOUS_ACTION; this default, the
    # lexical weight's and confirm_margin's are calibrated on bench/routing_set's dev split (BENCHMARKS.md)
    margin: float = Field(default=0.0397, ge=0, le=10)
    # the lower bound of the confirm tier: a lead from here up to the margin is answered with the
    # best two only, the first suggested (one yes/no question); a smaller lead with every candidate.
    # At or above the margin: no confirm tier
    confirm_margin: float = Field(default=0.006, ge=0, le=10)
    weights: RoutingWeights = Field(default_factory=RoutingWeights)


class ConnectorDocument(Spec):
    connector: ConnectorSpec


class AgentAppDocument(Spec):
    agent_app: AgentApp


class RoutingDocument(Spec):
    routing: RoutingSpec


class ApproversDocument(Spec):
    """``approvers:`` maps each approver group to the people in it (several documents may add groups)."""

    approvers: dict[ApproverGroup, Annotated[list[Person], Field(min_length=1, max_length=1000)]]
