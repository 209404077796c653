"""Every Lua script of the fleet touches only keys it was given in KEYS (Redis Cluster routes a
script by its KEYS; a key built inside the script may live on another node)."""

from __future__ import annotations

import re

import pytest

from workers.state import breaker, ledger, ratelimit

SCRIPTS = {
    name: getattr(module, name)
    for module in (ledger, breaker, ratelimit)
    for name in dir(module)
    if re.fullmatch(r"_[A-Z_]+", name)
    and isinstance(getattr(module, name), str)
    and "redis.call" in getattr(module, name)
    and name != "_CLAIM_BODY"  # a part of _CLAIM, _JUDGE and _BEGIN, checked in them
}
# the first argument of every redis.call is the key (for the commands the scripts use)
CALL = re.compile(r"redis\.call\('(?P<cmd>[A-Z]+)',\s*(?P<key>[^,)]+)")
FROM_KEYS = re.compile(r"local (\w+) = KEYS\[\d\]")
# a local left nil is never used as a key (the claim returns before it would be)
UNSET = re.compile(r"local (\w+) = nil")
NO_KEY = {"TIME"}


def test_the_scripts_are_found() -> None:
    assert {"_CLAIM", "_JUDGE", "_BEGIN", "_TAKE_OVER", "_ABANDON", "_GCRA", "_ACQUIRE"} <= set(SCRIPTS)


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_every_key_comes_from_keys(name: str) -> None:
    script = SCRIPTS[name]
    aliases = set(FROM_KEYS.findall(script)) | set(UNSET.findall(script))
    for call in CALL.finditer(script):
        if call["cmd"] in NO_KEY:
            continue
        key = call["key"].strip()
        assert re.fullmatch(r"KEYS\[\d\]", key) or key in aliases, f"{name}: {call[0]} names a key not from KEYS"
