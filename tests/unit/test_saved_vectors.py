"""Saved vectors (issue 35): the file `reach route warm` writes beside the catalog, read before the
shared cache; and hostile stored vectors (a corrupt or foreign file, a Redis entry of the wrong
size, not finite, not unit length, of another model) are never used: they are embedded again."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner, Result

from connectors.catalog import Catalog
from connectors.routing import ActionIndex
from connectors.routing.saved import Layered, Recording, SavedVectors, save
from tests.unit.test_semantic_ranking import CATALOG, CountingEmbedder, DictCache, catalog_of
from workers.cli import main

DIM = CountingEmbedder.dim


@pytest.fixture()
def catalog(tmp_path: Path) -> Catalog:
    return catalog_of(tmp_path)


def warm(catalog: Catalog, path: Path, shared: DictCache | None = None) -> tuple[ActionIndex, int]:
    """What `reach route warm` does: every text through the file and the shared cache, then saved."""
    recording = Recording(Layered(SavedVectors.load(path), shared))
    index = ActionIndex(catalog, CountingEmbedder(), recording)
    index.prepare()
    return index, save(path, recording.seen, {CountingEmbedder.name: DIM})


def started(catalog: Catalog, path: Path, shared: DictCache | None = None) -> tuple[ActionIndex, CountingEmbedder]:
    """A router's start: the file first, then the shared cache."""
    embedder = CountingEmbedder()
    index = ActionIndex(catalog, embedder, Layered(SavedVectors.load(path), shared))
    index.prepare()
    return index, embedder


def test_a_router_starts_from_the_saved_file_without_embedding_or_redis(catalog: Catalog, tmp_path: Path) -> None:
    path = tmp_path / "routing-vectors.npz"
    first, written = warm(catalog, path)
    assert written == 3 and first.embedded == 3
    index, embedder = started(catalog, path, DictCache())
    assert embedder.calls == [] and index.from_cache == 3 and index.rejected == 0
    assert np.allclose(index.vectors, first.vectors)


def test_warm_again_after_one_change_embeds_that_text_only_and_drops_the_stale_vector(
    catalog: Catalog, tmp_path: Path
) -> None:
    path = tmp_path / "routing-vectors.npz"
    warm(catalog, path)
    (tmp_path / "c2").mkdir()
    edited = catalog_of(tmp_path / "c2", CATALOG.replace("Report a building problem", "Report a broken light"))
    index, written = warm(edited, path)
    assert index.embedded == 1 and index.from_cache == 2 and written == 3
    assert len(SavedVectors.load(path).vectors) == 3  # the old text's vector is not kept


def test_a_file_that_is_not_a_vector_file_is_ignored_and_everything_is_embedded(
    catalog: Catalog, tmp_path: Path
) -> None:
    path = tmp_path / "routing-vectors.npz"
    warm(catalog, path)
    whole = path.read_bytes()
    for damaged in (whole[: len(whole) // 2], b"not a zip at all", b""):
        path.write_bytes(damaged)
        index, embedder = started(catalog, path)
        assert embedder.embedded == 3 and index.from_cache == 0


def test_a_pickled_array_in_the_file_is_never_unpickled(catalog: Catalog, tmp_path: Path) -> None:
    path = tmp_path / "routing-vectors.npz"
    np.savez(
        path,
        models=np.array([CountingEmbedder.name]),
        keys_0=np.array([object()], dtype=object),
        vectors_0=np.zeros((1, DIM)),
    )
    index, embedder = started(catalog, path)
    assert embedder.embedded == 3 and SavedVectors.load(path).vectors == {}


def test_a_zip_bomb_is_refused_before_it_is_read(tmp_path: Path) -> None:
    path = tmp_path / "routing-vectors.npz"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("models.npy", b"\0" * (50 * 1024 * 1024))
    assert path.stat().st_size < 1024 * 1024
    assert SavedVectors.load(path).vectors == {}


def test_vectors_of_another_model_or_dimension_in_the_file_are_not_used(catalog: Catalog, tmp_path: Path) -> None:
    path = tmp_path / "routing-vectors.npz"
    warm(catalog, path)
    good = SavedVectors.load(path).vectors
    # the same texts' keys under another model's name, and this model's keys with 7 dimensions
    foreign = {k.replace(CountingEmbedder.name, "other@1"): v for k, v in good.items()}
    save(path, foreign, {"other@1": DIM})
    index, embedder = started(catalog, path)
    assert embedder.embedded == 3
    unit = (np.ones(7) / np.sqrt(7)).astype("<f4")
    np.savez(
        path,
        models=np.array([CountingEmbedder.name]),
        keys_0=np.array(list(good), dtype="S"),
        vectors_0=np.tile(unit, (len(good), 1)),
    )
    index, embedder = started(catalog, path)
    assert embedder.embedded == 3 and index.rejected == 3


@pytest.mark.parametrize(
    "value",
    [
        np.full(DIM, np.nan, dtype="<f4").tobytes(),  # not finite
        (np.ones(DIM, dtype="<f4") * 3).tobytes(),  # not unit length
        np.zeros(DIM, dtype="<f4").tobytes(),  # zero
        b"\x01" * (DIM * 4 - 1),  # wrong size
    ],
)
def test_a_hostile_shared_cache_entry_is_embedded_again_and_replaced(catalog: Catalog, value: bytes) -> None:
    shared = DictCache()
    ActionIndex(catalog, CountingEmbedder(), shared).prepare()
    key = next(iter(shared.data))
    shared.data[key] = value
    embedder = CountingEmbedder()
    index = ActionIndex(catalog, embedder, shared)
    index.prepare()
    assert embedder.embedded == 1 and index.rejected == 1
    assert np.isfinite(index.vectors).all() and np.allclose(np.linalg.norm(index.vectors, axis=1), 1.0, atol=1e-3)
    assert shared.data[key] != value  # the embedded vector replaced it


def test_save_leaves_out_vectors_that_are_not_usable(tmp_path: Path) -> None:
    unit = (np.ones(DIM) / np.sqrt(DIM)).astype("<f4").tobytes()
    written = save(
        tmp_path / "v.npz",
        {f"{CountingEmbedder.name}:a": unit, f"{CountingEmbedder.name}:b": b"\0" * (DIM * 4), "other@1:c": unit},
        {CountingEmbedder.name: DIM},
    )
    assert written == 1 and list(SavedVectors.load(tmp_path / "v.npz").vectors) == [f"{CountingEmbedder.name}:a"]


# -- reach route warm, with the real use-m3 model and no Redis ------------------------------------

WARM_CATALOG = CATALOG + "---\nrouting:\n  model: use-m3\n"
AGENT = """---
agent_app:
  name: bot
  connector_bindings:
    - { connector: it_desk, allowed_actions: ["*"] }
    - { connector: care_desk, allowed_actions: ["*"] }
    - { connector: fm_desk, allowed_actions: ["*"] }
"""


def warm_cli(directory: Path, **env: str) -> Result:
    return CliRunner().invoke(
        main, ["route", "warm", "--dir", str(directory)], env={"REACH_REDIS_URL": "redis://127.0.0.1:1/0", **env}
    )


def test_reach_route_warm_saves_beside_the_catalog_and_embeds_only_what_changed(tmp_path: Path) -> None:
    (tmp_path / "c.yaml").write_text(WARM_CATALOG)
    first = warm_cli(tmp_path)
    assert first.exit_code == 0, first.output
    assert "saved 3 vector(s) of use-m3 for 3 text(s)" in first.output and "3 embedded here" in first.output
    assert (tmp_path / "routing-vectors.npz").is_file()
    again = warm_cli(tmp_path)
    assert "0 embedded here" in again.output and "3 vector(s) from the file" in again.output
    (tmp_path / "c.yaml").write_text(WARM_CATALOG.replace("Report a building problem", "Report a broken lamp"))
    changed = warm_cli(tmp_path)
    assert "1 embedded here" in changed.output and "saved 3 vector(s)" in changed.output


def test_reach_route_warm_without_a_file_to_write_exits_2(tmp_path: Path) -> None:
    (tmp_path / "c.yaml").write_text(WARM_CATALOG)
    result = warm_cli(tmp_path, REACH_ROUTING_VECTORS="none")
    assert result.exit_code == 2 and "REACH_ROUTING_VECTORS is none" in result.output
    assert not (tmp_path / "routing-vectors.npz").exists()


def test_reach_route_text_still_ranks_without_the_rank_word(tmp_path: Path) -> None:
    (tmp_path / "c.yaml").write_text(WARM_CATALOG + AGENT)
    result = CliRunner().invoke(
        main,
        ["route", "a refund for my order", "--action", "create_ticket", "--agent", "bot", "--dir", str(tmp_path)],
        env={"REACH_REDIS_URL": "redis://127.0.0.1:1/0"},
    )
    assert result.exit_code == 0, result.output
    assert "care_desk.create_ticket" in result.output.splitlines()[2]
