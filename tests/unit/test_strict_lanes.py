"""The router's lanes when only the broker's word counts (REACH_REQUIRE_USER_ID=1): a claimed
name never buys a lane, so a flood of unauthenticated messages under many names shares one."""

from __future__ import annotations

from typing import Any

from workers.transport.consuming import ANONYMOUS, lanes_for, sender_key


class Message:
    def __init__(self, body: bytes, user_id: str | None = None, headers: dict[str, Any] | None = None) -> None:
        self.body = body
        self.properties = {"user_id": user_id} if user_id else {}
        self.headers = headers or {}


def test_claimed_names_share_the_anonymous_lane_when_user_id_is_required() -> None:
    lane = lanes_for(require_user_id=True)
    flood = {lane(Message(b'{"agent_id": "desk_%d"}' % n, headers={"agent_id": f"desk_{n}"})) for n in range(100)}
    assert flood == {ANONYMOUS}
    assert lane(Message(b"{}", user_id="desk")) == "u:desk"


def test_claims_name_lanes_where_claims_are_the_identity() -> None:
    assert lanes_for(require_user_id=False) is sender_key
    assert sender_key(Message(b'{"agent_id": "desk"}')) == "a:desk" != sender_key(Message(b"{}", user_id="desk"))
