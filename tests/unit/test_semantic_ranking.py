"""The pure part of semantic routing: tokenising, BM25, fusion, the lead and margin, top-k, and the
action index with its cache (a counting stand-in for the model: the arithmetic is what is tested
here; the real models are exercised in test_semantic_router.py and the fleet test)."""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pytest

from connectors.catalog import ActionRef, Catalog, build
from connectors.loader import load_directory
from connectors.routing import ActionIndex, action_text, rank, top_k
from connectors.routing import index as index_module
from connectors.routing.embedders import Pair, Vectors
from connectors.routing.index import MAX_ACTION_CHARS, MAX_REQUEST_CHARS
from connectors.routing.lexical import BM25, tokens
from connectors.spec import RoutingWeights

CATALOG = """\
connector:
  name: it_desk
  description: IT service desk for laptops, passwords and VPN
  domain: it_ops
  endpoint: http://127.0.0.1:9
  actions:
    - action: create_ticket
      description: Open an IT ticket
      path: POST /t
      input:
        title: { type: string, required: true, description: Short summary }
        asset_tag: { type: string, description: Asset tag of the laptop }
---
connector:
  name: care_desk
  description: Customer care for orders, refunds and deliveries
  domain: customer_service
  endpoint: http://127.0.0.1:9
  actions:
    - action: create_ticket
      description: Open a customer case
      path: POST /t
      input:
        title: { type: string, required: true }
---
connector:
  name: fm_desk
  description: Facilities for lights, heating and cleaning
  endpoint: http://127.0.0.1:9
  actions:
    - action: create_ticket
      description: Report a building problem
      path: POST /t
      input:
        title: { type: string, required: true }
"""

# the stand-in model's axes: a text's vector counts these words, so cosines are predictable
AXES = ("laptop", "refund", "light")


class CountingEmbedder:
    """Embeds by counting words of AXES (plus a constant axis so no vector is zero)."""

    name = "counting@1"
    dim = len(AXES) + 1

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def embed(self, texts: Sequence[str], query: bool = False) -> Vectors:
        self.calls.append(list(texts))
        rows = np.array(
            [[t.lower().count(a) for a in AXES] + [0.1] for t in texts],
            dtype=np.float32,
        )
        return rows / np.linalg.norm(rows, axis=1, keepdims=True)

    @property
    def embedded(self) -> int:
        return sum(len(c) for c in self.calls)


class DictCache:
    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        return [self.data.get(k) for k in keys]

    def put_many(self, items: Mapping[str, bytes]) -> None:
        self.data.update(items)


def catalog_of(tmp_path: Path, text: str = CATALOG) -> Catalog:
    (tmp_path / "c.yaml").write_text(text)
    catalog, problems = build(load_directory(tmp_path))
    assert not problems
    return catalog


@pytest.fixture()
def catalog(tmp_path: Path) -> Catalog:
    return catalog_of(tmp_path)


def refs_of(catalog: Catalog) -> list[ActionRef]:
    return catalog.by_action["create_ticket"]


# -- tokens and BM25 ------------------------------------------------------------------------


def test_latin_words_are_lower_cased_split_at_punctuation_and_lose_a_plural_s() -> None:
    assert tokens("Create_Ticket: the VPN-Tickets, glass") == ["create", "ticket", "vpn", "ticket", "glass"]


def test_a_run_of_chinese_becomes_its_character_bigrams_and_a_lone_character_stays() -> None:
    assert tokens("电脑坏了") == ["电脑", "脑坏", "坏了"]
    assert tokens("灯 ok") == ["灯", "ok"]


def test_full_width_letters_are_read_as_ascii() -> None:
    assert tokens("ＶＰＮ") == ["vpn"]


def test_bm25_scores_only_documents_with_the_terms_and_rarer_terms_weigh_more() -> None:
    bm = BM25([tokens("laptop vpn"), tokens("laptop refund"), tokens("laptop light")])
    scores = bm.scores(tokens("refund"))
    assert scores[1] > 0 and scores[0] == 0 and scores[2] == 0
    both = BM25([tokens("laptop alpha"), tokens("laptop beta"), tokens("laptop gamma"), tokens("vpn delta")])
    scores = both.scores(tokens("laptop vpn"))
    assert scores[3] > scores[0] > 0  # the document with the rare term beats the one with the common term


def test_bm25_is_divided_by_the_most_the_request_could_score() -> None:
    bm = BM25([tokens("refund order"), tokens("light bulb")])
    alone = float(bm.scores(tokens("refund"))[0])
    with_unknown = float(bm.scores(tokens("refund zebra"))[0])
    assert 0 < with_unknown < alone <= 1
    assert float(bm.scores(tokens("zebra"))[0]) == 0.0


def test_bm25_scores_a_subset_of_rows_in_their_order() -> None:
    bm = BM25([tokens("a1 refund"), tokens("b2 light"), tokens("c3 refund refund")])
    everything = bm.scores(tokens("refund"))
    subset = bm.scores(tokens("refund"), np.array([2, 0], dtype=np.int64))
    assert list(subset) == [everything[2], everything[0]]


# -- action texts ---------------------------------------------------------------------------


def test_the_action_text_holds_what_a_model_can_know_of_the_action(catalog: Catalog) -> None:
    text = action_text(catalog.refs[("it_desk", "create_ticket")])
    for part in ("it desk", "it ops", "IT service desk", "create ticket", "Open an IT ticket", "asset tag: Asset tag"):
        assert part in text


def test_action_texts_and_requests_are_bounded(tmp_path: Path) -> None:
    long = CATALOG.replace("Open an IT ticket", "x" * 10_000)
    catalog = catalog_of(tmp_path, long)
    assert len(action_text(catalog.refs[("it_desk", "create_ticket")])) == MAX_ACTION_CHARS
    embedder = CountingEmbedder()
    index = ActionIndex(catalog, embedder)
    index.query_vector("refund " * 100_000)
    rank(index, refs_of(catalog), "laptop " * 100_000, RoutingWeights())
    assert all(len(t) <= MAX_REQUEST_CHARS for t in embedder.calls[-1])


# -- fusion ---------------------------------------------------------------------------------


def test_the_score_is_the_weighted_sum_of_the_paths(catalog: Catalog) -> None:
    index = ActionIndex(catalog, CountingEmbedder())
    weights = RoutingWeights(semantic=1.0, lexical=0.5, domain=0.0, agent_domain=0.0)
    ranking = rank(index, refs_of(catalog), "my laptop", weights)
    for s in ranking.ranked:
        assert s.semantic is not None and s.lexical is not None
        assert math.isclose(s.score, s.semantic + 0.5 * s.lexical, rel_tol=1e-5)
    assert ranking.ranked[0].ref.connector.name == "it_desk"


def test_the_request_picks_the_connector_whose_text_it_matches(catalog: Catalog) -> None:
    index = ActionIndex(catalog, CountingEmbedder())
    for request, expected in (("I want a refund", "care_desk"), ("the light is off", "fm_desk")):
        assert rank(index, refs_of(catalog), request, RoutingWeights()).ranked[0].ref.connector.name == expected


def test_domain_rules_add_their_weights(catalog: Catalog) -> None:
    weights = RoutingWeights(domain=0.3, agent_domain=0.1)
    ranking = rank(None, refs_of(catalog), None, weights, context_domain="it_ops", agent_domain="customer_service")
    scores = {s.ref.connector.name: s.score for s in ranking.ranked}
    assert scores == {"it_desk": pytest.approx(0.3), "care_desk": pytest.approx(0.1), "fm_desk": 0.0}


def test_without_a_description_no_model_runs_and_only_rules_count(catalog: Catalog) -> None:
    embedder = CountingEmbedder()
    index = ActionIndex(catalog, embedder)
    ranking = rank(index, refs_of(catalog), "   ", RoutingWeights())
    assert embedder.calls == [] and all(s.semantic is None and s.lexical is None for s in ranking.ranked)


def test_ties_are_ordered_by_name_and_a_tie_has_no_winner(catalog: Catalog) -> None:
    ranking = rank(None, refs_of(catalog), None, RoutingWeights())
    assert [s.ref.qualified for s in ranking.ranked] == sorted(r.qualified for r in refs_of(catalog))
    assert ranking.lead == 0 and ranking.winner(0.01) is None


def test_the_winner_needs_a_lead_of_at_least_the_margin(catalog: Catalog) -> None:
    weights = RoutingWeights(domain=0.25, agent_domain=0.0)
    ranking = rank(None, refs_of(catalog), None, weights, context_domain="it_ops")
    assert ranking.lead == pytest.approx(0.25)
    winner = ranking.winner(0.25)
    assert winner is not None and winner.ref.connector.name == "it_desk"
    assert ranking.winner(0.2501) is None


@pytest.mark.parametrize(
    "margin, confirm_margin, tier",
    [
        (0.25, 0.1, "dispatch"),  # the lead (0.25) reaches the margin
        (0.3, 0.1, "confirm"),  # between the lower bound and the margin
        (0.3, 0.25, "confirm"),  # the lower bound itself is in the confirm tier
        (0.3, 0.2501, "open"),  # below the lower bound
        (0.3, 0.3, "open"),  # a lower bound at the margin leaves no confirm tier
        (0.3, 0.5, "open"),  # ... and one above it too
    ],
)
def test_the_lead_sets_the_tier(catalog: Catalog, margin: float, confirm_margin: float, tier: str) -> None:
    weights = RoutingWeights(domain=0.25, agent_domain=0.0)
    ranking = rank(None, refs_of(catalog), None, weights, context_domain="it_ops")
    assert ranking.tier(margin, confirm_margin) == tier
    assert (ranking.winner(margin) is not None) == (tier == "dispatch")


def test_a_tie_is_open_whatever_the_lower_bound(catalog: Catalog) -> None:
    ranking = rank(None, refs_of(catalog), None, RoutingWeights())
    assert ranking.lead == 0 and ranking.tier(0.1, 0.0) == "open"


def test_one_candidate_always_leads(catalog: Catalog) -> None:
    ranking = rank(None, refs_of(catalog)[:1], None, RoutingWeights())
    assert ranking.lead == math.inf and ranking.winner(5.0) is not None and ranking.tier(5.0, 0.0) == "dispatch"


def test_top_k_returns_the_best_k_in_order(catalog: Catalog) -> None:
    index = ActionIndex(catalog, CountingEmbedder())
    found = top_k(index, refs_of(catalog), "refund please", 2, RoutingWeights())
    assert [s.ref.connector.name for s in found][0] == "care_desk" and len(found) == 2
    assert found[0].score >= found[1].score
    assert len(top_k(index, refs_of(catalog), "refund", 50, RoutingWeights())) == 3
    assert top_k(index, refs_of(catalog), "", 3, RoutingWeights()) == []


# -- the index and its cache ----------------------------------------------------------------


def test_each_action_text_is_embedded_once_and_kept_in_the_cache(catalog: Catalog) -> None:
    embedder, cache = CountingEmbedder(), DictCache()
    index = ActionIndex(catalog, embedder, cache)
    index.prepare()
    index.prepare()
    assert embedder.embedded == 3 and index.embedded == 3 and len(cache.data) == 3
    assert all(len(v) == embedder.dim * 4 for v in cache.data.values())


class ThreadedEmbedder(CountingEmbedder):
    """A model that allows calls from several threads (as use-m3 does): each call waits for a
    second one to start, so it fails unless batches really run side by side."""

    parallel_batches = True

    def __init__(self) -> None:
        super().__init__()
        self.together = threading.Barrier(2, timeout=10)
        self.threads: set[str] = set()
        self.lock = threading.Lock()
        self.started = 0

    def embed(self, texts: Sequence[str], query: bool = False) -> Vectors:
        with self.lock:
            self.threads.add(threading.current_thread().name)
            self.started += 1
            first_two = self.started <= 2
        if first_two:
            self.together.wait()
        return super().embed(texts, query)


def test_a_model_that_allows_it_fills_the_index_two_batches_at_once(
    catalog: Catalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(index_module, "EMBED_BATCH", 1)  # three texts, three batches
    embedder, cache = ThreadedEmbedder(), DictCache()
    index = ActionIndex(catalog, embedder, cache)
    index.prepare()
    assert len(embedder.threads) == 2 and embedder.embedded == 3 and index.embedded == 3
    alone = ActionIndex(catalog, CountingEmbedder())
    alone.prepare()
    assert np.array_equal(index.vectors, alone.vectors)  # each vector in its own row
    assert len(cache.data) == 3


def test_a_restart_with_a_warm_cache_embeds_nothing(catalog: Catalog) -> None:
    cache = DictCache()
    ActionIndex(catalog, CountingEmbedder(), cache).prepare()
    embedder = CountingEmbedder()
    again = ActionIndex(catalog, embedder, cache)
    again.prepare()
    assert embedder.calls == [] and again.from_cache == 3
    first = ActionIndex(catalog, CountingEmbedder())
    first.prepare()
    assert np.allclose(again.vectors, first.vectors)


def test_a_changed_description_embeds_that_action_only(catalog: Catalog, tmp_path: Path) -> None:
    cache = DictCache()
    ActionIndex(catalog, CountingEmbedder(), cache).prepare()
    (tmp_path / "changed").mkdir()
    changed = catalog_of(
        tmp_path / "changed", CATALOG.replace("Report a building problem", "Report a broken light in a building")
    )
    embedder = CountingEmbedder()
    index = ActionIndex(changed, embedder, cache)
    index.prepare()
    assert index.embedded == 1 and index.from_cache == 2
    assert embedder.calls == [[action_text(changed.refs[("fm_desk", "create_ticket")])]]


def test_a_cached_value_of_the_wrong_size_is_embedded_again(catalog: Catalog) -> None:
    cache = DictCache()
    index = ActionIndex(catalog, CountingEmbedder(), cache)
    index.prepare()
    key = next(iter(cache.data))
    cache.data[key] = b"\x00" * 3
    again = ActionIndex(catalog, CountingEmbedder(), cache)
    again.prepare()
    assert again.embedded == 1


def test_recent_requests_are_embedded_once(catalog: Catalog) -> None:
    embedder = CountingEmbedder()
    index = ActionIndex(catalog, embedder)
    index.prepare()
    before = embedder.embedded
    for _ in range(3):
        rank(index, refs_of(catalog), "refund", RoutingWeights())
    assert embedder.embedded == before + 1 and index.queries_embedded == 1


def test_without_a_model_the_lexical_path_still_ranks(catalog: Catalog) -> None:
    index = ActionIndex(catalog, None)
    ranking = rank(index, refs_of(catalog), "refund for my order", RoutingWeights())
    assert ranking.ranked[0].ref.connector.name == "care_desk"
    assert all(s.semantic is None for s in ranking.ranked)


def test_few_rows_and_many_rows_score_alike(tmp_path: Path) -> None:
    """A few candidates are gathered from the matrix, many (find_tools) are read in one pass."""
    extra = "".join(
        f"---\nconnector:\n  name: sys_{i}\n  description: System {i} with a laptop and a light\n"
        f"  endpoint: http://127.0.0.1:9\n  actions:\n    - {{ action: act_{i}, path: POST /a, description: refund {i} }}\n"
        for i in range(30)
    )
    catalog = catalog_of(tmp_path, CATALOG + extra)
    index = ActionIndex(catalog, CountingEmbedder())
    index.prepare()
    every = index.vectors @ index.query_vector("a laptop refund")
    few = np.array([0, 5], dtype=np.int64)
    many = np.arange(len(index.refs), dtype=np.int64)[::-1].copy()
    for rows in (few, many):
        scores = index.semantic("a laptop refund", rows)
        assert scores is not None and np.allclose(scores, every[rows])


def test_words_every_candidate_has_do_not_count_on_the_lexical_path(catalog: Catalog) -> None:
    """ "create ticket" is in every create_ticket text: by BM25's length normalisation it would
    favour the shortest text, so a request made only of it gets no lexical lead."""
    index = ActionIndex(catalog, None)
    ranking = rank(index, refs_of(catalog), "please create a ticket", RoutingWeights())
    assert all(s.lexical == 0.0 for s in ranking.ranked) and ranking.lead == 0
    # a word only one candidate has still counts, next to the shared ones
    ranking = rank(index, refs_of(catalog), "create a ticket for a refund", RoutingWeights())
    assert ranking.ranked[0].ref.connector.name == "care_desk" and ranking.ranked[0].lexical
    # in reach.find_tools the action name tells tools apart: nothing is dropped there
    found = top_k(index, refs_of(catalog), "ticket", 3, RoutingWeights())
    assert all(s.lexical for s in found)


class NamedEmbedder(CountingEmbedder):
    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name


def test_each_model_of_a_pair_is_cached_on_its_own(catalog: Catalog) -> None:
    """A pair's rows are its models' rows side by side, each kept under its own model's key: the
    model used alone later, or the pair weighted otherwise, embeds nothing again."""
    cache = DictCache()
    first, second = NamedEmbedder("one@1"), NamedEmbedder("two@1")
    pair = Pair(first, second, scale=4.0)
    index = ActionIndex(catalog, pair, cache)
    index.prepare()
    assert sorted(k.split(":")[0] for k in cache.data) == ["one@1"] * 3 + ["two@1"] * 3
    assert (index.embedded, index.from_cache) == (3, 0)
    assert np.allclose(index.vectors, pair.embed(index.texts))
    alone = NamedEmbedder("one@1")
    again = ActionIndex(catalog, alone, cache)
    again.prepare()
    assert alone.calls == [] and again.from_cache == 3
    assert np.allclose(again.vectors, first.embed(again.texts))
    reweighted = Pair(NamedEmbedder("one@1"), NamedEmbedder("two@1"), scale=1.0)
    third = ActionIndex(catalog, reweighted, cache)
    third.prepare()
    assert third.embedded == 0 and np.allclose(third.vectors, reweighted.embed(third.texts))
    text = index.texts[0]
    assert index.cache_keys(text) == [index.cache_key(text, first), index.cache_key(text, second)]
    assert set(index.cache_keys(text)) <= set(cache.data)
