"""``reach status`` and ``reach setup`` from an operator's shell, where there may be no catalog and
the broker or Redis may not answer (nothing listens on the ports used here)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from click.testing import CliRunner

from workers.cli import main
from workers.ops.fleet import redact_url
from workers.state import keys


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("make", [keys.workers, keys.health, keys.breaker, keys.paused, keys.last_error])
def test_every_connector_key_names_its_connector(make: object) -> None:
    assert callable(make)
    assert keys.connector_of(make("tickets_eu")) == "tickets_eu"
    assert keys.connector_of(make("tickets_eu").encode()) == "tickets_eu"


def test_keys_of_agents_and_processes_name_no_connector() -> None:
    for key in (keys.receipt("desk", "i-1"), keys.alive("w-1"), keys.rate_limit("desk", "tickets"), keys.PAUSED_PREFIX):
        assert keys.connector_of(key) is None


def test_status_without_a_catalog_says_redis_did_not_answer(tmp_path: Path) -> None:
    port = closed_port()
    env = {
        "REACH_CATALOG": str(tmp_path / "none"),
        "REACH_REDIS_URL": f"redis://:s3cret@127.0.0.1:{port}/0",
        "REACH_BROKER_URL": f"amqp://guest:guest@127.0.0.1:{port}//",
    }
    result = CliRunner().invoke(main, ["status"], env=env)
    assert result.exit_code == 2, result.output
    assert "cannot read the fleet's state: Redis did not answer" in result.stderr
    assert "no catalog at" in result.stderr and "s3cret" not in result.stderr
    assert result.stdout == ""


def test_setup_without_a_catalog_says_the_broker_did_not_answer(tmp_path: Path) -> None:
    url = f"amqp://guest:s3cret@127.0.0.1:{closed_port()}//"
    result = CliRunner().invoke(
        main, ["setup", "--skip-broker-policy"], env={"REACH_CATALOG": str(tmp_path / "none"), "REACH_BROKER_URL": url}
    )
    assert result.exit_code == 2, result.output
    assert "declaring the base topology" in result.stderr
    assert f"cannot declare the topology on RabbitMQ at {redact_url(url)}" in result.stderr
    assert "s3cret" not in result.stderr


def test_redact_url_hides_only_the_password() -> None:
    assert redact_url("amqp://reach:pw@host:5672/v") == "amqp://reach:***@host:5672/v"
    assert redact_url("redis://host:6379/0") == "redis://host:6379/0"
