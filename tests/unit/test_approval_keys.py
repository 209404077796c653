"""The approvals' Redis keys (workers/state/keys.py): one Cluster slot for every script's keys, and
an agent's intent id only ever under that agent's name."""

from __future__ import annotations

from redis.crc import key_slot

from workers.state import keys


def test_every_approval_key_shares_one_cluster_slot() -> None:
    together = [keys.approval("a" * 32), keys.approvals_due(), keys.approvals_count()]
    together.append(keys.approval_of_intent("desk", "{evil}:1"))  # braces in an intent id do not count
    assert {key_slot(k.encode()) for k in together} == {key_slot(b"{approvals}")}


def test_an_intent_id_is_filed_under_its_agent() -> None:
    assert keys.approval_of_intent("desk", "eu:X") == "reach:approval-intent:{approvals}:desk:eu:X"
    assert keys.approval_of_intent("desk", "eu:X") != keys.approval_of_intent("desk_eu", "X")
