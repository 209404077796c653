"""The four newer auth kinds through a real fleet (router and pool processes, RabbitMQ, Redis)
against real systems that check credentials themselves (tests/integration/auth_servers.py):

- form_login: a pool logs in once, and again after the system ends its session;
- mtls: the pool's client certificate opens the system; a connector without one gets a clear
  DOWNSTREAM_AUTH_FAILED receipt, not retried and not OUTCOME_UNKNOWN;
- oauth2_refresh_token: two pool processes of one connector share one chain of rotating refresh
  tokens through Redis; however they race, no refresh token is presented twice;
- jwt: the system sees exactly the calling agent, action and intent in the token, and refuses an
  action its scope does not allow.
"""

from __future__ import annotations

import multiprocessing
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

from connectors.adapters.auth import state_key
from producers.client import ReachClient
from producers.wire import Receipt
from tests.fleet import BROKER_URL, REDIS_URL, Fleet
from tests.integration.auth_servers import (
    FormLoginApp,
    JwtApi,
    MtlsServer,
    OAuthServer,
    TlsFiles,
    shared_refresh_worker,
)
from workers.state import keys
from workers.transport.topology import connector_queue

RUN = uuid.uuid4().hex[:6]
AGENT = f"auth_{RUN}"
FIRST_REFRESH = f"rt-first-{RUN}"  # a new first token each run: an earlier run's chain in Redis is ignored
JWT_KEY = f"jwt-secret-{RUN}-" + "k" * 32
CONNECTORS = ("auth_form", "auth_mtls", "auth_nocert", "auth_rt", "auth_jwt")


@dataclass
class Systems:
    form: FormLoginApp
    tls: TlsFiles
    mtls: MtlsServer
    oauth: OAuthServer
    jwt: JwtApi


@pytest.fixture(scope="module")
def systems(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Systems]:
    tls = TlsFiles(tmp_path_factory.mktemp("tls"))
    running = Systems(
        FormLoginApp(),
        tls,
        MtlsServer(tls),
        OAuthServer(first=FIRST_REFRESH),
        JwtApi(JWT_KEY.encode(), "HS256", "ledger-api", "agent-reach-test", {"/orders": "auth_jwt:list_orders"}),
    )
    for server in (running.form, running.mtls, running.oauth, running.jwt):
        server.start()
    yield running
    for server in (running.form, running.mtls, running.oauth, running.jwt):
        server.stop()


def catalog(s: Systems) -> str:
    return f"""
connector:
  name: auth_form
  endpoint: {s.form.url}
  auth: {{ type: form_login, login_url: "{s.form.url}/login", username_env: AUTH_FORM_USER, password_env: AUTH_FORM_PASSWORD }}
  actions:
    - action: whoami
      path: GET /api/me
    - action: add_note
      path: POST /api/notes
      permission: write
      input:
        text: {{ type: string, required: true }}
---
connector:
  name: auth_mtls
  endpoint: {s.mtls.url}
  auth: {{ type: mtls, cert_env: AUTH_MTLS_CERT, key_env: AUTH_MTLS_KEY, ca_env: AUTH_MTLS_CA }}
  actions:
    - action: post_order
      path: POST /orders
      permission: write
---
connector:
  name: auth_nocert
  endpoint: {s.mtls.url}
  actions:
    - action: post_order
      path: POST /orders
      permission: write
---
connector:
  name: auth_rt
  endpoint: {s.oauth.url}
  pool: {{ concurrency: 3 }}
  auth:
    type: oauth2_refresh_token
    token_url: "{s.oauth.url}/token"
    client_id_env: AUTH_RT_ID
    client_secret_env: AUTH_RT_SECRET
    refresh_token_env: AUTH_RT_REFRESH
  actions:
    - action: list_orders
      path: GET /api/orders
---
connector:
  name: auth_jwt
  endpoint: {s.jwt.url}
  auth: {{ type: jwt, signing_key_env: AUTH_JWT_KEY, issuer: agent-reach-test, audience: ledger-api, ttl: 1m }}
  actions:
    - action: list_orders
      path: GET /orders
    - action: peek_admin
      path: GET /admin
---
agent_app:
  name: {AGENT}
  connector_bindings:
""" + "".join(f'    - connector: {name}\n      allowed_actions: ["*"]\n' for name in CONNECTORS)


@pytest.fixture(scope="module")
def fleet(systems: Systems) -> Iterator[Fleet]:
    client = redis.Redis.from_url(REDIS_URL)
    for name in CONNECTORS:  # an earlier run's marks and tokens in this Redis database
        client.delete(keys.breaker(name), keys.health(name), state_key(name))
    env = {
        "AUTH_FORM_USER": systems.form.username,
        "AUTH_FORM_PASSWORD": systems.form.password,
        "AUTH_MTLS_CERT": systems.tls.cert_path,
        "AUTH_MTLS_KEY": systems.tls.key_path,
        "AUTH_MTLS_CA": systems.tls.ca_path,
        "SSL_CERT_FILE": systems.tls.ca_path,  # auth_nocert trusts the server, and presents nothing
        "AUTH_RT_ID": systems.oauth.client_id,
        "AUTH_RT_SECRET": systems.oauth.client_secret or "",
        "AUTH_RT_REFRESH": FIRST_REFRESH,
        "AUTH_JWT_KEY": JWT_KEY,
    }
    with Fleet(catalog(systems), list(CONNECTORS), env=env) as running:
        running.start_process("auth_rt_2", ["worker", "auth_rt"])  # a second process of the same pool
        running.wait_consuming(connector_queue("auth_rt").name, timeout=30, consumers=2)
        yield running


@pytest.fixture
def reach(fleet: Fleet) -> Iterator[ReachClient]:
    with ReachClient(AGENT, BROKER_URL, reply_to=f"{AGENT}.{uuid.uuid4().hex[:8]}", drop_duplicates=False) as client:
        yield client


def error_code(receipt: Receipt) -> str | None:
    return receipt.error.code.value if receipt.error else None


def test_form_login_keeps_a_session_and_logs_in_again_when_it_expires(systems: Systems, reach: ReachClient) -> None:
    first = reach.call("auth_form.whoami", {}, timeout=30)
    assert first.success and first.data == {"user": "clerk"}
    assert systems.form.logins == 1
    systems.form.expire_sessions()
    note = reach.call("auth_form.add_note", {"text": f"note-{RUN}"}, timeout=30)
    assert note.success and note.execution.attempts == 1
    assert systems.form.logins == 2
    assert systems.form.notes[f"note-{RUN}"] == 1  # the refused request did nothing; the resend once


def test_mtls_opens_the_system_and_a_connector_without_a_certificate_gets_a_clear_refusal(
    systems: Systems, reach: ReachClient
) -> None:
    ok = reach.call("auth_mtls.post_order", {}, timeout=30)
    assert ok.success and ok.data == {"client": "reach-client.example", "path": "/orders"}
    answered = systems.mtls.answered
    refused = reach.call("auth_nocert.post_order", {}, timeout=30)
    assert error_code(refused) == "DOWNSTREAM_AUTH_FAILED" and refused.status == "failed"
    assert refused.error is not None and "refused the TLS client certificate" in refused.error.message
    assert refused.execution.attempts == 1  # a refused certificate is not retried
    assert systems.mtls.answered == answered


def test_two_pool_processes_share_one_chain_of_rotating_refresh_tokens(systems: Systems, reach: ReachClient) -> None:
    oauth = systems.oauth
    oauth.grant_delay = 0.3  # both processes arrive while a refresh is under way
    for round_ in range(1, 4):
        ids = [reach.publish("auth_rt.list_orders", {}) for _ in range(12)]  # 3 threads x 2 processes busy
        receipts = [reach.wait(i, timeout=30) for i in ids]
        assert [error_code(r) for r in receipts] == [None] * 12
        assert oauth.grants == round_
        oauth.revoke_access()  # every access token refused from now on: both processes must refresh
    assert oauth.reused == 0 and oauth.refused_grants == 0 and oauth.most_grants_in_flight == 1
    assert oauth.api_refused >= 2  # both processes met the revoked token
    stored = redis.Redis.from_url(REDIS_URL).hgetall(state_key("auth_rt"))
    assert stored[b"refresh"].decode() == oauth.current_refresh_token == "rt-3"


def test_a_jwt_names_exactly_the_calling_agent_action_and_intent(systems: Systems, reach: ReachClient) -> None:
    receipt = reach.call("auth_jwt.list_orders", {}, timeout=30)
    assert receipt.success
    claims = systems.jwt.accepted[-1]
    assert (claims["sub"], claims["scope"], claims["jti"]) == (AGENT, "auth_jwt:list_orders", receipt.intent_id)
    assert receipt.data == {"sub": AGENT, "scope": "auth_jwt:list_orders", "jti": receipt.intent_id}
    refused = reach.call("auth_jwt.peek_admin", {}, timeout=30)
    assert error_code(refused) == "DOWNSTREAM_AUTH_FAILED" and refused.execution.attempts == 1
    assert systems.jwt.refused[-1] == (403, "scope auth_jwt:peek_admin may not use /admin")


def test_two_processes_starting_at_once_spend_the_first_refresh_token_once(tmp_path: Path) -> None:
    """Without the fleet, to start both at exactly the same moment: two processes, each an HTTP
    adapter with four threads, share the store in Redis; the token endpoint takes half a second."""
    oauth = OAuthServer(first=f"rt-procs-{RUN}")
    oauth.grant_delay = 0.5
    oauth.start()
    name = f"auth_procs_{RUN}"
    redis.Redis.from_url(REDIS_URL).delete(state_key(name))
    spec: dict[str, Any] = {
        "name": name,
        "endpoint": oauth.url,
        "auth": {
            "type": "oauth2_refresh_token",
            "token_url": oauth.url + "/token",
            "client_id_env": "ID",
            "client_secret_env": "SECRET",
            "refresh_token_env": "REFRESH",
        },
        "actions": [{"action": "list_orders", "path": "GET /api/orders"}],
    }
    env = {"ID": oauth.client_id, "SECRET": oauth.client_secret or "", "REFRESH": f"rt-procs-{RUN}"}
    spawn = multiprocessing.get_context("spawn")
    pipes, procs = [], []
    try:
        for _ in range(2):
            mine, theirs = spawn.Pipe()
            proc = spawn.Process(target=shared_refresh_worker, args=(spec, env, REDIS_URL, 4, 2, theirs))
            proc.start()
            pipes.append(mine)
            procs.append(proc)
        for pipe in pipes:
            assert pipe.poll(30) and pipe.recv() == "ready"
        for round_ in (1, 2):
            started = time.monotonic()
            for pipe in pipes:
                pipe.send("go")
            results = [pipe.recv() if pipe.poll(30) else ["no answer"] for pipe in pipes]
            assert results == [["ok"] * 4, ["ok"] * 4]
            assert oauth.grants == round_ and time.monotonic() - started >= oauth.grant_delay
            oauth.revoke_access()
        assert oauth.reused == 0 and oauth.refused_grants == 0 and oauth.most_grants_in_flight == 1
    finally:
        for proc in procs:
            proc.join(10)
            if proc.is_alive():
                proc.kill()
                proc.join(5)
        oauth.stop()
        redis.Redis.from_url(REDIS_URL).delete(state_key(name))


def test_a_restarted_pool_continues_the_stored_chain_and_a_new_first_token_replaces_it() -> None:
    from connectors.adapters.base import CallContext
    from connectors.adapters.http import HttpAdapter
    from connectors.spec import ConnectorSpec

    oauth = OAuthServer(first=f"rt-restart-{RUN}")
    oauth.start()
    name = f"auth_restart_{RUN}"
    client = redis.Redis.from_url(REDIS_URL)
    spec = ConnectorSpec.model_validate(
        {
            "name": name,
            "endpoint": oauth.url,
            "auth": {
                "type": "oauth2_refresh_token",
                "token_url": oauth.url + "/token",
                "client_id_env": "ID",
                "client_secret_env": "SECRET",
                "refresh_token_env": "REFRESH",
            },
            "actions": [{"action": "list_orders", "path": "GET /api/orders"}],
        }
    )

    def started_with(first: str) -> HttpAdapter:  # a pool process starting
        env = {"ID": oauth.client_id, "SECRET": oauth.client_secret or "", "REFRESH": first}
        return HttpAdapter(spec, environ=env, redis=client)

    def ok(adapter: HttpAdapter) -> bool:
        return adapter.call(spec.actions[0], {}, CallContext(intent_id="i", agent_id="desk")).ok

    try:
        assert ok(started_with(f"rt-restart-{RUN}"))  # spends the first token: rt-1 is stored
        oauth.revoke_access()
        assert ok(started_with(f"rt-restart-{RUN}"))  # a restart with the same variable: goes on with rt-1
        assert oauth.grants == 2 and oauth.reused == 0
        with oauth.lock:  # the chain was lost; the operator gets a new first token and restarts the pool
            oauth.refresh_tokens = {f"rt-new-{RUN}"}
        oauth.revoke_access()
        assert ok(started_with(f"rt-new-{RUN}"))
        assert oauth.forms[-1]["refresh_token"] == [f"rt-new-{RUN}"] and oauth.reused == 0
    finally:
        oauth.stop()
        client.delete(state_key(name))
