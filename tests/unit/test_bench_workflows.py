"""bench/workflows.py (issue 32): its catalog loads (the workflow's references check out), Redis
bytes are grouped and divided per run as the report says, and a profile's stacks are read into
milliseconds per transition. The benchmark's figures are only as good as these."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import redis_keys  # noqa: E402
import workflows  # noqa: E402

from connectors.catalog import load_catalog  # noqa: E402


def test_the_benchmark_catalog_loads_with_both_workflows(tmp_path: Path) -> None:
    (tmp_path / "catalog.yaml").write_text(workflows.catalog("http://127.0.0.1:9"))
    catalog = load_catalog(tmp_path)
    assert [s.id for s in catalog.workflows[workflows.WORKFLOW].steps] == ["a", "b", "c"]
    assert [s.id for s in catalog.workflows[workflows.WORKFLOW_ONE].steps] == ["a"]


def test_keys_fall_into_families_before_their_tag() -> None:
    assert redis_keys.family("reach:wf-run:{bench_wf_agent}:abc") == "reach:wf-run"
    assert redis_keys.family("reach:wf-runs:{workflows}") == "reach:wf-runs"
    assert redis_keys.family("reach:trace-agents:abc") == "reach:trace-agents"


def test_a_delta_counts_new_keys_growth_and_keys_that_never_expire() -> None:
    before = redis_keys.Snapshot(1000, {"reach:wf-runs:{workflows}": (100, -1)})
    after = redis_keys.Snapshot(
        5000,
        {
            "reach:wf-runs:{workflows}": (300, -1),
            "reach:wf-run:{a}:1": (1000, 3_600_000),
            "reach:wf-run:{a}:2": (1000, 7_200_000),
        },
    )
    out = redis_keys.delta(before, after, per=2)
    assert out["used_memory_per_run"] == 2000
    run = out["families"]["reach:wf-run"]
    assert (run["keys_per_run"], run["bytes_per_run"], run["no_ttl"], run["ttl_h"]) == (1.0, 1000, 0, [1.0, 2.0])
    index = out["families"]["reach:wf-runs"]
    assert (index["keys_per_run"], index["bytes_per_run"], index["no_ttl"]) == (0.0, 100, 1)


def test_a_profile_is_read_as_milliseconds_per_transition(tmp_path: Path) -> None:
    handler = "thread (1);_work (workers/transport/consuming.py:1);on_message (workers/ops/workflow_runner.py:54)"
    stacks = tmp_path / "wall.txt"
    stacks.write_text(
        f"{handler};WorkflowRuns.load (workers/state/workflow_runs.py:80) 30\n"
        f"{handler};Publisher.publish (workers/transport/publisher.py:116) 50\n"
        "thread (2);FairLanes.take (workers/transport/consuming.py:181) 900\n"
    )
    out = workflows.per_transition(stacks, transitions=10, hz=100)
    assert out == {"handling": 80.0, "WorkflowRuns.load": 30.0, "Publisher.publish": 50.0}
