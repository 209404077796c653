"""The auth kinds form_login, mtls, oauth2_refresh_token and jwt, each through the HTTP adapter
against a real local system (tests/integration/auth_servers.py) that checks credentials itself.

No services: the refresh-token store is this process's memory here; the Redis store shared by
several processes is exercised in tests/integration/test_auth_kinds.py.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from connectors.adapters.auth import MissingSecret, RefreshTokenAuth, build_auth, state_key
from connectors.adapters.base import CallContext, Outcome
from connectors.adapters.http import HttpAdapter
from connectors.spec import ConnectorSpec
from producers.wire import ErrorCode
from tests.integration.auth_servers import FormLoginApp, JwtApi, MtlsServer, OAuthServer, TlsFiles
from tests.waiting import wait_for

HS_KEY = "k" * 40


def connector(name: str, endpoint: str, auth: dict[str, Any], *actions: dict[str, Any]) -> ConnectorSpec:
    return ConnectorSpec.model_validate(
        {
            "name": name,
            "endpoint": endpoint,
            "auth": auth,
            "actions": list(actions) or [{"action": "me", "path": "GET /api/me"}],
        }
    )


def call(adapter: HttpAdapter, action: str = "me", params: dict[str, Any] | None = None, **ctx: Any) -> Outcome:
    spec = adapter.connector.action(action)
    assert spec is not None
    context = {"intent_id": "intent-1", "agent_id": "desk", "connector": adapter.connector.name, "action": action}
    return adapter.call(spec, params or {}, CallContext(**{**context, **ctx}))


def in_threads(n: int, work: Callable[[], Outcome]) -> list[Outcome]:
    results: list[Outcome] = []
    lock = threading.Lock()

    def run() -> None:
        outcome = work()
        with lock:
            results.append(outcome)

    threads = [threading.Thread(target=run) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return results


# -- form_login ---------------------------------------------------------------------------------

FORM_ENV = {"DESK_USER": "clerk", "DESK_PASSWORD": "open sesame"}
NOTE = {"action": "add_note", "path": "POST /api/notes", "permission": "write", "input": {"text": {"required": True}}}


@pytest.fixture
def form_app() -> Iterator[FormLoginApp]:
    app = FormLoginApp()
    app.start()
    yield app
    app.stop()


def form_adapter(app: FormLoginApp, env: dict[str, str] = FORM_ENV, login_url: str | None = None) -> HttpAdapter:
    auth = {
        "type": "form_login",
        "login_url": login_url or app.url + "/login",
        "username_env": "DESK_USER",
        "password_env": "DESK_PASSWORD",
    }
    spec = connector("desk", app.url, auth, {"action": "me", "path": "GET /api/me"}, NOTE)
    return HttpAdapter(spec, environ=env)


def test_form_login_logs_in_once_for_many_threads_and_sends_the_session_cookie(form_app: FormLoginApp) -> None:
    form_app.login_delay = 0.2  # every thread arrives while the first login is under way
    adapter = form_adapter(form_app)
    outcomes = in_threads(12, lambda: call(adapter))
    assert [o.ok for o in outcomes] == [True] * 12
    assert outcomes[0].data == {"user": "clerk"}
    assert form_app.logins == 1 and form_app.most_logins_in_flight == 1
    assert all(seen.startswith("sid=") for seen in form_app.cookies_seen)
    adapter.close()


@pytest.mark.parametrize("expired", ["401", "redirect"])
def test_an_expired_session_logs_in_again_and_the_write_is_resent_once(form_app: FormLoginApp, expired: str) -> None:
    form_app.expired = expired
    adapter = form_adapter(form_app)
    assert call(adapter, "add_note", {"text": "first"}).ok
    form_app.expire_sessions()
    outcome = call(adapter, "add_note", {"text": "second"})
    assert outcome.ok and outcome.data == {"text": "second", "saved": True}
    assert form_app.logins == 2
    assert form_app.refused == 1  # the refused request did nothing; its resend did it once
    assert form_app.notes == {"first": 1, "second": 1}
    adapter.close()


def test_threads_that_meet_an_expired_session_share_one_new_login(form_app: FormLoginApp) -> None:
    adapter = form_adapter(form_app)
    assert call(adapter).ok
    form_app.expire_sessions()
    form_app.login_delay = 0.2
    assert [o.ok for o in in_threads(8, lambda: call(adapter))] == [True] * 8
    assert form_app.logins == 2
    adapter.close()


def test_a_refused_login_fails_the_call_as_auth_failed_before_anything_is_sent(form_app: FormLoginApp) -> None:
    adapter = form_adapter(form_app, {**FORM_ENV, "DESK_PASSWORD": "wrong horse"})
    outcome = call(adapter, "add_note", {"text": "never"})
    assert outcome.code == ErrorCode.DOWNSTREAM_AUTH_FAILED and outcome.sent is False
    assert "login" in outcome.message and "refused" in outcome.message
    assert "wrong horse" not in outcome.message and "wrong horse" not in repr(adapter._auth)
    assert form_app.failed_logins == 1 and form_app.notes == {} and form_app.refused == 0
    adapter.close()


def test_a_refused_login_is_not_tried_again_by_every_thread(form_app: FormLoginApp) -> None:
    """Systems lock an account after a few wrong passwords: the pool's threads share one refusal."""
    form_app.login_delay = 0.1
    adapter = form_adapter(form_app, {**FORM_ENV, "DESK_PASSWORD": "wrong horse"})
    outcomes = in_threads(8, lambda: call(adapter))
    assert {o.code for o in outcomes} == {ErrorCode.DOWNSTREAM_AUTH_FAILED}
    assert form_app.failed_logins == 1
    adapter.close()


def test_an_unreachable_login_page_is_unreachable_and_retryable(form_app: FormLoginApp) -> None:
    closed = FormLoginApp()  # bound, never served, then closed: nothing listens on its port
    closed.server_close()
    adapter = form_adapter(form_app, login_url=closed.url + "/login")
    outcome = call(adapter)
    assert outcome.code == ErrorCode.DOWNSTREAM_UNREACHABLE and outcome.sent is False
    assert "login page did not answer" in outcome.message
    adapter.close()


def test_the_session_is_never_in_repr(form_app: FormLoginApp) -> None:
    adapter = form_adapter(form_app)
    assert call(adapter).ok
    sid = form_app.cookies_seen[-1].split("=", 1)[1]
    assert sid not in repr(adapter._auth) and "open sesame" not in repr(adapter._auth)
    adapter.close()


def test_form_login_needs_its_variables() -> None:
    auth = {"type": "form_login", "login_url": "http://x/login", "username_env": "U", "password_env": "P"}
    spec = connector("desk", "http://x", auth).auth
    with pytest.raises(MissingSecret, match="P, which is not set"):
        build_auth(spec, "desk", {"U": "clerk"})


# -- mtls -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return TlsFiles(tmp_path_factory.mktemp("tls"))


@pytest.fixture
def mtls_server(tls: TlsFiles) -> Iterator[MtlsServer]:
    server = MtlsServer(tls)
    server.start()
    yield server
    server.stop()


MTLS_AUTH = {"type": "mtls", "cert_env": "ERP_CERT", "key_env": "ERP_KEY", "ca_env": "ERP_CA"}
WRITE = {"action": "post", "path": "POST /orders", "permission": "write"}


def mtls_env(tls: TlsFiles) -> dict[str, str]:
    return {"ERP_CERT": tls.cert_path, "ERP_KEY": tls.key_path, "ERP_CA": tls.ca_path}


def test_mtls_presents_the_client_certificate(tls: TlsFiles, mtls_server: MtlsServer) -> None:
    adapter = HttpAdapter(connector("erp", mtls_server.url, MTLS_AUTH, WRITE), environ=mtls_env(tls))
    outcome = call(adapter, "post")
    assert outcome.ok and outcome.data == {"client": "reach-client.example", "path": "/orders"}
    assert adapter.probe(5).healthy
    adapter.close()


def test_a_write_without_a_client_certificate_is_refused_not_unknown(
    tls: TlsFiles, mtls_server: MtlsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TLS 1.3 shows the refusal only when the answer is read, after the request was written:
    still not OUTCOME_UNKNOWN, since the system never got past the handshake."""
    monkeypatch.setenv("SSL_CERT_FILE", tls.ca_path)  # trust the server; present nothing
    adapter = HttpAdapter(connector("erp", mtls_server.url, {"type": "none"}, WRITE), environ={})
    outcome = call(adapter, "post")
    assert outcome.code == ErrorCode.DOWNSTREAM_AUTH_FAILED and outcome.sent is False
    assert "refused the TLS client certificate" in outcome.message
    wait_for(lambda: mtls_server.refused_handshakes, 5, "the server saw no refused handshake")
    assert mtls_server.answered == 0
    adapter.close()


def test_a_certificate_from_another_ca_is_refused(tls: TlsFiles, mtls_server: MtlsServer, tmp_path: Path) -> None:
    stranger = TlsFiles(tmp_path)
    env = {"ERP_CERT": stranger.cert_path, "ERP_KEY": stranger.key_path, "ERP_CA": tls.ca_path}
    adapter = HttpAdapter(connector("erp", mtls_server.url, MTLS_AUTH, WRITE), environ=env)
    outcome = call(adapter, "post")
    assert outcome.code == ErrorCode.DOWNSTREAM_AUTH_FAILED and outcome.sent is False
    assert mtls_server.answered == 0
    adapter.close()


def test_mtls_files_are_checked_when_the_pool_starts(tls: TlsFiles, tmp_path: Path) -> None:
    spec = connector("erp", "https://127.0.0.1:1", MTLS_AUTH)
    with pytest.raises(MissingSecret, match="ERP_KEY"):
        HttpAdapter(spec, environ={"ERP_CERT": tls.cert_path})
    with pytest.raises(MissingSecret, match="does not exist"):
        HttpAdapter(spec, environ={**mtls_env(tls), "ERP_KEY": str(tmp_path / "nope.key")})
    other = TlsFiles(tmp_path)  # a key that does not belong to the certificate
    with pytest.raises(MissingSecret, match="cannot be used"):
        HttpAdapter(spec, environ={**mtls_env(tls), "ERP_KEY": other.key_path})


# -- oauth2_refresh_token ------------------------------------------------------------------------

RT_ENV = {"CRM_ID": "reach", "CRM_SECRET": "s3cret", "CRM_REFRESH": "rt-0"}


@pytest.fixture
def oauth() -> Iterator[OAuthServer]:
    server = OAuthServer()
    server.start()
    yield server
    server.stop()


def rt_adapter(server: OAuthServer, env: dict[str, str] = RT_ENV, secret: bool = True) -> HttpAdapter:
    auth = {
        "type": "oauth2_refresh_token",
        "token_url": server.url + "/token",
        "client_id_env": "CRM_ID",
        "refresh_token_env": "CRM_REFRESH",
        **({"client_secret_env": "CRM_SECRET"} if secret else {}),
    }
    return HttpAdapter(connector("crm", server.url, auth), environ=env)


def test_the_first_refresh_token_buys_one_access_token_for_every_thread(oauth: OAuthServer) -> None:
    oauth.grant_delay = 0.2
    adapter = rt_adapter(oauth)
    assert [o.ok for o in in_threads(12, lambda: call(adapter))] == [True] * 12
    assert oauth.grants == 1 and oauth.most_grants_in_flight == 1
    assert oauth.forms[0]["refresh_token"] == ["rt-0"] and oauth.forms[0]["grant_type"] == ["refresh_token"]
    adapter.close()


def test_a_refused_access_token_is_refreshed_once_with_the_rotated_refresh_token(oauth: OAuthServer) -> None:
    adapter = rt_adapter(oauth)
    for round_ in range(1, 4):
        assert call(adapter).ok
        assert oauth.grants == round_
        oauth.revoke_access()
    assert [f["refresh_token"] for f in oauth.forms] == [["rt-0"], ["rt-1"], ["rt-2"]]
    assert oauth.reused == 0 and oauth.current_refresh_token == "rt-3"
    adapter.close()


def test_threads_refused_together_spend_one_refresh_token(oauth: OAuthServer) -> None:
    adapter = rt_adapter(oauth)
    assert call(adapter).ok
    oauth.revoke_access()
    oauth.grant_delay = 0.2
    assert [o.ok for o in in_threads(10, lambda: call(adapter))] == [True] * 10
    assert oauth.grants == 2 and oauth.reused == 0
    adapter.close()


def test_an_access_token_about_to_expire_is_refreshed_before_it_is_used(oauth: OAuthServer) -> None:
    oauth.expires_in = 20  # inside the 30 s margin: stale at once
    adapter = rt_adapter(oauth)
    assert call(adapter).ok and call(adapter).ok
    assert oauth.grants == 2 and oauth.api_refused == 0
    adapter.close()


def test_a_burned_refresh_token_fails_as_auth_failed_and_says_a_new_one_is_needed(oauth: OAuthServer) -> None:
    first = rt_adapter(oauth)  # spends rt-0 ...
    assert call(first).ok
    second = rt_adapter(oauth)  # ... a second one, started with the same variable, has only rt-0
    outcome = call(second)
    assert outcome.code == ErrorCode.DOWNSTREAM_AUTH_FAILED and outcome.sent is False
    assert "invalid_grant" in outcome.message and "new refresh token" in outcome.message
    assert "rt-0" not in outcome.message and oauth.reused == 1
    assert call(second).code == ErrorCode.DOWNSTREAM_AUTH_FAILED and oauth.reused == 1  # not presented again
    first.close()
    second.close()


def test_a_public_client_names_itself_in_the_form(oauth: OAuthServer) -> None:
    oauth.client_secret = None
    adapter = rt_adapter(oauth, {"CRM_ID": "reach", "CRM_REFRESH": "rt-0"}, secret=False)
    assert call(adapter).ok
    assert oauth.forms[0]["client_id"] == ["reach"]
    adapter.close()


def test_a_token_endpoint_that_fails_is_unreachable_not_auth_failed(oauth: OAuthServer) -> None:
    oauth.stop()
    outcome = call(rt_adapter(oauth))
    assert outcome.code == ErrorCode.DOWNSTREAM_UNREACHABLE and outcome.sent is False
    assert "token endpoint did not answer" in outcome.message


def test_a_token_store_that_does_not_answer_is_unreachable_and_nothing_is_sent(oauth: OAuthServer) -> None:
    import redis

    auth = rt_adapter(oauth).connector.auth
    spec = connector("crm", oauth.url, auth.model_dump(by_alias=True))
    closed = redis.Redis.from_url("redis://127.0.0.1:1", socket_connect_timeout=1)  # nothing listens there
    adapter = HttpAdapter(spec, environ=RT_ENV, redis=closed)
    outcome = call(adapter)
    assert outcome.code == ErrorCode.DOWNSTREAM_UNREACHABLE and outcome.sent is False
    assert "shared token store did not answer" in outcome.message
    assert oauth.grants == 0 and oauth.api_calls == oauth.api_refused == 0


def test_refresh_tokens_are_never_in_repr(oauth: OAuthServer) -> None:
    adapter = rt_adapter(oauth)
    assert call(adapter).ok
    auth = adapter._auth
    assert isinstance(auth, RefreshTokenAuth)
    text = repr(auth) + repr(auth._tokens)
    assert "rt-" not in text and "at-" not in text


def test_the_shared_store_key_is_the_documented_one() -> None:
    from workers.state import keys

    assert state_key("crm") == keys.PREFIX + "auth:{crm}"
    assert keys.tag_of(state_key("crm")) == keys.tag_of(keys.breaker("crm"))  # one slot per connector
    assert "reach:auth:{<connector>}" in (keys.__doc__ or "")


# -- jwt --------------------------------------------------------------------------------------------

ORDERS = {"action": "list_orders", "path": "GET /orders"}
ADMIN = {"action": "peek_admin", "path": "GET /admin"}


def jwt_adapter(api: JwtApi, key: str, algorithm: str = "HS256", ttl: str = "2m") -> HttpAdapter:
    auth = {
        "type": "jwt",
        "signing_key_env": "LEDGER_KEY",
        "algorithm": algorithm,
        "issuer": "agent-reach-test",
        "audience": "ledger-api",
        "ttl": ttl,
    }
    return HttpAdapter(connector("ledger", api.url, auth, ORDERS, ADMIN), environ={"LEDGER_KEY": key})


def jwt_api(key: Any, algorithm: str = "HS256") -> JwtApi:
    api = JwtApi(key, algorithm, "ledger-api", "agent-reach-test", {"/orders": "ledger:list_orders"})
    api.start()
    return api


def test_each_call_carries_a_token_naming_its_agent_action_and_intent() -> None:
    api = jwt_api(HS_KEY.encode())
    adapter = jwt_adapter(api, HS_KEY)
    try:
        assert call(adapter, "list_orders", intent_id="intent-a", agent_id="desk").ok
        assert call(adapter, "list_orders", intent_id="intent-b", agent_id="audit_bot").ok
        first, second = api.accepted
        assert (first["sub"], first["scope"], first["jti"]) == ("desk", "ledger:list_orders", "intent-a")
        assert (second["sub"], second["jti"]) == ("audit_bot", "intent-b")
        assert first["iss"] == "agent-reach-test" and first["aud"] == "ledger-api"
        assert 0 < first["exp"] - first["iat"] <= 120
    finally:
        adapter.close()
        api.stop()


def test_an_action_outside_the_tokens_scope_is_refused_by_the_system() -> None:
    api = jwt_api(HS_KEY.encode())
    adapter = jwt_adapter(api, HS_KEY)
    try:
        outcome = call(adapter, "peek_admin")
        assert outcome.code == ErrorCode.DOWNSTREAM_AUTH_FAILED and outcome.http_status == 403
        assert api.refused == [(403, "scope ledger:peek_admin may not use /admin")]
    finally:
        adapter.close()
        api.stop()


def test_rs256_tokens_verify_with_the_public_key() -> None:
    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    api = jwt_api(private.public_key(), "RS256")
    adapter = jwt_adapter(api, pem, "RS256")
    try:
        assert call(adapter, "list_orders").ok
        assert api.accepted[0]["sub"] == "desk"
        assert "PRIVATE" not in repr(adapter._auth)
    finally:
        adapter.close()
        api.stop()


def test_a_token_signed_with_another_key_is_refused() -> None:
    api = jwt_api(("x" * 40).encode())
    adapter = jwt_adapter(api, HS_KEY)
    try:
        outcome = call(adapter, "list_orders")
        assert outcome.code == ErrorCode.DOWNSTREAM_AUTH_FAILED and api.accepted == []
        assert api.refused == [(401, "invalid token: InvalidSignatureError")]
    finally:
        adapter.close()
        api.stop()


def test_a_call_without_an_agent_gets_no_token_and_sends_nothing() -> None:
    api = jwt_api(HS_KEY.encode())
    adapter = jwt_adapter(api, HS_KEY)
    try:
        outcome = call(adapter, "list_orders", agent_id=None)
        assert outcome.code == ErrorCode.DOWNSTREAM_AUTH_FAILED and outcome.sent is False
        assert api.accepted == [] and api.refused == []
    finally:
        adapter.close()
        api.stop()


def test_jwt_keys_are_checked_when_the_pool_starts() -> None:
    spec = connector(
        "ledger", "http://127.0.0.1:1", {"type": "jwt", "signing_key_env": "K", "audience": "a"}, ORDERS
    ).auth
    with pytest.raises(MissingSecret, match="K, which is not set"):
        build_auth(spec, "ledger", {})
    with pytest.raises(MissingSecret, match="at least 32"):
        build_auth(spec, "ledger", {"K": "short"})
    rs = spec.model_copy(update={"algorithm": "RS256"})
    with pytest.raises(MissingSecret, match="not an unencrypted PEM private key"):
        build_auth(rs, "ledger", {"K": "-----BEGIN NONSENSE-----"})
    ec_pem = (
        ec.generate_private_key(ec.SECP256R1())
        .private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
        .decode()
    )
    with pytest.raises(MissingSecret, match="not an RSA key"):
        build_auth(rs, "ledger", {"K": ec_pem})
