"""Connector plugins against real RabbitMQ (issue 34): the built-in amqp and agent types pass the
conformance kit with their fake systems on this run's vhost, and a fleet whose pool group holds a
connector of a refused plugin keeps serving its other connector while answering that one
CONNECTOR_UNAVAILABLE with the refusal's reason."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from producers.client import ReachClient
from producers.wire import ErrorCode
from tests.fleet import BROKER_URL, REPO, Fleet
from tests.integration.counting_system import CountingSystem
from tests.integration.postgres import PostgresServer
from tests.plugin_packages import install_zoo
from workers.cli import main

RUN = uuid.uuid4().hex[:6]
AGENT = f"plg_{RUN}"
GOOD, BROKEN = "plg_good", "plg_broken"


@pytest.mark.parametrize("kind", ["amqp", "agent"])
def test_the_kit_passes_a_builtin_adapter_behind_a_broker(kind: str) -> None:
    result = CliRunner().invoke(main, ["plugins", "check", kind], env={"REACH_BROKER_URL": BROKER_URL})
    assert result.exit_code == 0, result.output
    assert result.output.count(" PASS ") == 12
    assert f"ok: type {kind} keeps every guarantee it claims" in result.output


@pytest.fixture(scope="module")
def system() -> Iterator[CountingSystem]:
    running = CountingSystem().start()
    yield running
    running.stop()


@pytest.fixture(scope="module")
def fleet(system: CountingSystem, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Fleet, str]]:
    zoo = tmp_path_factory.mktemp("zoo")
    tag = f"f{RUN}"
    install_zoo(zoo, tag)
    catalog = f"""
connector:
  name: {GOOD}
  endpoint: {system.url}
  actions:
    - action: create_item
      description: Create an item
      path: POST /items
      input:
        title: {{ type: string, required: true }}
      permission: write
---
connector:
  name: {BROKEN}
  type: old{tag}
  actions:
    - action: ping
      description: Ping a system whose plugin implements another contract version
---
agent_app:
  name: {AGENT}
  connector_bindings:
    - connector: {GOOD}
      allowed_actions: ["*"]
    - connector: {BROKEN}
      allowed_actions: ["*"]
"""
    # the fleet's processes see the broken plugins as installed packages
    with Fleet(catalog, [], groups={"mixed": [GOOD, BROKEN]}, env={"PYTHONPATH": str(zoo)}) as running:
        yield running, tag


def test_a_refused_plugin_leaves_the_pool_serving_its_other_connector(
    fleet: tuple[Fleet, str], system: CountingSystem
) -> None:
    running, tag = fleet
    with ReachClient(AGENT, BROKER_URL, reply_to=f"{AGENT}.{uuid.uuid4().hex[:8]}") as reach:
        broken = reach.call(f"{BROKEN}.ping", {}, timeout=60)
        good = reach.call(f"{GOOD}.create_item", {"title": "still served"}, timeout=60)
    assert broken.status == ErrorCode.CONNECTOR_UNAVAILABLE.status and broken.error is not None
    assert broken.error.code == ErrorCode.CONNECTOR_UNAVAILABLE
    assert f"plugin old{tag} from package reach-old-{tag} 0.1 refused" in broken.error.message
    assert good.status == "succeeded", good
    assert system.executions()["still served"] == 1
    log = running.log("mixed")
    assert f"plugin old{tag} from package reach-old-{tag} 0.1 refused: implements contract version 99" in log
    running.check_alive()


def test_validate_and_list_name_the_refused_package(fleet: tuple[Fleet, str]) -> None:
    running, tag = fleet
    env = {**running.env}
    listed = subprocess.run(
        [sys.executable, "-m", "workers.cli", "plugins", "list"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert listed.returncode == 1
    assert f"refused: plugin old{tag} from package reach-old-{tag} 0.1 refused" in listed.stdout
    checked = subprocess.run(
        [sys.executable, "-m", "workers.cli", "validate", str(Path(running.dir))],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert checked.returncode == 1
    assert f"catalog.yaml:15: connector {BROKEN}: type 'old{tag}': plugin old{tag} from package" in checked.stdout


def test_the_kit_passes_the_builtin_sql_adapter_on_a_real_postgresql() -> None:
    with PostgresServer(database="kit") as pg:
        env = {"REACH_BROKER_URL": BROKER_URL, "KIT_DATABASE_URL": pg.dsn}
        result = CliRunner().invoke(main, ["plugins", "check", "sql", "--database-env", "KIT_DATABASE_URL"], env=env)
        left = pg.run_sql("SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'reach_kit_%'")
    assert result.exit_code == 0, result.output
    assert result.output.count(" PASS ") == 11 and result.output.count(" SKIP ") == 1  # sql claims no key
    assert left == [(0,)]  # the kit's schema is dropped
