"""Bearer tokens of ``reach mcp --http``: which token names which agent, and which names none."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import time
from pathlib import Path
from typing import Any

import anyio
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from workers.mcp import tokens
from workers.mcp.tokens import JwtTokens, StaticTokens, TokenConfigError, digest, read_token_file

URL = "https://reach.example/mcp"
SECRET = "a-shared-secret-of-enough-length-32b"


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_the_token_file_maps_each_digest_to_its_agent(tmp_path: Path) -> None:
    path = write(tmp_path / "t.yaml", f"desk_bot: {digest('a')}\nqa_bot: [{digest('b')}, {digest('c').upper()}]\n")
    assert read_token_file(path) == {digest("a"): "desk_bot", digest("b"): "qa_bot", digest("c"): "qa_bot"}
    as_json = write(tmp_path / "t.json", f'{{"desk_bot": "{digest("a")}"}}')
    assert read_token_file(as_json) == {digest("a"): "desk_bot"}


@pytest.mark.parametrize(
    "text, why",
    [
        ("- a\n- b\n", "must map agent names"),
        (f"Desk-Bot: {digest('a')}\n", "is not an agent name"),
        ("desk_bot: secret-token\n", "sha256 hex digest"),
        ("desk_bot: [1, 2]\n", "sha256 hex digest"),
        (f"a_bot: {digest('x')}\nb_bot: {digest('x')}\n", "have the same token"),
        ("desk_bot: [unclosed\n", "not YAML or JSON"),
    ],
)
def test_a_token_file_that_cannot_be_trusted_is_refused_whole(tmp_path: Path, text: str, why: str) -> None:
    with pytest.raises(TokenConfigError, match=why):
        read_token_file(write(tmp_path / "t.yaml", text))


def test_a_missing_token_file_stops_the_facade(tmp_path: Path) -> None:
    with pytest.raises(TokenConfigError, match="cannot read"):
        StaticTokens(tmp_path / "absent.yaml", URL)


def test_a_static_token_names_its_agent_and_a_wrong_one_nobody(tmp_path: Path) -> None:
    verifier = StaticTokens(write(tmp_path / "t.yaml", f"desk_bot: {digest('tok-1')}\n"), URL)
    found = anyio.run(verifier.verify_token, "tok-1")
    assert found is not None and (found.client_id, found.subject, found.resource) == ("desk_bot", "desk_bot", URL)
    assert verifier.agent_for("tok-2") is None
    assert verifier.agent_for("tok-1" + "x" * tokens.MAX_TOKEN_CHARS) is None


def test_a_changed_token_file_is_read_again_and_a_broken_change_keeps_the_last_good_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tokens, "RELOAD_EVERY", 0.0)
    path = write(tmp_path / "t.yaml", f"desk_bot: {digest('old')}\n")
    verifier = StaticTokens(path, URL)
    write(path, f"desk_bot: {digest('new')}\n")
    bump = time.time() + 5
    os.utime(path, (bump, bump))
    assert (verifier.agent_for("new"), verifier.agent_for("old")) == ("desk_bot", None)
    write(path, "desk_bot: not-a-digest\n")
    os.utime(path, (bump + 5, bump + 5))
    assert verifier.agent_for("new") == "desk_bot"


def hs256(**changes: Any) -> str:
    claims = {"sub": "desk_bot", "aud": URL, "exp": int(time.time()) + 300, **changes}
    return jwt.encode({k: v for k, v in claims.items() if v is not None}, SECRET, algorithm="HS256")


def test_a_jwt_for_this_url_names_its_subject() -> None:
    found = anyio.run(JwtTokens(SECRET, "HS256", URL).verify_token, hs256(scope="tools"))
    assert found is not None and (found.client_id, found.resource, found.scopes) == ("desk_bot", URL, ["tools"])


@pytest.mark.parametrize(
    "token",
    [
        hs256(aud="https://other.example/mcp"),
        hs256(exp=int(time.time()) - 120),
        hs256(exp=None),
        hs256(aud=None),
        hs256(sub=None),
        hs256(sub="Desk Bot"),
        jwt.encode({"sub": "desk_bot", "aud": URL, "exp": int(time.time()) + 300}, "another secret" * 3, "HS256"),
        jwt.encode({"sub": "desk_bot", "aud": URL, "exp": int(time.time()) + 300}, None, "none"),
        "not.a.jwt",
    ],
)
def test_any_other_jwt_names_nobody(token: str) -> None:
    assert JwtTokens(SECRET, "HS256", URL).agent_and_claims(token) is None


def test_the_issuer_is_checked_when_configured() -> None:
    verifier = JwtTokens(SECRET, "HS256", URL, issuer="https://idp.example")
    assert verifier.agent_and_claims(hs256(iss="https://idp.example")) is not None
    assert verifier.agent_and_claims(hs256(iss="https://evil.example")) is None
    assert verifier.agent_and_claims(hs256()) is None


def test_rs256_takes_the_public_key_and_refuses_an_hs256_token_made_with_it() -> None:
    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    public_pem = (
        private.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )
    verifier = JwtTokens(public_pem, "RS256", URL)
    good = jwt.encode({"sub": "desk_bot", "aud": URL, "exp": int(time.time()) + 300}, private, algorithm="RS256")
    assert verifier.agent_and_claims(good) is not None
    # the classic confusion: an HS256 token whose HMAC secret is the (public) key
    claims = {"sub": "desk_bot", "aud": URL, "exp": int(time.time()) + 300}
    signing_input = f"{b64(json.dumps({'alg': 'HS256', 'typ': 'JWT'}).encode())}.{b64(json.dumps(claims).encode())}"
    mac = hmac.new(public_pem.encode(), signing_input.encode(), hashlib.sha256).digest()
    assert verifier.agent_and_claims(f"{signing_input}.{b64(mac)}") is None
    with pytest.raises(TokenConfigError, match="not a usable RS256 key"):
        JwtTokens("not a pem", "RS256", URL)


def b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def test_the_http_facade_never_runs_without_a_way_to_authenticate() -> None:
    with pytest.raises(TokenConfigError, match="no way to authenticate agents"):
        tokens.verifier(URL, None, None, "RS256", None)
