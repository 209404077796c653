"""Semantic routing, measured (issue 15): accuracy on the routing set, added router latency, the
router's memory and start-up with a 10,000-action catalog. Figures in BENCHMARKS.md.

    .venv/bin/python bench/semantic.py                      # everything
    .venv/bin/python bench/semantic.py --only accuracy      # no services needed
    .venv/bin/python bench/semantic.py --only process,latency,e2e --redis-url redis://127.0.0.1:6379/12

Sections:

accuracy  bench/routing_set: 20 connectors in six groups sharing a bare action. requests.yaml (412
          requests in English and Chinese, 60 genuinely ambiguous) is split by position in every
          list: even = dev (tuning), odd = test (held out); fresh.yaml (112 requests in English,
          Chinese, German and Spanish, 24 ambiguous) is a second held-out split, written after the
          tuning and never tuned on. For each model the lexical weight and the margin are chosen on
          dev: the smallest deferral with no ambiguous request dispatched and at least 98 % of the
          dispatched requests right. Every split is then routed once through Router.decide with
          those settings in the catalog's routing: document, and reported; for the default model
          also with the settings of before 2026-12-01, and every deferred clear request with each
          path's scores (each model's cosine, BM25, fused) and the lead. The three tiers (dispatch,
          confirm, open; bench/routing_tiers.py): confirm_margin calibrated on dev after the margin,
          each split's share per tier and per language, the right connector among the confirm
          tier's two, and what relaxed margins cost on the held-out splits.
latency   in process, the routing set plus 10,000 filler actions (routing_set/filler.py), the
          model warm, embeddings from the Redis cache: Router.decide for each request as a bare
          action with its description (semantic), and as the qualified action on the same router
          and on a router whose index was never built (today's exact path), interleaved, so the
          machine's load hits all three alike. Added latency = semantic - exact, per request. The
          ranking step alone (embed the request, score the candidates), wall and CPU, and the
          scoring alone. Also reach.find_tools over an agent's 10,000 tools.
process   `reach router` started for real on that catalog: without shared actions (today), with
          model none (baseline), then with the default model (cold if --cold cleared the cache,
          then warm): time until it consumes reach.intents, and its RSS.
e2e       one fleet (router, four pools, a counting downstream) on that catalog: receipt latency of
          a qualified create_ticket, the bare action with a clear request and with an ambiguous
          one, interleaved.

--placeholder-filler: random vectors for the filler texts the cache lacks (see PLACEHOLDERS).
Uses tests/fleet.py's isolated vhost and Redis database (REACH_BROKER_URL / REACH_REDIS_URL).
Only processes this script started are stopped.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from bench import routing_tiers  # noqa: E402
from bench.common import calibrate as machine_speed  # noqa: E402
from bench.routing_set.filler import filler_catalog  # noqa: E402
from connectors.catalog import Catalog, build  # noqa: E402
from connectors.loader import load_directory  # noqa: E402
from connectors.routing import ActionIndex, load_embedder, rank  # noqa: E402
from connectors.routing.index import request_text  # noqa: E402
from connectors.routing.lexical import tokens  # noqa: E402
from connectors.spec import RoutingSpec, RoutingWeights  # noqa: E402
from workers.router.decisions import Answer, Dispatch  # noqa: E402
from workers.router.intake import RawMessage  # noqa: E402
from workers.router.routing import Router  # noqa: E402
from workers.router.semantic import SemanticRouting  # noqa: E402

SET = HERE / "routing_set"
AGENT = "assistant"
# the required param every candidate of a group accepts, so params never decide (the ranking does)
PARAMS = {
    "create_ticket": {"title": "t"},
    "send_message": {"text": "t"},
    "check_status": {"reference": "r"},
    "book": {"when": "w"},
    "search": {"query": "q"},
    "cancel": {"reference": "r"},
}
MODELS = ["use-m3", "e5-small", "use-m3+e5-small"]  # the pair last: its listing reads the others
SPLITS = ("dev", "test", "fresh")
# the lexical scorer stays in the fusion (exact terms: product names, ids), so its weight is never 0
LEXICAL_WEIGHTS = [0.05, 0.1, 0.2, 0.3]
MAX_WRONG_SHARE = 0.02
RESULTS = HERE / "results" / "semantic.json"


def requests() -> list[dict[str, Any]]:
    """Every request of the set: action, expected connector (None: ambiguous), language, split.

    requests.yaml is split by position in each list (even: dev, the tuning split; odd: test,
    held out); fresh.yaml is a second held-out split, written after the tuning and never tuned on."""
    out = []
    for name in ("requests.yaml", "fresh.yaml"):
        for action, groups in yaml.safe_load((SET / name).read_text()).items():
            for connector, languages in groups.items():
                for lang, texts in languages.items():
                    for i, text in enumerate(texts):
                        split = "fresh" if name == "fresh.yaml" else "dev" if i % 2 == 0 else "test"
                        out.append(
                            {
                                "action": action,
                                "expect": None if connector == "ambiguous" else connector,
                                "lang": lang,
                                "split": split,
                                "text": text,
                            }
                        )
    return out


def load(directory: Path) -> Catalog:
    catalog, problems = build(load_directory(directory))
    assert not problems, problems
    return catalog


def with_routing(directory: Path, spec: RoutingSpec, extra: str | None = None) -> Path:
    """A copy of the set's catalog with a routing: document (and extra documents)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "catalog.yaml").write_text((SET / "catalog" / "connectors.yaml").read_text())
    (directory / "routing.yaml").write_text(yaml.safe_dump({"routing": spec.model_dump()}))
    if extra:
        (directory / "filler.yaml").write_text(extra)
    return directory


# -- accuracy ---------------------------------------------------------------------------------


def outcome(cands: list[tuple[str, float, float]], w_lex: float, margin: float) -> tuple[str | None, float]:
    """(dispatched connector or None, lead) for candidates (connector, semantic, lexical)."""
    scores = sorted(((sem + w_lex * lex, name) for name, sem, lex in cands), reverse=True)
    lead = scores[0][0] - scores[1][0]
    return (scores[0][1] if lead >= margin else None), lead


def tally(rows: list[dict[str, Any]], decided: list[str | None]) -> dict[str, Any]:
    clear = [(r, d) for r, d in zip(rows, decided) if r["expect"]]
    ambiguous = [(r, d) for r, d in zip(rows, decided) if not r["expect"]]
    auto = [(r, d) for r, d in clear if d is not None]
    right = sum(d == r["expect"] for r, d in auto)
    by_lang = {}
    for lang in dict.fromkeys(r["lang"] for r, _ in clear):
        mine = [(r, d) for r, d in clear if r["lang"] == lang]
        routed = [(r, d) for r, d in mine if d is not None]
        by_lang[lang] = {
            "requests": len(mine),
            "auto_accuracy": round(sum(d == r["expect"] for r, d in routed) / len(routed), 4) if routed else None,
            "deferred": round(1 - len(routed) / len(mine), 4) if mine else None,
        }
    if not clear:
        return {
            "clear": 0,
            "ambiguous": len(ambiguous),
            "ambiguous_dispatched": sum(d is not None for _, d in ambiguous),
        }
    return {
        "clear": len(clear),
        "auto_routed": len(auto),
        "right": right,
        "wrong": len(auto) - right,
        "auto_accuracy": round(right / len(auto), 4) if auto else None,
        "deferred": round(1 - len(auto) / len(clear), 4),
        "ambiguous": len(ambiguous),
        "ambiguous_dispatched": sum(d is not None for _, d in ambiguous),
        "by_language": by_lang,
    }


def calibrate(rows: list[dict[str, Any]], cands: list[list[tuple[str, float, float]]]) -> dict[str, Any]:
    """On dev: the (lexical weight, margin) with the least deferral such that no ambiguous request
    is dispatched and at most 2 % of dispatched requests are wrong; ties: the smaller margin."""
    best: tuple[float, float, float] | None = None
    curve = []
    for w_lex in LEXICAL_WEIGHTS:
        leads = [outcome(c, w_lex, 0.0)[1] for c in cands]
        for margin in sorted({0.0, *(round(x + 1e-4, 4) for x in leads)}):
            decided = [outcome(c, w_lex, margin)[0] for c in cands]
            t = tally(rows, decided)
            ok = t["ambiguous_dispatched"] == 0 and (t["auto_accuracy"] or 0) >= 1 - MAX_WRONG_SHARE
            if w_lex == LEXICAL_WEIGHTS[0] or ok:
                curve.append((w_lex, margin, t["deferred"], t["auto_accuracy"], t["ambiguous_dispatched"]))
            if ok and (best is None or (t["deferred"], margin) < (best[2], best[1])):
                best = (w_lex, margin, t["deferred"])
    assert best is not None
    return {"lexical": best[0], "margin": best[1], "dev_deferred": best[2]}


def tradeoff(rows: list[dict[str, Any]], cands: list[list[tuple[str, float, float]]], w_lex: float) -> list[Any]:
    """Deferral, accuracy and ambiguous dispatches at a few margins (to show the trade-off)."""
    out = []
    for margin in (0.0, 0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.08, 0.1, 0.12, 0.15):
        t = tally(rows, [outcome(c, w_lex, margin)[0] for c in cands])
        out.append(
            {"margin": margin, **{k: t[k] for k in ("auto_accuracy", "deferred", "ambiguous_dispatched", "wrong")}}
        )
    return out


def accuracy(work: Path) -> dict[str, Any]:
    rows = requests()
    catalog = load(SET / "catalog")
    splits = {name: [i for i, r in enumerate(rows) if r["split"] == name] for name in SPLITS}
    results: dict[str, Any] = {"requests": len(rows), "splits": {}}
    for split, ids in splits.items():
        results["splits"][split] = {
            "clear": sum(1 for i in ids if rows[i]["expect"]),
            "ambiguous": sum(1 for i in ids if not rows[i]["expect"]),
        }
    results["models"] = {}
    cosines: dict[str, list[dict[str, float]]] = {}  # model -> per request: connector -> cosine
    for model in MODELS:
        started = time.monotonic()
        embedder = load_embedder(model)
        index = ActionIndex(catalog, embedder)
        index.prepare()
        loaded = time.monotonic() - started
        parts = RoutingWeights(semantic=1.0, lexical=1.0, domain=0, agent_domain=0)
        cands = []
        every_term = []  # the lexical path as it was before 2026-12-01: every term of the request
        for r in rows:
            ranking = rank(index, catalog.by_action[r["action"]], r["text"], parts)
            cands.append([(s.ref.connector.name, s.semantic or 0.0, s.lexical or 0.0) for s in ranking.ranked])
            ranked_rows = np.array([index.row(s.ref) for s in ranking.ranked], dtype=np.int64)
            lexical = index.lexical.scores(tokens(request_text(r["text"])), ranked_rows)
            every_term.append([(n, sem, float(lex)) for (n, sem, _), lex in zip(cands[-1], lexical)])
        cosines[model] = [{n: sem for n, sem, _ in c} for c in cands]
        dev = splits["dev"]
        chosen = calibrate([rows[i] for i in dev], [cands[i] for i in dev])
        # the confirm tier's lower bound, on dev too, once the margin is set (bench/routing_tiers.py)
        chosen["confirm_margin"] = routing_tiers.calibrate_confirm(
            [rows[i] for i in dev], [cands[i] for i in dev], chosen["lexical"], chosen["margin"]
        )
        top1 = {
            split: round(
                sum(cands[i][0][0] == rows[i]["expect"] for i in ids if rows[i]["expect"])
                / sum(1 for i in ids if rows[i]["expect"]),
                4,
            )
            for split, ids in splits.items()
        }
        # every split once through the router, with the calibrated settings in the catalog
        spec = RoutingSpec(
            model=model,  # type: ignore[arg-type]
            margin=chosen["margin"],
            confirm_margin=chosen["confirm_margin"],
            weights=RoutingWeights(lexical=chosen["lexical"]),
        )
        routed = load(with_routing(work / f"acc-{model}", spec))
        router = Router(routed, max_intent_bytes=256 * 1024, semantic=_shared(routed, index))
        decided: dict[int, str | None] = {}
        tiers: dict[int, tuple[str, list[str]]] = {}  # the tier and the connectors offered, as the router said
        for i in range(len(rows)):
            r = rows[i]
            decision = router.decide(_raw(r["action"], r["text"], PARAMS[r["action"]]))
            if isinstance(decision, Dispatch):
                decided[i] = decision.job.connector
                tiers[i] = ("dispatch", [decision.job.connector])
            else:
                assert isinstance(decision, Answer) and decision.receipt.error is not None, decision
                assert decision.receipt.error.code.value == "AMBIGUOUS_ACTION", decision.receipt.error
                decided[i] = None
                assert decision.receipt.execution.routing is not None
                offered = [d["connector"] for d in decision.receipt.error.details]
                tiers[i] = (decision.receipt.execution.routing["tier"], offered)
        offline = {i: outcome(cands[i], chosen["lexical"], chosen["margin"])[0] for i in range(len(rows))}
        entry: dict[str, Any] = {
            "name": index.embedder.name if index.embedder else "none",
            "load_and_index_s": round(loaded, 2),
            "top1": top1,
            "calibrated": chosen,
            **{split: tally([rows[i] for i in ids], [decided[i] for i in ids]) for split, ids in splits.items()},
            "router_agrees_with_offline_scoring": decided == offline,
            # the three tiers (issue 35): the router's own tiers must be the offline ones
            "router_agrees_on_tiers": all(
                tiers[i][0]
                == routing_tiers.tier_of(cands[i], chosen["lexical"], chosen["margin"], chosen["confirm_margin"])[0]
                for i in range(len(rows))
            ),
            "tiers": {
                split: routing_tiers.tally(
                    [rows[i] for i in ids],
                    [cands[i] for i in ids],
                    chosen["lexical"],
                    chosen["margin"],
                    chosen["confirm_margin"],
                )
                for split, ids in splits.items()
            },
            "relaxed_margins": routing_tiers.relaxed(rows, cands, chosen["lexical"], chosen["confirm_margin"], splits),
            "dev_tradeoff": tradeoff([rows[i] for i in dev], [cands[i] for i in dev], chosen["lexical"]),
            "test_tradeoff": tradeoff(
                [rows[i] for i in splits["test"]], [cands[i] for i in splits["test"]], chosen["lexical"]
            ),
        }
        if model == RoutingSpec().model:
            # the settings and lexical path before 2026-12-01 (lexical 0.1, margin 0.046, every term)
            entry["previous"] = {
                split: tally([rows[i] for i in ids], [outcome(every_term[i], 0.1, 0.046)[0] for i in ids])
                for split, ids in splits.items()
            }
            entry["deferred"] = deferred(rows, cands, cosines, chosen, decided)
        results["models"][model] = entry
        print(
            f"accuracy {model} with {chosen}: "
            + json.dumps({split: entry[split] for split in SPLITS}, ensure_ascii=False),
            flush=True,
        )
        del index, embedder, router
        gc.collect()
    return results


def deferred(
    rows: list[dict[str, Any]],
    cands: list[list[tuple[str, float, float]]],
    cosines: dict[str, list[dict[str, float]]],
    chosen: dict[str, Any],
    decided: dict[int, str | None],
) -> list[dict[str, Any]]:
    """Every clear request the default model deferred, with each candidate's score on each path
    (each model's cosine alone, BM25, fused) and the fused lead: what the analysis reads."""
    out = []
    for i, r in enumerate(rows):
        if not r["expect"] or decided[i] is not None:
            continue
        scored = sorted(((sem + chosen["lexical"] * lex, n, lex) for n, sem, lex in cands[i]), reverse=True)
        out.append(
            {
                "split": r["split"],
                "lang": r["lang"],
                "text": r["text"],
                "expect": r["expect"],
                "lead": round(scored[0][0] - scored[1][0], 4),
                "candidates": [
                    {
                        "connector": n,
                        "fused": round(score, 4),
                        **{m: round(cosines[m][i][n], 4) for m in MODELS if "+" not in m and m in cosines},
                        "bm25": round(lex, 4),
                    }
                    for score, n, lex in scored
                ],
            }
        )
    return out


def _shared(catalog: Catalog, index: ActionIndex) -> SemanticRouting:
    """Semantic routing over ``catalog`` that reuses an index already built for the same actions."""
    routing = SemanticRouting(catalog)
    routing._index = index  # same connectors and texts; only the routing: document differs
    return routing


def _raw(action: str, description: str | None, params: dict[str, Any], agent: str = AGENT) -> RawMessage:
    body: dict[str, Any] = {"intent_id": uuid.uuid4().hex, "agent_id": agent, "action": action, "params": params}
    if description is not None:
        body["context"] = {"description": description}
    return RawMessage(body=json.dumps(body).encode(), received_at=time.time())


# -- placeholder vectors for the filler -------------------------------------------------------

# --placeholder-filler: the filler's 10,000 texts get random unit vectors in the cache instead of
# real embeddings, for the sections that time the router (latency, e2e, process), when the machine
# is too busy to embed them (at load 20, e5 embedded 0.2 texts/s). The routing set's own texts are
# always embedded for real, and the ranking of its requests reads only their rows; what placeholders
# change is which filler tools reach.find_tools returns, whose quality is not measured here. They
# expire after an hour and are deleted when the run ends.
PLACEHOLDER_FILLER = False
PLACEHOLDERS: list[str] = []
PLACEHOLDER_TTL_S = 3600


def seed_placeholders(client: Any, catalog: Catalog, model: str) -> None:
    from connectors.routing.embedders import cache_models
    from connectors.routing.index import action_text, text_key
    from workers.state import keys

    ours = set(load(SET / "catalog").connectors)
    texts = sorted({action_text(r) for r in catalog.refs.values() if r.connector.name not in ours})
    rng = np.random.default_rng(20261201)
    for name, dim in cache_models(model):
        wanted = [keys.embedding(text_key(name, t)) for t in texts]
        pipe = client.pipeline(transaction=False)
        for key in wanted:
            pipe.exists(key)
        missing = [k for k, there in zip(wanted, pipe.execute()) if not there]
        pipe = client.pipeline(transaction=False)
        for key in missing:
            vector = rng.standard_normal(dim).astype("<f4")
            pipe.set(key, (vector / np.linalg.norm(vector)).astype("<f4").tobytes(), ex=PLACEHOLDER_TTL_S)
        pipe.execute()
        PLACEHOLDERS.extend(k.decode() if isinstance(k, bytes) else k for k in missing)
    print(f"placeholders: {len(PLACEHOLDERS)} filler vector(s) in the cache for {model}", flush=True)


def drop_placeholders(redis_url: str) -> None:
    import redis

    client = redis.Redis.from_url(redis_url)
    for start in range(0, len(PLACEHOLDERS), 1000):
        client.delete(*PLACEHOLDERS[start : start + 1000])
    print(f"placeholders: {len(PLACEHOLDERS)} deleted", flush=True)
    PLACEHOLDERS.clear()


# -- latency ----------------------------------------------------------------------------------


def pct(values: list[float], q: float) -> float:
    return round(float(np.percentile(values, q)), 3)


def latency(work: Path, redis_url: str, rounds: int, model: str) -> dict[str, Any]:
    import redis

    from workers.state.embeddings import RedisVectorCache

    spec = RoutingSpec(model=model)  # type: ignore[arg-type]
    directory = with_routing(work / f"latency-{model}", spec, filler_catalog())
    catalog = load(directory)
    client = redis.Redis.from_url(redis_url)
    seeded = len(PLACEHOLDERS)
    if PLACEHOLDER_FILLER:
        seed_placeholders(client, catalog, model)
    seeded = len(PLACEHOLDERS) - seeded
    cache = RedisVectorCache(client)
    started = time.monotonic()
    semantic = SemanticRouting(catalog, cache)
    semantic.warm()
    warm_s = time.monotonic() - started
    index = semantic.loaded
    assert index is not None
    with_model = Router(catalog, max_intent_bytes=256 * 1024, semantic=semantic)
    today = Router(catalog, max_intent_bytes=256 * 1024)  # its index is never built: exact intents only
    rows = [r for r in requests() if r["split"] == "test"]
    exact_today: list[float] = []
    exact_model: list[float] = []
    semantic_ms: list[float] = []
    added: list[float] = []
    cpu: list[float] = []  # CPU ms of the whole process (the model's threads too) per semantic intent
    rank_ms: list[float] = []  # the ranking step alone: embed the request, score the candidates
    rank_cpu: list[float] = []
    score_ms: list[float] = []  # the ranking step with the request's embedding already at hand
    model_calls_during_exact = 0

    def timed(router: Router, raw: RawMessage) -> float:
        t0 = time.perf_counter()
        router.decide(raw)
        return (time.perf_counter() - t0) * 1000

    for _ in range(rounds):
        for r in rows:
            target = r["expect"] or catalog.by_action[r["action"]][0].connector.name
            qualified = f"{target}.{r['action']}"
            params = PARAMS[r["action"]]
            before = index.queries_embedded
            # which exact router goes first alternates: the second call of a pair finds warmer caches
            if len(exact_today) % 2:
                exact_today.append(timed(today, _raw(qualified, r["text"], params)))
                e = timed(with_model, _raw(qualified, r["text"], params))
            else:
                e = timed(with_model, _raw(qualified, r["text"], params))
                exact_today.append(timed(today, _raw(qualified, r["text"], params)))
            model_calls_during_exact += index.queries_embedded - before
            index._queries.clear()  # each semantic intent embeds its request, as a new one would
            c0 = time.process_time()
            s = timed(with_model, _raw(r["action"], r["text"], params))
            cpu.append((time.process_time() - c0) * 1000)
            exact_model.append(e)
            semantic_ms.append(s)
            added.append(s - e)
            refs = catalog.by_action[r["action"]]
            index._queries.clear()
            c0, t0 = time.process_time(), time.perf_counter()
            rank(index, refs, r["text"], spec.weights)
            rank_ms.append((time.perf_counter() - t0) * 1000)
            rank_cpu.append((time.process_time() - c0) * 1000)
            t0 = time.perf_counter()
            rank(index, refs, r["text"], spec.weights)
            score_ms.append((time.perf_counter() - t0) * 1000)
    find: list[float] = []
    for r in rows[:100]:
        index._queries.clear()
        t0 = time.perf_counter()
        decision = with_model.decide(
            _raw("reach.find_tools", None, {"description": r["text"], "k": 5}, agent="everything")
        )
        find.append((time.perf_counter() - t0) * 1000)
        assert isinstance(decision, Answer) and decision.receipt.success, decision
    return {
        "actions": len(catalog.refs),
        "model": index.embedder.name if index.embedder else "none",
        "warm_index_s": round(warm_s, 2),
        "from_cache": index.from_cache,
        "embedded": index.embedded,
        "intents_per_kind": len(added),
        "exact_today_ms": {"p50": pct(exact_today, 50), "p99": pct(exact_today, 99)},
        "exact_with_model_ms": {"p50": pct(exact_model, 50), "p99": pct(exact_model, 99)},
        "exact_ratio_p50": round(statistics.median(exact_model) / statistics.median(exact_today), 3),
        "model_calls_during_exact_intents": model_calls_during_exact,
        "semantic_ms": {"p50": pct(semantic_ms, 50), "p99": pct(semantic_ms, 99)},
        "added_ms": {"p50": pct(added, 50), "p99": pct(added, 99), "max": round(max(added), 3)},
        "semantic_cpu_ms": {"p50": pct(cpu, 50), "p99": pct(cpu, 99)},
        "rank_step_ms": {"p50": pct(rank_ms, 50), "p99": pct(rank_ms, 99)},
        "rank_step_cpu_ms": {"p50": pct(rank_cpu, 50), "p99": pct(rank_cpu, 99)},
        "scoring_only_ms": {"p50": pct(score_ms, 50), "p99": pct(score_ms, 99)},
        "placeholder_vectors": seeded,
        "load_average": os.getloadavg(),
        "find_tools_10k_ms": {"p50": pct(find, 50), "p99": pct(find, 99), "tools": 10_000},
        "rss_mb_this_process": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


# -- process ----------------------------------------------------------------------------------


def e2e(work: Path, broker_url: str, redis_url: str, count: int) -> dict[str, Any]:
    """Receipt latency seen by an agent, one fleet, interleaved: a qualified create_ticket (no
    ranking), the bare action with a clear request (ranked, then executed), and the bare action
    with an ambiguous one (ranked, answered AMBIGUOUS_ACTION by the router). The four
    create_ticket connectors of the routing set call one counting downstream; the catalog has the
    10,000 filler actions too. Each request text gets its number appended, so every bare intent
    embeds its request (the router keeps recent ones)."""
    from producers.client import ReachClient
    from tests.fleet import Fleet
    from tests.integration.counting_system import CountingSystem

    system = CountingSystem().start()
    system.state.keep_requests = False
    ours = (SET / "catalog" / "connectors.yaml").read_text().replace("http://127.0.0.1:9", system.url)
    text = "---\n".join([ours, yaml.safe_dump({"routing": RoutingSpec().model_dump()}), filler_catalog()])
    (work / "e2e").mkdir(parents=True, exist_ok=True)
    (work / "e2e" / "catalog.yaml").write_text(text)
    if PLACEHOLDER_FILLER:
        import redis

        seed_placeholders(redis.Redis.from_url(redis_url), load(work / "e2e"), RoutingSpec().model)
    every = requests()
    clear = [r["text"] for r in every if r["action"] == "create_ticket" and r["expect"]]
    vague = [r["text"] for r in every if r["action"] == "create_ticket" and not r["expect"]]
    pools = ["it_helpdesk", "customer_care", "facilities", "hr_desk"]
    times: dict[str, list[float]] = {"qualified": [], "bare_clear": [], "bare_ambiguous": []}
    outcomes: dict[str, dict[str, int]] = {k: {} for k in times}
    texts = {"qualified": clear, "bare_clear": clear, "bare_ambiguous": vague}
    try:
        fleet = Fleet(text, pools, broker_url=broker_url, redis_url=redis_url, log_dir=work / "e2e")
        try:
            fleet.start(timeout=900)  # a 10,000-action catalog on a busy machine
            with ReachClient(AGENT, broker_url, drop_duplicates=False) as client:
                for n in range(count):
                    for kind in times:
                        description = texts[kind][n % len(texts[kind])]
                        action = "it_helpdesk.create_ticket" if kind == "qualified" else "create_ticket"
                        t0 = time.perf_counter()
                        receipt = client.call(
                            action,
                            {"title": f"e2e-{kind}-{n}"},
                            context={"description": f"{description} (#{n})"},
                            timeout=120,
                        )
                        times[kind].append((time.perf_counter() - t0) * 1000)
                        code = "success" if receipt.success else receipt.error.code.value if receipt.error else "?"
                        outcomes[kind][code] = outcomes[kind].get(code, 0) + 1
            router_log = fleet.log("router")
        finally:
            fleet.stop()
    finally:
        system.stop()
    line = next((x for x in router_log.splitlines() if "semantic routing:" in x), "")
    return {
        "intents_per_kind": count,
        "receipt_ms": {k: {"p50": pct(v, 50), "p99": pct(v, 99)} for k, v in times.items()},
        "outcomes": outcomes,
        "downstream_executions": system.state.items,
        "load_average": os.getloadavg(),
        "index_log": line.split("semantic routing:", 1)[-1].strip(),
    }


def process(work: Path, broker_url: str, redis_url: str, cold: bool) -> dict[str, Any]:
    import redis

    from workers.ops.local_fleet import FleetProcesses, ProcessGroup

    client = redis.Redis.from_url(redis_url)
    if PLACEHOLDER_FILLER:
        directory = with_routing(work / "process-seed", RoutingSpec(), filler_catalog())
        seed_placeholders(client, load(directory), RoutingSpec().model)
    if cold:
        cleared = 0
        for key in client.scan_iter(match="reach:embedding:*", count=1000):
            cleared += client.delete(key)
        print(f"process: cleared {cleared} cached embedding(s)", flush=True)
    out: dict[str, Any] = {"cold_requested": cold}
    for label, spec in (
        ("today", None),  # 10,000 actions, none shared: no index is built, as before semantic routing
        ("baseline_model_none", RoutingSpec(model="none")),
        ("first", RoutingSpec()),
        ("warm", RoutingSpec()),
    ):
        if label == "first" and not cold:
            continue  # the cache is warm already: "first" would measure what "warm" does
        if spec is None:
            directory = work / f"process-{label}"
            directory.mkdir(parents=True, exist_ok=True)
            (directory / "filler.yaml").write_text(filler_catalog(unique=True))
        else:
            directory = with_routing(work / f"process-{label}", spec, filler_catalog())
        (work / f"logs-{label}").mkdir(parents=True, exist_ok=True)
        group = ProcessGroup(work / f"logs-{label}")
        fleet = FleetProcesses(group, directory, broker_url, redis_url, metrics=False)
        started = time.monotonic()
        fleet.start_router()
        try:
            startup = fleet.wait_consuming("reach.intents", timeout=900)
            time.sleep(1.0)  # let start-up garbage settle before reading the RSS
            status = Path(f"/proc/{fleet.pid('router')}/status").read_text()
            rss = int(next(line for line in status.splitlines() if line.startswith("VmRSS:")).split()[1]) / 1024
            hwm = int(next(line for line in status.splitlines() if line.startswith("VmHWM:")).split()[1]) / 1024
            log = fleet.proc("router").log_text()
            line = next((x for x in log.splitlines() if "semantic routing:" in x), "")
        finally:
            fleet.stop_all()
        out[label] = {
            "startup_s": round(time.monotonic() - started if startup else 0.0, 2),
            "rss_mb": round(rss, 1),
            "peak_rss_mb": round(hwm, 1),
            "index_log": line.split("semantic routing:", 1)[-1].strip(),
        }
        print(f"process {label}: {json.dumps(out[label])}", flush=True)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="accuracy,latency,process")
    parser.add_argument("--rounds", type=int, default=3, help="latency: passes over the test split")
    parser.add_argument("--cold", action="store_true", help="process: clear the embedding cache first")
    parser.add_argument("--latency-models", default="use-m3+e5-small,use-m3", help="latency: the models, side by side")
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument(
        "--redis-url", help="Redis for the embedding cache (default: the test harness's own database, per run)"
    )
    parser.add_argument("--e2e-count", type=int, default=100, help="e2e: intents of each kind")
    parser.add_argument(
        "--placeholder-filler",
        action="store_true",
        help="latency, e2e, process: random vectors for the filler's texts missing in the cache (see PLACEHOLDERS)",
    )
    args = parser.parse_args()
    global PLACEHOLDER_FILLER
    PLACEHOLDER_FILLER = args.placeholder_filler
    sections = set(args.only.split(","))
    work = Path(tempfile.mkdtemp(prefix="reach-semantic-"))
    # sections run on their own (--only) are merged into the results of earlier ones
    results: dict[str, Any] = json.loads(args.output.read_text()) if args.output.exists() else {}
    # how busy the machine is: load, and ms for a fixed piece of pure-Python work (125 on a calm run)
    meta = {
        "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "load_average": os.getloadavg(),
        "calibration_ms": machine_speed(),
    }

    def save(section: str, value: Any) -> None:
        results[section] = value
        end = {"load_average_end": os.getloadavg(), "calibration_ms_end": machine_speed()}
        results.setdefault("meta", {})[section] = {**meta, **end}
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(results, indent=2, ensure_ascii=False))

    if sections & {"latency", "process", "e2e"}:
        from tests.fleet import isolated_urls

        if args.redis_url:
            # the harness empties the Redis database it picks (1 + pid % 15): never the cache's
            cache_db = int(args.redis_url.rsplit("/", 1)[-1] or 0)
            if 1 + os.getpid() % 15 == cache_db:
                os.environ["PYTEST_XDIST_WORKER"] = f"gw{cache_db % 15}"
        broker_url, redis_url = isolated_urls()
        redis_url = args.redis_url or redis_url  # a fixed database keeps the cache warm between runs
    try:
        if "accuracy" in sections:
            save("accuracy", accuracy(work))
        if "process" in sections:
            save("process", process(work, broker_url, redis_url, args.cold))
        if "latency" in sections:
            measured = {}
            for model in args.latency_models.split(","):
                measured[model] = latency(work, redis_url, args.rounds, model)
                print(f"latency {model}: {json.dumps(measured[model])}", flush=True)
            save("latency", measured)
        if "e2e" in sections:
            measured = e2e(work, broker_url, redis_url, args.e2e_count)
            print(f"e2e: {json.dumps(measured)}", flush=True)
            save("e2e", measured)
    finally:
        if PLACEHOLDERS:
            drop_placeholders(redis_url)
    print(f"results in {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
