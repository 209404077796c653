"""The action index: every action's text, its embedding and its lexical terms, by row.

An action's text is what a model can know of it: its connector's name, domain and description,
the action's name and description, and its inputs with their descriptions. Its ``examples`` (short
requests a user might make) are rows of their own: an action's cosine with a request is its
text's, raised by ``weights.examples`` times how far its best example's is higher. Embeddings are
computed once per (model, text): they are looked up in a shared cache first (Redis in the fleet,
``workers/state/embeddings.py``) and only texts missing there are embedded, so a restart with a
warm cache embeds nothing and a catalog change re-embeds only the actions whose text changed.
Each model of a pair is cached apart, under its own name: the pair and one of its models alone share
the entries, and the pair's weighting can change without re-embedding anything.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

import numpy as np
import numpy.typing as npt

from connectors.catalog import ActionRef, Catalog
from connectors.routing.embedders import Embedder, Pair, Vectors, parts
from connectors.routing.lexical import BM25, tokens
from connectors.workflows.spec import WorkflowSpec

# characters of a request (context.description, reach.find_tools' description) that are read:
# the rest is ignored, so a 256 KiB description costs what a short one does
MAX_REQUEST_CHARS = 1000
MAX_ACTION_CHARS = 2000
EMBED_BATCH = 64
# batches a single model that allows it (``parallel_batches``) embeds at once when it fills the
# index: two cores' worth, each batch on one BLAS thread (embedders.py says why not BLAS's threads)
EMBED_THREADS = 2
QUERY_CACHE_SIZE = 1024  # recent requests' embeddings (a find_tools, then the intent it chose)
NORM_TOLERANCE = 1e-2  # the models emit unit vectors: a stored vector far from that is not theirs


class VectorCache(Protocol):
    """Where embeddings of action texts are shared between processes, by key."""

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]: ...

    def put_many(self, items: Mapping[str, bytes]) -> None: ...


def usable(raw: bytes | None, dim: int) -> bool:
    """Whether a stored vector (from Redis or a saved-vector file: written by whoever could write
    there) may be used for a model of ``dim`` dimensions: the right size, finite, unit length."""
    if raw is None or len(raw) != dim * 4:
        return False
    vector = np.frombuffer(raw, dtype="<f4")
    if not np.isfinite(vector).all():
        return False
    return abs(float(np.dot(vector, vector)) - 1.0) <= NORM_TOLERANCE


def _words(name: str) -> str:
    return name.replace("_", " ").replace("-", " ")


def action_text(ref: ActionRef) -> str:
    """What the embedding and the lexical scorer see of one action (at most MAX_ACTION_CHARS)."""
    connector, action = ref.connector, ref.action
    parts = [_words(connector.name)]
    if connector.domain:
        parts.append(_words(connector.domain))
    if connector.description:
        parts.append(connector.description)
    parts.append(_words(action.action))
    if action.description:
        parts.append(action.description)
    for name, spec in action.input.items():
        parts.append(f"{_words(name)}: {spec.description}" if spec.description else _words(name))
    return _joined(parts)


def workflow_text(workflow: WorkflowSpec) -> str:
    """What the embedding and the lexical scorer see of a workflow (reach.find_tools): its name,
    description and inputs as for an action, and the actions its steps run."""
    parts = [_words(workflow.name)]
    if workflow.description:
        parts.append(workflow.description)
    for name, spec in workflow.input.items():
        parts.append(f"{_words(name)}: {spec.description}" if spec.description else _words(name))
    parts.append(", then ".join(_words(step.action_name) for step in workflow.steps))
    return _joined(parts)


def _joined(parts: list[str]) -> str:
    return ". ".join(p.strip().rstrip(".") for p in parts if p.strip())[:MAX_ACTION_CHARS]


def text_key(model: str, text: str) -> str:
    """The embedding cache's key of ``text``'s vector by the single model named ``model``."""
    return f"{model}:{hashlib.sha256(text.encode('utf-8', 'surrogatepass')).hexdigest()}"


def request_text(text: str) -> str:
    return text[:MAX_REQUEST_CHARS].strip()


def _embedded(model: Embedder, batches: list[list[str]], threads: int) -> Iterator[Vectors]:
    """Each batch's vectors, in order; up to ``threads`` batches at once when the model allows
    calls from several threads (its heavy part releases the GIL)."""
    if threads < 2 or len(batches) < 2 or not getattr(model, "parallel_batches", False):
        yield from (model.embed(batch) for batch in batches)
        return
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="reach-embed") as pool:
        yield from pool.map(model.embed, batches)


class ActionIndex:
    """The catalog's actions as rows: texts, lexical postings, and (with a model) embeddings.

    The catalog's workflows follow the actions as rows of their own: reach.find_tools ranks an
    agent's workflows with its actions; routing between connectors never sees them."""

    def __init__(self, catalog: Catalog, embedder: Embedder | None, cache: VectorCache | None = None) -> None:
        self.embedder = embedder
        self.cache = cache
        self.refs = list(catalog.refs.values())
        self.rows = {(r.connector.name, r.action.action): i for i, r in enumerate(self.refs)}
        self.workflows = list(catalog.workflows.values())
        self.workflow_rows = {w.name: len(self.refs) + i for i, w in enumerate(self.workflows)}
        self.texts = [action_text(r) for r in self.refs] + [workflow_text(w) for w in self.workflows]
        # BM25 reads an action's example requests as part of its text; the embedding path gives
        # each example a row of its own (after the actions and workflows), embedded and cached as
        # an action text is, so a request that reads like one of them can lift its action (semantic)
        documents = [tokens(t) for t in self.texts]
        self.examples: dict[int, list[int]] = {}  # action row -> its examples' rows
        owners: list[int] = []
        for row, ref in enumerate(self.refs):
            for example in ref.action.examples:
                self.examples.setdefault(row, []).append(len(self.texts))
                self.texts.append(request_text(example))
                owners.append(row)
                documents[row] = documents[row] + tokens(example)
        self._example_rows = np.arange(len(documents), len(self.texts), dtype=np.int64)
        self._example_owners = np.array(owners, dtype=np.int64)
        self.size = len(self.texts)
        self.lexical = BM25(documents)
        self._documents = len(documents)
        dim = embedder.dim if embedder else 0
        self.vectors: Vectors = np.zeros((self.size, dim), dtype=np.float32)
        self._ready = np.zeros(self.size, dtype=bool)
        self._lock = threading.Lock()
        self._queries: OrderedDict[str, Vectors] = OrderedDict()
        self._terms: dict[int, frozenset[str]] = {}
        self._queries_lock = threading.Lock()
        # what this process did, for the cache tests and the benchmark
        self.embedded = 0  # action texts embedded here
        self.from_cache = 0  # action embeddings found in the cache
        self.rejected = 0  # stored vectors not used (wrong size, not finite, not unit length): embedded again
        self.queries_embedded = 0  # requests embedded here

    def terms(self, row: int) -> frozenset[str]:
        """The lexical terms of a row's text (kept once a row was ranked: bounded by the catalog)."""
        found = self._terms.get(row)
        if found is None:
            words = tokens(self.texts[row])
            for example in self.examples.get(row, ()):
                words += tokens(self.texts[example])
            found = self._terms[row] = frozenset(words)
        return found

    def row(self, ref: ActionRef) -> int:
        return self.rows[(ref.connector.name, ref.action.action)]

    def cache_key(self, text: str, model: Embedder | None = None) -> str:
        """The cache key of ``text``'s vector by ``model`` (default: the index's only model)."""
        model = model or self.embedder
        assert model is not None
        return text_key(model.name, text)

    def cache_keys(self, text: str) -> list[str]:
        """Every key ``text``'s vectors are kept under (one per model of a pair)."""
        assert self.embedder is not None
        return [self.cache_key(text, model) for model, _ in parts(self.embedder)]

    def prepare(self, rows: Iterable[int] | None = None) -> None:
        """Make sure the rows (default: all) have their embeddings: from the cache, else embedded
        here and put in the cache. Each model of a pair is cached on its own (``parts``) and the
        two fill their columns at once, one per core."""
        if self.embedder is None:
            return
        wanted = range(self.size) if rows is None else rows
        with self._lock:
            missing = [r for r in wanted if not self._ready[r]]
            if not missing:
                return
            # texts repeat (the same action on several connectors of one kind): one text, one embedding
            by_text: dict[str, list[int]] = {}
            for r in missing:
                by_text.setdefault(self.texts[r], []).append(r)
            texts = list(by_text)
            embedded_here: set[str] = set()
            columns: list[tuple[Embedder, np.float32, slice]] = []
            at = 0
            for model, factor in parts(self.embedder):
                columns.append((model, factor, slice(at, at + model.dim)))
                at += model.dim

            def fill(model: Embedder) -> None:
                _, factor, cols = next(c for c in columns if c[0] is model)
                keys = [self.cache_key(t, model) for t in texts]
                found = self.cache.get_many(keys) if self.cache is not None else [None] * len(keys)
                todo: list[int] = []
                for i, raw in enumerate(found):
                    if usable(raw, model.dim):
                        assert raw is not None
                        self.vectors[by_text[texts[i]], cols] = np.frombuffer(raw, dtype="<f4") * factor
                    else:
                        todo.append(i)
                        self.rejected += raw is not None  # stored, but not a vector of this model
                batches = [todo[start : start + EMBED_BATCH] for start in range(0, len(todo), EMBED_BATCH)]
                # a pair already runs its two models side by side, one core each
                threads = 1 if isinstance(self.embedder, Pair) else EMBED_THREADS
                embedded = _embedded(model, [[texts[i] for i in b] for b in batches], threads)
                for batch, vectors in zip(batches, embedded, strict=True):
                    for i, vector in zip(batch, vectors):
                        self.vectors[by_text[texts[i]], cols] = vector * factor
                        embedded_here.add(texts[i])
                    if self.cache is not None:
                        self.cache.put_many({keys[i]: v.astype("<f4").tobytes() for i, v in zip(batch, vectors)})

            if isinstance(self.embedder, Pair):
                self.embedder.each(fill)
            else:
                fill(self.embedder)
            self._ready[missing] = True
            self.embedded += len(embedded_here)
            self.from_cache += len(texts) - len(embedded_here)

    @property
    def ready(self) -> bool:
        return self.embedder is None or bool(self._ready.all())

    def query_vector(self, text: str) -> Vectors:
        """The embedding of a request (recent ones are kept)."""
        assert self.embedder is not None
        with self._queries_lock:
            hit = self._queries.get(text)
            if hit is not None:
                self._queries.move_to_end(text)
                return hit
        vector: Vectors = self.embedder.embed([text], query=True)[0]
        with self._queries_lock:
            self.queries_embedded += 1
            self._queries[text] = vector
            while len(self._queries) > QUERY_CACHE_SIZE:
                self._queries.popitem(last=False)
        return vector

    def semantic(
        self, text: str, rows: npt.NDArray[np.int64], examples_weight: float = 0.0
    ) -> npt.NDArray[np.float32] | None:
        """Cosine of the request and each row's action text (None without a model), raised by
        ``examples_weight`` times how far the row's best example request beats it."""
        if self.embedder is None:
            return None
        many = len(rows) * 8 > self._documents
        with_examples = examples_weight > 0 and bool(self.examples)
        examples = (
            []
            if not with_examples
            else self._example_rows
            if many
            else [e for r in rows.tolist() for e in self.examples.get(r, ())]
        )
        if not self._ready[rows].all() or not self._ready[examples].all():
            self.prepare([*rows.tolist(), *np.asarray(examples).tolist()])
        query = self.query_vector(text)
        if many:
            # many rows (reach.find_tools): one pass over the matrix beats copying most of it out
            every: npt.NDArray[np.float32] = self.vectors[: self._documents] @ query
            if with_examples:
                best = np.full(self._documents, -np.inf, dtype=np.float32)
                np.maximum.at(best, self._example_owners, self.vectors[self._example_rows] @ query)
                every += np.float32(examples_weight) * np.maximum(best - every, 0)
            return every[rows]
        scores: npt.NDArray[np.float32] = self.vectors[rows] @ query
        if with_examples:
            for i, row in enumerate(rows.tolist()):
                mine = self.examples.get(row)
                if mine:
                    best_example = float((self.vectors[mine] @ query).max())
                    scores[i] += examples_weight * max(best_example - float(scores[i]), 0.0)
        return scores
