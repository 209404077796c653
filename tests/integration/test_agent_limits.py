"""What an agent can leave on the broker is bounded: its queues expire, the vhost caps their number,
its connections are limited.

Runs against the real broker in a vhost of its own (created and deleted here), with agent users made
by ``reach agent-user create`` and the bounds applied by ``reach setup``. The attacks use pika.
"""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

import pika
import pika.exceptions
import pytest
from click.testing import CliRunner, Result
from kombu import Connection

from producers.client import ReachClient
from tests.fleet import SHARED_BROKER_URL
from workers.cli import main as reach_cli
from workers.ops.broker_policy import AGENT_QUEUE_POLICY
from workers.transport.topology import declare_all

RUN = uuid.uuid4().hex[:8]
VHOST = f"reach-limits-{RUN}"
CONNECTOR = "limits_tickets"
# lower-case, digits and underscores: valid under the v1 and the v2 agent name rules
HOARDER, CROWD, DEFAULTS = (f"lim_{RUN}_{name}" for name in ("hoarder", "crowd", "defaults"))
CATALOG = f"""
connector:
  name: {CONNECTOR}
  endpoint: http://127.0.0.1:9
  actions:
    - action: create_ticket
      path: POST /tickets
      permission: write
"""


def url_for(user: str, password: str, vhost: str = VHOST) -> str:
    parts = urlsplit(SHARED_BROKER_URL)
    netloc = f"{quote(user, safe='')}:{quote(password, safe='')}@{parts.hostname}:{parts.port or 5672}"
    return urlunsplit((parts.scheme, netloc, "/" + quote(vhost, safe=""), "", ""))


def ctl(*args: str) -> str:
    return subprocess.run(["rabbitmqctl", *args], check=True, capture_output=True, text=True, timeout=60).stdout


def listed(what: str, *columns: str, vhost: str = VHOST) -> list[dict[str, object]]:
    return list(json.loads(ctl(what, f"--vhost={vhost}", "--silent", "--formatter", "json", *columns) or "[]"))


def queue_names() -> set[str]:
    return {str(q["name"]) for q in listed("list_queues", "name")}


@pytest.fixture(scope="module")
def catalog_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("limits-catalog")
    (directory / "catalog.yaml").write_text(CATALOG)
    return directory


@pytest.fixture(scope="module")
def vhost() -> Iterator[str]:
    ctl("add_vhost", VHOST)
    try:
        ctl("set_permissions", f"--vhost={VHOST}", "guest", ".*", ".*", ".*")
        with Connection(url_for("guest", "guest")) as conn:
            declare_all(conn, [CONNECTOR])
        yield VHOST
    finally:
        for user in (HOARDER, CROWD, DEFAULTS):
            subprocess.run(["rabbitmqctl", "delete_user", "--", user], capture_output=True, timeout=60)
        ctl("delete_vhost", VHOST)


Reach = Callable[..., Result]


@pytest.fixture
def reach(vhost: str, catalog_dir: Path) -> Reach:
    """``reach ARGS`` against the test vhost; keyword arguments are extra environment variables."""

    def invoke(*args: str, **env: str) -> Result:
        environment = {"REACH_BROKER_URL": url_for("guest", "guest"), "REACH_CATALOG": str(catalog_dir), **env}
        return CliRunner().invoke(reach_cli, list(args), env=environment)

    return invoke


def create_agent(reach: Reach, name: str, *options: str, vhost: str = VHOST) -> str:
    password = f"pw-{uuid.uuid4().hex}"
    created = reach(
        "agent-user", "create", name, "--vhost", vhost, "--password-env", "LIMITS_PW", *options, LIMITS_PW=password
    )
    assert created.exit_code == 0, created.output
    return password


def operator_policy(vhost: str = VHOST) -> dict[str, object]:
    (entry,) = [p for p in listed("list_operator_policies", vhost=vhost) if p["name"] == AGENT_QUEUE_POLICY]
    definition = entry["definition"]
    return {**entry, "definition": json.loads(definition) if isinstance(definition, str) else definition}


# -- tests ----------------------------------------------------------------------------------------------


def test_agent_user_gets_connection_limits_and_the_vhost_the_default_bounds(reach: Reach) -> None:
    fresh = f"{VHOST}-defaults"  # no setup has run here
    ctl("add_vhost", fresh)
    try:
        create_agent(reach, DEFAULTS, vhost=fresh)
        limits = ctl("list_user_limits", "--user", DEFAULTS, "--silent")
        assert json.loads(limits) == {"max-connections": 8, "max-channels": 16}
        policy = operator_policy(fresh)
        assert policy["pattern"] == r"^amq\.gen-" and policy["apply-to"] == "queues"
        assert policy["definition"] == {"expires": 60000, "max-length": 10000}
        assert json.loads(ctl("list_vhost_limits", f"--vhost={fresh}", "--silent")) == {"max-queues": 10000}
    finally:
        ctl("delete_vhost", fresh)


def test_agents_durable_queues_are_refused_at_the_queue_limit_and_expire_with_their_bindings(reach: Reach) -> None:
    limit = len(queue_names()) + 4
    set_up = reach("setup", "--agent-queue-expires-ms", "2000", "--max-queues", str(limit))
    assert set_up.exit_code == 0, set_up.output
    password = create_agent(reach, HOARDER)
    # creating an agent keeps the bounds setup chose
    assert operator_policy()["definition"] == {"expires": 2000, "max-length": 10000}
    assert json.loads(ctl("list_vhost_limits", f"--vhost={VHOST}", "--silent")) == {"max-queues": limit}

    hoarded: list[str] = []
    connection = pika.BlockingConnection(pika.URLParameters(url_for(HOARDER, password)))
    try:
        channel = connection.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            for _ in range(50):
                queue = channel.queue_declare("", durable=True, exclusive=False, auto_delete=False).method.queue
                hoarded.append(queue)
                channel.queue_bind(queue, "reach.receipts", HOARDER)
    finally:
        connection.close()
    assert refused.value.reply_code == 406 and "queue limit" in refused.value.reply_text, refused.value
    assert len(hoarded) == 4
    deadline = time.time() + 30
    while set(hoarded) & queue_names() and time.time() < deadline:
        time.sleep(0.25)
    assert set(hoarded) & queue_names() == set(), "the agent's durable queues outlived it"
    assert [b for b in listed("list_bindings", "destination_name") if b["destination_name"] in hoarded] == []


def test_agent_connections_beyond_its_limit_are_refused(reach: Reach) -> None:
    password = create_agent(reach, CROWD, "--max-connections", "2")
    params = pika.URLParameters(url_for(CROWD, password))
    open_ = [pika.BlockingConnection(params) for _ in range(2)]
    try:
        with pytest.raises(pika.exceptions.AMQPConnectionError) as refused:
            pika.BlockingConnection(params).close()
        assert "connection limit" in repr(refused.value), refused.value
    finally:
        for connection in open_:
            connection.close()
    # the limit counts connections held at once
    with ReachClient(CROWD, url_for(CROWD, password), authenticated=True) as client:
        assert client.user_id == CROWD


def test_setup_without_rabbitmqctl_says_what_to_run_instead(reach: Reach) -> None:
    result = reach("setup", "--rabbitmqctl", "/nonexistent/rabbitmqctl")
    assert result.exit_code == 1, result.output
    assert "declared:" in result.stdout
    assert "NOT applied" in result.stderr
    assert f"rabbitmqctl set_operator_policy --vhost={VHOST} --apply-to queues" in result.stderr
    assert f"/api/operator-policies/{VHOST}/{AGENT_QUEUE_POLICY}" in result.stderr
    assert f"/api/vhost-limits/{VHOST}/max-queues" in result.stderr


def test_printed_commands_carry_the_limits_and_the_policy(reach: Reach) -> None:
    printed = reach(
        "agent-user",
        "create",
        "lim_print",
        "--print",
        "--vhost",
        VHOST,
        "--max-connections",
        "3",
        "--max-channels",
        "5",
    )
    assert printed.exit_code == 0, printed.output
    assert """rabbitmqctl set_user_limits -- lim_print '{"max-connections": 3, "max-channels": 5}'""" in printed.stdout
    assert "set_operator_policy" in printed.stdout and AGENT_QUEUE_POLICY in printed.stdout
    setup = reach("setup", "--print", "--agent-queue-expires-ms", "5000")
    assert setup.exit_code == 0, setup.output
    assert """'{"expires": 5000, "max-length": 10000}'""" in setup.stdout
