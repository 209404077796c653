"""Every Lua script of the fleet touches only keys it was given in KEYS, and every call of a script
gives it keys of one Redis Cluster slot (Redis Cluster routes a script by its KEYS; a key built
inside the script, or one of another slot, may live on another node and is refused)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from redis.crc import key_slot

from connectors.adapters.auth import Tokens, state_key
from connectors.adapters.auth.token_store import _SAVE_IF_CURRENT
from connectors.adapters.auth.token_store import RedisTokens as _RedisTokens
from connectors.rates import parse_rate
from connectors.spec import BreakerSpec
from workers.state import approval_store, breaker, history, keys, ledger, ratelimit
from workers.state.breaker import SharedBreaker
from workers.state.ledger import Heartbeat, Ledger
from workers.state.ratelimit import RedisRateLimiter

SCRIPTS = {
    name: getattr(module, name)
    for module in (ledger, breaker, ratelimit, approval_store, history)
    for name in dir(module)
    if re.fullmatch(r"_[A-Z_]+", name)
    and isinstance(getattr(module, name), str)
    and "redis.call" in getattr(module, name)
    and name != "_CLAIM_BODY"  # a part of _CLAIM and _BEGIN, checked in them
}
SCRIPTS["_SAVE_IF_CURRENT"] = _SAVE_IF_CURRENT
# the first argument of every redis.call is the key (for the commands the scripts use)
CALL = re.compile(r"redis\.call\('(?P<cmd>[A-Z]+)',\s*(?P<key>[^,)]+)")
FROM_KEYS = re.compile(r"local (\w+) = KEYS\[\d\]")
NO_KEY = {"TIME"}


def test_the_scripts_are_found() -> None:
    assert {"_CLAIM", "_BEGIN", "_TAKE_OVER", "_ABANDON", "_GCRA", "_ACQUIRE", "_RECORD", "_PEEK"} <= set(SCRIPTS)


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_every_key_comes_from_keys(name: str) -> None:
    script = SCRIPTS[name]
    aliases = set(FROM_KEYS.findall(script))
    for call in CALL.finditer(script):
        if call["cmd"] in NO_KEY:
            continue
        key = call["key"].strip()
        # (a loop over its keys: ``KEYS[i]``)
        assert re.fullmatch(r"KEYS\[(\d|i)\]", key) or key in aliases, f"{name}: {call[0]} names a key not from KEYS"


class Recorder:
    """A client and pipeline in one that records every EVAL's keys and answers with ``reply``."""

    def __init__(self, reply: list[Any]) -> None:
        self.reply = reply
        self.evals: list[tuple[str, list[str]]] = []
        self._queued: list[Any] = []

    def pipeline(self, transaction: bool = False) -> Recorder:
        return self

    def execute_command(self, command: str, *args: Any, **options: Any) -> Recorder:
        assert command == "EVAL", command
        script, numkeys, *keys_and_args = args
        self.evals.append((script, [str(k) for k in keys_and_args[:numkeys]]))
        self._queued.append(self.reply)
        return self

    def register_script(self, script: str) -> Any:
        def run(keys: list[str], args: list[Any], client: Any = None) -> Any:
            self.evals.append((script, list(keys)))
            return self.reply

        return run

    def hmget(self, key: str, *fields: str) -> Recorder:
        self._queued.append([None] * len(fields))
        return self

    def __getattr__(self, command: str) -> Any:
        def queue(*args: Any, **kwargs: Any) -> Recorder:
            self._queued.append(None)
            return self

        return queue

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        queued, self._queued = self._queued, []
        return queued


def single_slot(recorder: Recorder) -> None:
    assert recorder.evals
    for _, names in recorder.evals:
        slots = {key_slot(name.encode()) for name in names}
        assert len(slots) == 1, f"a script is given keys of {len(slots)} slots: {names}"


def test_the_ledgers_scripts_are_given_keys_of_one_slot() -> None:
    recorder = Recorder(["claimed", "", "", 1, 0, ""])
    beat = Heartbeat(recorder)  # type: ignore[arg-type]
    book = Ledger(recorder, beat, 60)  # type: ignore[arg-type]
    record = keys.idempotency("desk", "tickets", "create_ticket", "k-1")
    book.begin(keys.sent("desk", "i-1"), keys.deliveries("desk", "i-1"), record, "h", "i-1", "a1", 5, keys.breaker("t"))
    book.claim(record, "h", "i-1", "a1")
    book.abandon(record, "a1")
    recorder.reply = [1]
    recorder.hget = lambda *_: b"w"  # type: ignore[method-assign]
    book.take_over(record, "i-1", "a2")
    single_slot(recorder)
    assert {script for script, _ in recorder.evals} == {
        ledger._BEGIN,
        ledger._CLAIM,
        ledger._ABANDON,
        ledger._TAKE_OVER,
    }


def test_the_breakers_and_rate_limits_scripts_are_given_keys_of_one_slot() -> None:
    recorder = Recorder([1, "closed", 0, 0])
    shared = SharedBreaker(recorder, "tickets", BreakerSpec())  # type: ignore[arg-type]
    shared.acquire()
    shared.record_into(recorder, "failure")
    shared.peek_into(recorder)  # type: ignore[arg-type]
    RedisRateLimiter(recorder).hit_into(recorder, "desk", "tickets", parse_rate("5/sec"))  # type: ignore[arg-type]
    _RedisTokens(recorder, "tickets", "first").save("old", Tokens("at", "rt", 0.0))
    single_slot(recorder)
    assert key_slot(state_key("tickets").encode()) == key_slot(keys.breaker("tickets").encode())


def test_a_history_records_script_is_given_keys_of_its_agents_slot() -> None:
    from connectors import history as records
    from connectors.spec import ActionSpec, FieldSpec

    action = ActionSpec(
        action="create_order", input={"order_id": FieldSpec(entity="order"), "sku": FieldSpec(entity="sku")}
    )
    rec = records.record(
        agent="desk",
        intent_id="i-1",
        connector="shop",
        action=action,
        status="succeeded",
        code=None,
        at="2026-01-01T00:00:00Z",
        at_ms=1,
        trace_id="t",
        params={"order_id": "123", "sku": "a"},
        data=None,
        retain_seconds=60,
        version="v",
    )
    recorder = Recorder([1])
    history.RedisHistory(recorder, 60).write_into(recorder, rec)  # type: ignore[arg-type]
    single_slot(recorder)
    assert len(recorder.evals[0][1]) == 4  # the record, its action's index and two entities'
