"""Semantic routing through the real fleet: three systems offer create_ticket; English and Chinese
requests reach the right real downstream (each counts what it executed), an ambiguous one gets
AMBIGUOUS_ACTION and reaches none, with every candidate (tier open) or with the best two, the
first suggested (tier confirm), which one yes settles; the choice is in the receipt and in
`reach trace`; reach.find_tools and `reach route` answer; the embedding cache in Redis makes a
restarted router embed nothing and a changed description embed one action."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from click.testing import CliRunner

from connectors.catalog import build
from connectors.loader import load_directory
from producers.client import ReachClient
from tests.fleet import BROKER_URL, REDIS_URL, Fleet
from tests.integration.counting_system import CountingSystem
from tests.waiting import wait_for
from workers.cli import main as reach_cli
from workers.router.semantic import SemanticRouting
from workers.state import keys
from workers.state.embeddings import RedisVectorCache

RUN = uuid.uuid4().hex[:6]
AGENT = f"sem_{RUN}"
DESKS = {
    "it_desk": "IT service desk. Problems with employees' laptops, accounts, passwords, VPN and software.",
    "care_desk": "Customer care. Complaints of our customers about orders, deliveries, refunds and faulty products.",
    "fm_desk": "Facilities management. Repairs in our offices - lighting, heating, air conditioning, plumbing, cleaning.",
}


def catalog_yaml(urls: dict[str, str], descriptions: dict[str, str] = DESKS) -> str:
    docs = [
        f"""\
connector:
  name: {name}
  description: "{descriptions[name]}"
  endpoint: {urls[name]}
  actions:
    - action: create_ticket
      description: Open a ticket
      path: POST /items
      input:
        title: {{ type: string, required: true, description: Short summary }}
      permission: write
"""
        for name in DESKS
    ]
    bindings = "".join(f"    - {{ connector: {name}, allowed_actions: ['*'] }}\n" for name in DESKS)
    docs.append(f"agent_app:\n  name: {AGENT}\n  connector_bindings:\n{bindings}")
    return "---\n".join(docs)


@pytest.fixture(scope="module")
def systems() -> Iterator[dict[str, CountingSystem]]:
    running = {name: CountingSystem().start() for name in DESKS}
    yield running
    for system in running.values():
        system.stop()


@pytest.fixture(scope="module")
def fleet(systems: dict[str, CountingSystem]) -> Iterator[Fleet]:
    with Fleet(catalog_yaml({n: s.url for n, s in systems.items()}), list(DESKS)) as running:
        yield running


@pytest.fixture(scope="module")
def client(fleet: Fleet) -> Iterator[ReachClient]:
    with ReachClient(AGENT, BROKER_URL, drop_duplicates=False) as reach:
        yield reach


def executions(systems: dict[str, CountingSystem], title: str) -> dict[str, int]:
    return {name: system.executions()[title] for name, system in systems.items()}


def cli(fleet: Fleet, *args: str) -> Any:
    env = {"REACH_CATALOG": str(fleet.dir), "REACH_REDIS_URL": REDIS_URL, "REACH_BROKER_URL": BROKER_URL}
    return CliRunner().invoke(reach_cli, list(args), env=env)


@pytest.mark.parametrize(
    "description, expected",
    [
        ("My laptop won't boot since the update and I can't reach the VPN", "it_desk"),
        ("我的电脑开不了机，公司VPN也连不上", "it_desk"),
        ("A customer says her parcel arrived broken and wants a refund", "care_desk"),
        ("客户投诉订单一直没有送到，要求退款", "care_desk"),
        ("The heating in our office is off and a pipe in the toilet is leaking", "fm_desk"),
        ("三楼的空调坏了，办公室太热", "fm_desk"),
    ],
)
def test_a_request_in_english_or_chinese_reaches_the_system_it_means(
    client: ReachClient, systems: dict[str, CountingSystem], description: str, expected: str
) -> None:
    title = f"t-{uuid.uuid4().hex[:8]}"
    receipt = client.call("create_ticket", {"title": title}, context={"description": description}, timeout=60)
    assert receipt.success and receipt.connector == expected, receipt.error
    assert executions(systems, title) == {name: int(name == expected) for name in DESKS}
    routing = receipt.execution.routing
    assert routing is not None and routing["method"] == "semantic" and routing["model"].startswith("use-m3@")
    assert routing["candidates"][0]["action"] == f"{expected}.create_ticket"
    assert routing["lead"] >= routing["margin"] and len(routing["candidates"]) == 3 and routing["tier"] == "dispatch"


def test_an_ambiguous_request_is_the_open_tier_with_every_candidate_and_reaches_no_system(
    client: ReachClient, systems: dict[str, CountingSystem]
) -> None:
    title = f"t-{uuid.uuid4().hex[:8]}"
    # IT (a printer) or facilities (in the office): the pair's lead is about 0.0004
    receipt = client.call(
        "create_ticket", {"title": title}, context={"description": "the printer in the office is broken"}, timeout=60
    )
    assert receipt.status == "rejected" and receipt.error is not None
    assert receipt.error.code == "AMBIGUOUS_ACTION" and receipt.error.retryable is False
    assert receipt.execution.routing is not None and receipt.execution.routing["tier"] == "open"
    assert {d["action"] for d in receipt.error.details} == {f"{n}.create_ticket" for n in DESKS}
    scores = [d["score"] for d in receipt.error.details]
    assert scores == sorted(scores, reverse=True)  # best first
    for detail in receipt.error.details:
        assert detail["description"] == DESKS[detail["connector"]] and "suggested" not in detail
    assert "Ask the user which system" in receipt.error.suggestion
    time.sleep(0.5)  # nothing may arrive late either
    assert executions(systems, title) == {name: 0 for name in DESKS}
    assert all(system.requests(title=title) == [] for system in systems.values())


def test_a_close_request_is_the_confirm_tier_and_one_yes_settles_it(
    client: ReachClient, systems: dict[str, CountingSystem], fleet: Fleet
) -> None:
    title = f"t-{uuid.uuid4().hex[:8]}"
    # facilities (air conditioning) leads IT (a laptop) by about 0.028: under the margin, over confirm_margin
    asked = client.call(
        "create_ticket", {"title": title}, context={"description": "the air conditioning on my laptop"}, timeout=60
    )
    assert asked.error is not None and asked.error.code == "AMBIGUOUS_ACTION"
    routing = asked.execution.routing
    assert routing is not None and routing["tier"] == "confirm"
    assert routing["confirm_margin"] <= routing["lead"] < routing["margin"]
    assert [(d["action"], d["suggested"]) for d in asked.error.details] == [
        ("fm_desk.create_ticket", True),
        ("it_desk.create_ticket", False),
    ]
    assert "one yes/no question" in asked.error.suggestion and '"fm_desk.create_ticket"' in asked.error.suggestion
    # the trace's rejected stage carries the tier too
    trace = wait_for(
        lambda: cli(fleet, "trace", asked.intent_id, "--agent", AGENT),
        timeout=20,
        message="the router's rejected stage never reached the trace",
        every=0.2,
        until=lambda r: r.exit_code == 0 and " rejected " in r.output,
    )
    rejected = next(line for line in trace.output.splitlines() if " rejected " in line)
    assert "'tier': 'confirm'" in rejected
    assert executions(systems, title) == {name: 0 for name in DESKS}
    # the user says yes: the agent sends the suggested qualified action, which needs no ranking
    done = client.call(asked.error.details[0]["action"], {"title": title}, timeout=60)
    assert done.success and done.connector == "fm_desk" and done.execution.routing is None
    assert executions(systems, title) == {"it_desk": 0, "care_desk": 0, "fm_desk": 1}


def test_reach_trace_shows_the_candidates_and_scores(client: ReachClient, fleet: Fleet) -> None:
    receipt = client.call(
        "create_ticket", {"title": "trace me"}, context={"description": "my password expired"}, timeout=60
    )
    assert receipt.success and receipt.connector == "it_desk"
    result = wait_for(
        lambda: cli(fleet, "trace", receipt.intent_id, "--agent", AGENT),
        timeout=20,
        message="the router's stages never reached the trace",
        every=0.2,
        until=lambda r: r.exit_code == 0 and " dispatched " in r.output,
    )
    dispatched = next(line for line in result.output.splitlines() if " dispatched " in line)
    assert "routing=" in dispatched and "'method': 'semantic'" in dispatched and "'tier': 'dispatch'" in dispatched
    for name in DESKS:
        assert f"'action': '{name}.create_ticket', 'score':" in dispatched


def test_find_tools_answers_the_top_tools_in_the_format_asked(client: ReachClient) -> None:
    receipt = client.call(
        "reach.find_tools", {"description": "the heating is broken", "k": 2, "format": "anthropic"}, timeout=60
    )
    assert receipt.success and receipt.action == "reach.find_tools" and receipt.connector is None
    tools = receipt.data["tools"]
    assert [t["name"] for t in tools][0] == "fm_desk__create_ticket" and len(tools) == 2
    assert set(tools[0]) == {"name", "description", "input_schema"}
    assert tools[0]["input_schema"]["required"] == ["title"]


def test_reach_route_prints_the_ranking(fleet: Fleet) -> None:
    result = cli(fleet, "route", "客户的包裹丢了，要求退款", "--action", "create_ticket", "--agent", AGENT)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].split()[:3] == ["#", "action", "score"]
    assert lines[2].split()[1] == "care_desk.create_ticket"  # the first row under the header
    assert "dispatch to care_desk.create_ticket" in result.output
    unclear = cli(fleet, "route", "do it", "--action", "create_ticket", "--agent", AGENT)
    assert unclear.exit_code == 0 and "AMBIGUOUS_ACTION" in unclear.output


def test_a_restarted_router_takes_every_embedding_from_the_cache(client: ReachClient, fleet: Fleet) -> None:
    fleet.stop_process("router")
    fleet.start_process("router", ["router"])
    fleet.wait_consuming("reach.intents")
    line = [x for x in fleet.log("router").splitlines() if "semantic routing: model" in x][-1]
    assert "(3 from the cache, 0 embedded)" in line, line
    receipt = client.call(
        "create_ticket", {"title": "after restart"}, context={"description": "VPN is down"}, timeout=60
    )
    assert receipt.success and receipt.connector == "it_desk"


def test_a_changed_description_embeds_that_action_only(systems: dict[str, CountingSystem], tmp_path: Path) -> None:
    changed = dict(DESKS, fm_desk=DESKS["fm_desk"] + f" Also parking spaces ({RUN}).")
    (tmp_path / "catalog.yaml").write_text(catalog_yaml({n: s.url for n, s in systems.items()}, changed))
    catalog, problems = build(load_directory(tmp_path))
    assert not problems
    client = redis.Redis.from_url(REDIS_URL)
    routing = SemanticRouting(catalog, RedisVectorCache(client))
    index = routing.index()
    try:
        assert (index.from_cache, index.embedded) == (2, 1)
        again = SemanticRouting(catalog, RedisVectorCache(client)).index()
        assert (again.from_cache, again.embedded) == (3, 0)
    finally:  # this run's own text: do not leave it for a month
        text = index.texts[index.rows[("fm_desk", "create_ticket")]]
        client.delete(*(keys.embedding(k) for k in index.cache_keys(text)))


def _restart_router_without_cached_embeddings(fleet: Fleet) -> str:
    """A new replica on a fresh Redis: the embedding cache emptied, the router started again; its
    index line."""
    client = redis.Redis.from_url(REDIS_URL)
    for key in client.scan_iter(match=keys.embedding("*"), count=1000):
        client.delete(key)
    fleet.stop_process("router")
    fleet.start_process("router", ["router"])
    fleet.wait_consuming("reach.intents")
    return [x for x in fleet.log("router").splitlines() if "semantic routing: model" in x][-1]


def test_reach_route_warm_saves_vectors_a_new_router_starts_from_and_a_bad_file_is_ignored(
    client: ReachClient, fleet: Fleet
) -> None:
    saved = fleet.dir / "routing-vectors.npz"
    try:
        warmed = cli(fleet, "route", "warm")
        assert warmed.exit_code == 0, warmed.output
        assert "saved 6 vector(s) of use-m3+e5-small for 3 text(s)" in warmed.output and saved.is_file()
        line = _restart_router_without_cached_embeddings(fleet)
        assert "(3 from the cache, 0 embedded)" in line, line
        receipt = client.call(
            "create_ticket", {"title": "from the file"}, context={"description": "my VPN is down"}, timeout=60
        )
        assert receipt.success and receipt.connector == "it_desk"
        # a damaged file (half of it) is not trusted: the router embeds and still routes
        saved.write_bytes(saved.read_bytes()[: saved.stat().st_size // 2])
        line = _restart_router_without_cached_embeddings(fleet)
        assert "(0 from the cache, 3 embedded)" in line, line
        assert "saved vectors in" in fleet.log("router") and "ignored" in fleet.log("router")
        receipt = client.call(
            "create_ticket", {"title": "after a bad file"}, context={"description": "my VPN is down"}, timeout=60
        )
        assert receipt.success and receipt.connector == "it_desk"
    finally:
        saved.unlink(missing_ok=True)
