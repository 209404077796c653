"""The real models run on one BLAS thread (connectors/routing/embedders.py): OpenBLAS's idle
threads spin after each call, which cost 3-5x the CPU of one thread on the 2-core machines reach
runs on (BENCHMARKS.md, "Routing: one BLAS thread"). Loads use-m3 (about a second)."""

from __future__ import annotations

import numpy as np
from threadpoolctl import threadpool_info, threadpool_limits

from connectors.routing.embedders import load_embedder


def blas_threads() -> set[int]:
    return {pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"}


def test_loading_a_model_holds_blas_to_one_thread_and_embedding_keeps_it_there() -> None:
    threadpool_limits(limits=2, user_api="blas")  # what OpenBLAS starts with on two cores
    model = load_embedder("use-m3")
    assert model is not None
    assert blas_threads() == {1}
    vectors = model.embed(["open a ticket for my laptop", "我的笔记本电脑坏了"] * 40)
    assert vectors.shape == (80, 512) and np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-3)
    assert blas_threads() == {1}  # USE's own limit around each call does not raise it again
