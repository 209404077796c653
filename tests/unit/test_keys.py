"""Every Redis key comes from workers/state/keys.py, and no agent's input can reach another agent's keys."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from redis.crc import key_slot

from connectors.adapters.auth import state_key
from producers.wire import AGENT_ID_PATTERN, Intent
from workers.state import keys

REPO = Path(__file__).resolve().parents[2]
ID = "ORDER-1"


@pytest.mark.parametrize("build", [keys.receipt, keys.sent, keys.deliveries, keys.trace])
def test_two_agents_with_the_same_intent_id_get_different_keys(build) -> None:  # type: ignore[no-untyped-def]
    assert build("desk", ID) != build("desk_eu", ID)
    assert build("desk", ID).startswith(keys.PREFIX) and build("desk", ID).endswith(":{desk}:" + ID)


def test_per_intent_keys_start_with_the_agent() -> None:
    assert keys.receipt("desk", "eu:ORDER-1") == "reach:receipt:{desk}:eu:ORDER-1"
    assert keys.sent("desk", ID) == "reach:receipt-sent:{desk}:ORDER-1"
    assert keys.deliveries("desk", ID) == "reach:deliveries:{desk}:ORDER-1"
    assert keys.trace("desk", ID) == "reach:trace:{desk}:ORDER-1"
    assert keys.idempotency("desk", "tickets", "create_ticket", "k:1") == "reach:idem:{desk}:tickets:create_ticket:k:1"
    assert keys.rate_limit("desk", "tickets") == "reach:rl:{desk}:tickets"


def test_an_unknown_agent_files_under_a_name_no_agent_can_have() -> None:
    assert keys.receipt(None, ID) == keys.receipt("", ID) == "reach:receipt:{-}:ORDER-1"
    assert not AGENT_ID_PATTERN.match(keys.NO_AGENT)


def test_the_same_intent_id_under_two_agents_never_collides_once_colons_are_refused() -> None:
    """With ':' allowed in agent names, agent "desk" with intent "eu:X" and agent "desk:eu" with
    intent "X" shared every key; the name pattern now refuses the second agent."""
    assert keys.receipt("desk", "eu:X") == "reach:receipt:{desk}:eu:X"
    assert not AGENT_ID_PATTERN.match("desk:eu")
    assert keys.receipt("desk", "eu:X") != keys.receipt("desk_eu", "X")


@pytest.mark.parametrize(
    "name", ["desk:eu", "desk.eu", "Desk", "desk-eu", "-", "", "_x", "1x", "a" * 64, "a b", "desk\n"]
)
def test_names_with_colons_dots_or_capitals_are_refused(name: str) -> None:
    assert not AGENT_ID_PATTERN.match(name)
    with pytest.raises(ValueError, match="agent_id"):
        Intent(action="create_ticket", agent_id=name)


@pytest.mark.parametrize("name", ["d", "desk", "desk_eu", "bot2", "a" * 63])
def test_lowercase_names_are_accepted(name: str) -> None:
    assert AGENT_ID_PATTERN.match(name) and Intent(action="x", agent_id=name).agent_id == name


def test_intent_ids_keep_their_wider_pattern() -> None:
    assert Intent(action="x", intent_id="eu:ORDER-1.A_b").intent_id == "eu:ORDER-1.A_b"


@pytest.mark.parametrize("field", ["intent_id", "idempotency_key"])
def test_a_trailing_newline_is_not_part_of_any_id(field: str) -> None:
    with pytest.raises(ValueError, match=field):
        Intent(action="x", **{field: "ORDER-1\n"})


def test_connector_keys() -> None:
    assert [keys.breaker("c"), keys.health("c"), keys.paused("c"), keys.workers("c"), keys.last_error("c")] == [
        "reach:breaker:{c}",
        "reach:health:{c}",
        "reach:paused:{c}",
        "reach:workers:{c}",
        "reach:last-error:{c}",
    ]
    assert keys.alive("h:1:ab") == "reach:alive:h:1:ab"
    assert keys.abandoned(keys.idempotency("desk", "c", "a", "k"), "a1") == "reach:abandoned:{desk}:a1"
    assert all(keys.connector_of(build("c")) == "c" for build in (keys.breaker, keys.health, keys.workers))


def test_the_trace_index_is_one_key_per_intent_id_whatever_the_agent() -> None:
    """``reach trace`` without ``--agent`` reads this set instead of scanning for ``reach:trace:{*}:X``."""
    assert keys.trace_agents("X") == "reach:trace-agents:X" != keys.trace_agents("eu:X")
    assert keys.tag_of(keys.trace_agents("X")) == ""  # spans agents: no agent's slot


def test_no_module_but_keys_spells_a_redis_key() -> None:
    """The one-place rule: "reach:<prefix>:" literals live in workers/state/keys.py only."""
    literal = re.compile(r"""["']reach:[a-z-]+:""")
    offenders = [
        f"{path.relative_to(REPO)}:{n}"
        for root in ("workers", "producers", "connectors")
        for path in (REPO / root).rglob("*.py")
        if path.name != "keys.py"
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if literal.search(line)
    ]
    assert offenders == []


def slot(key: str) -> int:
    return key_slot(key.encode())


def test_an_agents_keys_share_one_cluster_slot() -> None:
    """Everything one pool script touches for an intent hashes to the agent's slot (Redis Cluster)."""
    record = keys.idempotency("desk", "tickets", "create_ticket", "{k}:1")  # braces in the agent's text do not count
    together = [keys.sent("desk", ID), keys.deliveries("desk", ID), record, keys.abandoned(record, "a1")]
    together += [keys.receipt("desk", ID), keys.trace("desk", ID), keys.rate_limit("desk", "tickets")]
    assert {slot(k) for k in together} == {slot("{desk}")}
    assert keys.tag_of(record) == "{desk}" and keys.tag_of(keys.alive("w")) == ""


def test_a_connectors_keys_share_one_cluster_slot() -> None:
    together = [keys.breaker("tickets"), keys.health("tickets"), keys.paused("tickets"), keys.workers("tickets")]
    together += [keys.last_error("tickets"), state_key("tickets"), state_key("tickets") + ":lock"]
    assert {slot(k) for k in together} == {slot("{tickets}")}


def test_two_agents_spread_over_slots() -> None:
    assert len({slot(keys.sent(f"agent_{i}", ID)) for i in range(20)}) > 15
