"""Example requests per action (``examples:``, issue 35): bounded by the catalog model, embedded
once and cached like action texts, read by BM25 as part of the action's text, and lifting an
action's semantic score by ``weights.examples`` toward its best example's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from connectors.catalog import Catalog, build
from connectors.loader import load_directory
from connectors.routing import ActionIndex, rank
from connectors.spec import RoutingWeights
from tests.unit.test_semantic_ranking import CATALOG, CountingEmbedder, DictCache, catalog_of, refs_of

# it_desk's action gains two example requests; the other desks have none
WITH_EXAMPLES = CATALOG.replace(
    "      description: Open an IT ticket\n",
    "      description: Open an IT ticket\n      examples: ['laptop refund refund', '退款 for my monitor']\n",
)
NO_LEXICAL = RoutingWeights(lexical=0.0, domain=0.0, agent_domain=0.0)


@pytest.fixture()
def catalog(tmp_path: Path) -> Catalog:
    return catalog_of(tmp_path, WITH_EXAMPLES)


def test_an_example_lifts_its_action_by_the_examples_weight(catalog: Catalog) -> None:
    index = ActionIndex(catalog, CountingEmbedder())
    request = "refund refund laptop"
    plain = rank(index, refs_of(catalog), request, NO_LEXICAL.model_copy(update={"examples": 0.0}))
    assert plain.ranked[0].ref.connector.name == "care_desk"  # "refunds" is in customer care's text
    text_cosine = {s.ref.connector.name: s.semantic for s in plain.ranked}
    best = rank(index, refs_of(catalog), request, NO_LEXICAL.model_copy(update={"examples": 1.0}))
    assert best.ranked[0].ref.connector.name == "it_desk"
    it = next(s for s in best.ranked if s.ref.connector.name == "it_desk")
    assert it.semantic == pytest.approx(1.0, abs=1e-5)  # the example has the request's words
    half = rank(index, refs_of(catalog), request, NO_LEXICAL.model_copy(update={"examples": 0.5}))
    lifted = next(s for s in half.ranked if s.ref.connector.name == "it_desk").semantic
    assert text_cosine["it_desk"] is not None and lifted is not None
    assert lifted == pytest.approx(text_cosine["it_desk"] + 0.5 * (1.0 - text_cosine["it_desk"]), abs=1e-5)
    # an action without examples keeps its text's cosine
    for s in half.ranked:
        if s.ref.connector.name != "it_desk":
            assert s.semantic == pytest.approx(text_cosine[s.ref.connector.name])


def test_examples_are_embedded_once_and_cached_and_a_changed_one_alone_is_embedded_again(
    catalog: Catalog, tmp_path: Path
) -> None:
    embedder, cache = CountingEmbedder(), DictCache()
    ActionIndex(catalog, embedder, cache).prepare()
    assert embedder.embedded == 5 and len(cache.data) == 5  # three action texts, two examples
    again = CountingEmbedder()
    ActionIndex(catalog, again, cache).prepare()
    assert again.calls == []
    (tmp_path / "changed").mkdir()
    changed = catalog_of(
        tmp_path / "changed", WITH_EXAMPLES.replace("'laptop refund refund'", "'a refund of my laptop'")
    )
    third = CountingEmbedder()
    index = ActionIndex(changed, third, cache)
    index.prepare()
    assert third.calls == [["a refund of my laptop"]] and index.from_cache == 4


def test_bm25_reads_the_examples_as_part_of_the_action(catalog: Catalog) -> None:
    index = ActionIndex(catalog, None)
    rows = np.array([index.row(r) for r in refs_of(catalog)], dtype=np.int64)
    scores = dict(zip((r.connector.name for r in refs_of(catalog)), index.lexical.scores(["退款"], rows)))
    assert scores["it_desk"] > 0 and scores["care_desk"] == 0 and scores["fm_desk"] == 0


def test_few_rows_and_many_rows_lift_alike(tmp_path: Path) -> None:
    """reach.find_tools reads every row in one pass: the lift must be the same there."""
    extra = "".join(
        f"---\nconnector:\n  name: sys_{i}\n  endpoint: http://127.0.0.1:9\n  actions:\n"
        f"    - {{ action: act_{i}, path: POST /a, description: light {i}, examples: ['laptop refund {i}'] }}\n"
        for i in range(30)
    )
    catalog = catalog_of(tmp_path, WITH_EXAMPLES + extra)
    index = ActionIndex(catalog, CountingEmbedder())
    index.prepare()
    many = np.arange(len(index.refs), dtype=np.int64)
    every = index.semantic("a laptop refund", many, 0.5)
    assert every is not None
    for few in (np.array([0, 5], dtype=np.int64), np.array([7, 2, 30], dtype=np.int64)):
        scores = index.semantic("a laptop refund", few, 0.5)
        assert scores is not None and np.allclose(scores, every[few])
    plain = index.semantic("a laptop refund", many, 0.0)
    assert plain is not None and (every >= plain - 1e-6).all() and (every > plain + 1e-3).any()


@pytest.mark.parametrize(
    "examples, words",
    [
        ("[" + ", ".join(f"'e{i}'" for i in range(21)) + "]", "at most 20 items"),
        ("['" + "x" * 301 + "']", "at most 300 characters"),
        ("['   ']", "at least 1 character"),
        ("'one string'", "valid list"),
    ],
)
def test_examples_are_bounded_in_count_and_length(tmp_path: Path, examples: str, words: str) -> None:
    (tmp_path / "c.yaml").write_text(
        CATALOG.replace(
            "      description: Open an IT ticket\n",
            f"      description: Open an IT ticket\n      examples: {examples}\n",
        )
    )
    _, problems = build(load_directory(tmp_path))
    assert len(problems) == 1 and "examples" in problems[0].message and words in problems[0].message
    assert problems[0].line > 0
