"""Saved vectors: the embeddings of a catalog's texts (action texts, examples, workflows) in one
file beside the catalog, so a router starts on a large catalog in seconds without embedding
anything and without a warm Redis (a new replica, a fresh cluster). ``reach route warm`` writes it
ahead of a deploy; the router reads it at start-up before asking Redis.

The file is an uncompressed ``.npz`` (numpy's zip of arrays, read without pickle): per single model,
``keys_<i>`` (the cache keys, ``<model>@<version>:<sha256 of the text>``) and ``vectors_<i>`` (float32
rows), and ``models`` naming them. Every vector is keyed by its model and its text's hash, so a
vector is only ever used for the very text and model it was made from: another model's file, or a
text that changed, simply misses and is embedded again.

Nothing in the file is trusted blindly: a file that cannot be read (truncated, not a zip, a pickled
array, a bomb of a size) is ignored as a whole, and a model block whose shapes disagree is skipped.
Each vector is checked again when it is used (``usable``): the model's dimension, finite, unit
length. Whatever fails is embedded again, and the router logs how many came from where.
"""

from __future__ import annotations

import logging
import os
import tempfile
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from connectors.routing.index import VectorCache, usable

log = logging.getLogger("reach.routing")

FILE_NAME = "routing-vectors.npz"
MAX_FILE_BYTES = 2 * 1024**3  # 2 GiB: 100,000 texts of the default pair take about 360 MB
MAX_MEMBERS = 64


class SavedVectors:
    """The vectors of one saved-vector file, by cache key (a ``VectorCache`` that only reads)."""

    def __init__(self, vectors: Mapping[str, bytes] | None = None) -> None:
        self.vectors: dict[str, bytes] = dict(vectors or {})
        self.hits = 0

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        found = [self.vectors.get(k) for k in keys]
        self.hits += sum(v is not None for v in found)
        return found

    def put_many(self, items: Mapping[str, bytes]) -> None:
        """Saved vectors are written by ``save``; what a router embeds goes to the shared cache."""

    @classmethod
    def load(cls, path: Path) -> SavedVectors:
        """The file's vectors; an empty set when it is missing or cannot be read (logged)."""
        if not path.is_file():
            return cls()
        try:
            return cls(_read(path))
        except (OSError, ValueError, KeyError, zipfile.BadZipFile, EOFError) as exc:
            log.warning("saved vectors in %s ignored: %s", path, exc)
            return cls()


def _read(path: Path) -> dict[str, bytes]:
    if path.stat().st_size > MAX_FILE_BYTES:
        raise ValueError(f"larger than {MAX_FILE_BYTES} bytes")
    with zipfile.ZipFile(path) as archive:
        members = archive.infolist()
        if len(members) > MAX_MEMBERS:
            raise ValueError(f"more than {MAX_MEMBERS} arrays")
        # npz members are stored, not deflated (save writes them so): a member that claims to
        # expand far beyond the file is a zip bomb, refused before numpy reads it
        if sum(m.file_size for m in members) > 2 * path.stat().st_size + 1024**2:
            raise ValueError("its arrays expand beyond the file's size")
    out: dict[str, bytes] = {}
    with np.load(path, allow_pickle=False) as arrays:
        models = [str(m) for m in arrays["models"].tolist()]
        for i, model in enumerate(models):
            keys, vectors = arrays[f"keys_{i}"], arrays[f"vectors_{i}"]
            if keys.ndim != 1 or vectors.ndim != 2 or len(keys) != len(vectors) or vectors.dtype != np.float32:
                log.warning(
                    "saved vectors of %s in %s skipped: shapes %s and %s", model, path, keys.shape, vectors.shape
                )
                continue
            rows = vectors.astype("<f4", copy=False)
            for key, row in zip(keys.tolist(), rows):
                name = key.decode("ascii", "replace") if isinstance(key, bytes) else str(key)
                if name.startswith(model + ":"):  # a key of another model in this block is not used
                    out[name] = row.tobytes()
    return out


def save(path: Path, vectors: Mapping[str, bytes], dims: Mapping[str, int]) -> int:
    """Write ``vectors`` (cache key -> float32 bytes) for the single models of ``dims`` (model
    name -> dimension) to ``path`` atomically (a temporary file, then a rename); vectors of other
    models or other sizes are left out. Returns how many were written."""
    models = sorted(dims)
    arrays: dict[str, np.ndarray] = {"models": np.array(models, dtype="U")}
    written = 0
    for i, model in enumerate(models):
        mine = sorted((k, v) for k, v in vectors.items() if k.startswith(model + ":") and usable(v, dims[model]))
        arrays[f"keys_{i}"] = np.array([k for k, _ in mine], dtype="S")
        matrix = np.frombuffer(b"".join(v for _, v in mine), dtype="<f4").reshape(len(mine), dims[model])
        arrays[f"vectors_{i}"] = matrix.astype(np.float32)
        written += len(mine)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=".routing-vectors-", suffix=".npz", dir=path.parent)
    try:
        with os.fdopen(handle, "wb") as out:
            # stored, not compressed: vectors do not compress, and reading stays one copy (numpy's
            # stub types **kwds as allow_pickle)
            np.savez(out, **arrays)  # type: ignore[arg-type]
        os.chmod(temporary, 0o644)  # mkstemp's 0600 would hide it from a router running as another user
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return written


class Layered:
    """Saved vectors first, then the shared cache (Redis) for what the file lacks; what is
    embedded goes to the shared cache only."""

    def __init__(self, saved: SavedVectors, shared: VectorCache | None) -> None:
        self.saved = saved
        self.shared = shared

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        found: list[bytes | None] = self.saved.get_many(keys)
        missing = [i for i, v in enumerate(found) if v is None]
        if missing and self.shared is not None:
            for i, value in zip(missing, self.shared.get_many([keys[i] for i in missing])):
                found[i] = value
        return found

    def put_many(self, items: Mapping[str, bytes]) -> None:
        if self.shared is not None:
            self.shared.put_many(items)


class Recording:
    """A cache that remembers every vector it handed out or was given (``reach route warm``:
    exactly the current catalog's texts, which ``save`` then writes)."""

    def __init__(self, inner: VectorCache | None) -> None:
        self.inner = inner
        self.seen: dict[str, bytes] = {}

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        found: list[bytes | None] = [None] * len(keys) if self.inner is None else self.inner.get_many(keys)
        self.seen.update((k, v) for k, v in zip(keys, found) if v is not None)
        return found

    def put_many(self, items: Mapping[str, bytes]) -> None:
        self.seen.update(items)  # an embedded vector replaces a stored one that was not usable
        if self.inner is not None:
            self.inner.put_many(items)
