"""The Dockerfile and docker-compose.yml: Docker cannot run here, so check what can be checked —
they parse, name only files and `reach` commands that exist, and agree with the chart."""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from packaging.specifiers import SpecifierSet

from connectors.catalog import load_catalog
from tests.chart.chart import REPO, container, env_of, pod_spec, render
from workers.cli import main as reach_cli

COMPOSE = yaml.safe_load((REPO / "docker-compose.yml").read_text())
SERVICES: dict[str, Any] = COMPOSE["services"]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def _dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", (REPO / "Dockerfile").read_text())
    pairs = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            instruction, _, args = line.partition(" ")
            pairs.append((instruction.upper(), args.strip()))
    return pairs


def _final_stage() -> list[tuple[str, str]]:
    instructions = _dockerfile()
    last_from = max(i for i, (name, _) in enumerate(instructions) if name == "FROM")
    return instructions[last_from:]


def _ignored(path: str) -> bool:
    patterns = [
        p.strip() for p in (REPO / ".dockerignore").read_text().splitlines() if p.strip() and not p.startswith("#")
    ]
    parts = Path(path).parts
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    return any(
        fnmatch.fnmatch(prefix, pattern.removeprefix("**/")) or fnmatch.fnmatch(prefix, pattern)
        for pattern in patterns
        for prefix in prefixes
    )


def test_dockerfile_copies_only_files_that_exist_and_are_not_dockerignored() -> None:
    copies = [shlex.split(args) for name, args in _dockerfile() if name == "COPY"]
    local = [
        [a for a in args if not a.startswith("--")] for args in copies if not any(a.startswith("--from") for a in args)
    ]
    assert local
    for args in local:
        for source in args[:-1]:
            assert (REPO / source).exists(), f"COPY {source}: no such file in the repository"
            assert not _ignored(source), f"COPY {source}: excluded by .dockerignore"
    # the packages the project installs are all in the build context
    for package in PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]:
        assert any(source.rstrip("/") == package.rstrip("*") for args in local for source in args[:-1]), package


def test_the_image_runs_reach_in_exec_form_as_a_non_root_user() -> None:
    final = _final_stage()
    entrypoint = [json.loads(args) for name, args in final if name == "ENTRYPOINT"]
    assert entrypoint == [["reach"]], "exec form, so reach is PID 1 and SIGTERM reaches Celery"
    assert PYPROJECT["project"]["scripts"]["reach"] == "workers.cli:main"
    user = [args for name, args in final if name == "USER"][-1]
    assert user.split(":")[0] not in ("0", "root")
    # the chart's podSecurityContext runs as the same uid
    assert int(user.split(":")[0]) == pod_spec(render().component("router"))["securityContext"]["runAsUser"]


def test_the_image_is_a_slim_python_the_project_supports() -> None:
    bases = [args.split()[0] for name, args in _dockerfile() if name == "FROM"]
    requires = SpecifierSet(PYPROJECT["project"]["requires-python"])
    for base in bases:
        match = re.fullmatch(r"python:(\d+\.\d+)(?:\.\d+)?-slim(?:-\w+)?", base)
        assert match, f"{base}: use a slim Python base"
        assert match.group(1) + ".0" in requires


def test_compose_parses_and_runs_the_whole_local_fleet() -> None:
    assert set(SERVICES) == {
        "rabbitmq",
        "redis",
        "router",
        "ticket-system",
        "pool-local-ticket-system",
        "beat",
        "prometheus",
        "mcp",  # optional: profile mcp
    }
    for name, service in SERVICES.items():
        assert "image" in service or "build" in service, name


def _reach_services() -> dict[str, list[str]]:
    """Services that run the reach entry point, with their arguments."""
    return {name: s["command"] for name, s in SERVICES.items() if s.get("build") == "." and "entrypoint" not in s}


def test_compose_runs_only_reach_commands_that_exist() -> None:
    commands = _reach_services()
    assert {args[0] for args in commands.values()} == {"router", "worker", "beat", "mcp"}
    for name, args in commands.items():
        assert args[0] in reach_cli.commands, f"{name}: `reach {args[0]}` does not exist"
    catalog = load_catalog(REPO / "examples" / "catalog", environ={})
    worker = commands["pool-local-ticket-system"]
    assert worker[:2] == ["worker", "local_ticket_system"] and worker[1] in catalog.connectors
    assert worker[2] == "-c" and 1 <= int(worker[3]) <= 1000


def test_the_chart_runs_the_same_reach_commands() -> None:
    for deployment in render().of_kind("Deployment"):
        c = container(deployment)
        assert c["command"] == ["reach"] and c["args"][0] in reach_cli.commands


def test_compose_redis_keeps_an_append_only_file_on_a_volume() -> None:
    # intents parked for approval live only in Redis (docs/operations.md, "Persistence: parked approvals")
    redis = SERVICES["redis"]
    command = redis["command"]
    assert command[0] == "redis-server" and command[command.index("--appendonly") + 1] == "yes"
    volume, data_dir = redis["volumes"][0].split(":")
    assert data_dir == "/data" and volume in COMPOSE["volumes"]  # the image's data dir, kept across recreation


def test_compose_refers_only_to_files_that_exist() -> None:
    for name, service in SERVICES.items():
        for volume in service.get("volumes", []):
            host = volume.split(":")[0]
            if host.startswith("."):
                assert (REPO / host).exists(), f"{name}: {host}"
        if service.get("build"):
            assert (REPO / service["build"] / "Dockerfile").is_file()
    # the ticket system runs from the image's WORKDIR, where the Dockerfile copies examples/
    entrypoint = SERVICES["ticket-system"]["entrypoint"]
    assert entrypoint[:2] == ["python", "examples/ticket_system.py"]
    assert (REPO / entrypoint[1]).is_file()
    final = _final_stage()
    assert ("WORKDIR", "/opt/reach") in final and ("COPY", "examples ./examples") in final


def test_the_pool_reaches_the_ticket_system_where_it_listens() -> None:
    pool = SERVICES["pool-local-ticket-system"]
    port = SERVICES["ticket-system"]["entrypoint"][2]
    # the demo system binds 127.0.0.1, so the pool shares its network namespace
    assert pool["network_mode"] == "service:ticket-system"
    assert pool["environment"]["TICKETS_URL"] == f"http://127.0.0.1:{port}"
    assert "${TICKETS_URL" in (REPO / "examples" / "catalog" / "tickets.yaml").read_text()


def test_compose_and_the_chart_configure_processes_alike() -> None:
    router = render().component("router")
    chart_env = env_of(router)
    dockerfile_env = dict(re.findall(r"(REACH_\w+)=(\S+)", " ".join(a for n, a in _dockerfile() if n == "ENV")))
    for name in ("router", "beat", "pool-local-ticket-system"):
        env = SERVICES[name]["environment"]
        unknown = {k for k in env if k.startswith("REACH_")} - set(chart_env)
        assert unknown == set(), f"{name} sets {unknown}, which the chart never sets"
        assert (
            env["REACH_METRICS_PORT"]
            == chart_env["REACH_METRICS_PORT"]["value"]
            == dockerfile_env["REACH_METRICS_PORT"]
        )
        assert env["REACH_CATALOG"] == dockerfile_env["REACH_CATALOG"]
        assert "/etc/reach/catalog" in [v.split(":")[1] for v in SERVICES[name]["volumes"]]


def test_the_optional_mcp_facade_runs_as_the_charts_mcp_deployment() -> None:
    from tests.chart.chart import scenario_values

    facade = SERVICES["mcp"]
    assert facade["profiles"] == ["mcp"]  # not started by a plain `docker compose up`
    chart = container(render(scenario_values("mcp")).component("mcp"))
    assert facade["command"] == chart["args"] == ["mcp", "--http"]
    env, chart_env = facade["environment"], {e["name"]: e for e in chart["env"]}
    unknown = {k for k in env if k.startswith("REACH_MCP")} - set(chart_env)
    assert unknown == set(), f"mcp sets {unknown}, which the chart never sets"
    for name in ("REACH_MCP_HOST", "REACH_MCP_PORT", "REACH_MCP_TOKENS_FILE"):
        assert env[name] == chart_env[name]["value"], name
    # its own broker login, never the fleet's
    assert env["REACH_BROKER_URL"].split("@")[0] != SERVICES["router"]["environment"]["REACH_BROKER_URL"].split("@")[0]
    assert env["REACH_BROKER_URL"].startswith("amqp://reach_mcp:")
    tokens_dir = env["REACH_MCP_TOKENS_FILE"].rsplit("/", 1)[0]
    assert any(v.rsplit(":", 2)[1] == tokens_dir and v.endswith(":ro") for v in facade["volumes"])
    assert f"127.0.0.1:{env['REACH_MCP_PORT']}:{env['REACH_MCP_PORT']}" in facade["ports"]
    assert env["REACH_MCP_URL"] == f"http://127.0.0.1:{env['REACH_MCP_PORT']}/mcp"


def test_the_pools_stop_grace_period_matches_the_charts() -> None:
    grace = pod_spec(render().pool("local_ticket_system"))["terminationGracePeriodSeconds"]
    assert SERVICES["pool-local-ticket-system"]["stop_grace_period"] == f"{grace}s"


@pytest.mark.parametrize("service", ["router", "beat", "pool-local-ticket-system"])
def test_compose_health_checks_use_the_same_endpoint_as_the_charts_liveness_probe(service: str) -> None:
    test = SERVICES[service]["healthcheck"]["test"]
    probe = container(render().component("router"))["livenessProbe"]["httpGet"]
    assert f"http://127.0.0.1:9100{probe['path']}" in test[-1]


def test_prometheus_in_compose_scrapes_every_reach_process() -> None:
    config = yaml.safe_load(COMPOSE["configs"]["prometheus"]["content"])
    targets = {t for job in config["scrape_configs"] for group in job["static_configs"] for t in group["targets"]}
    # a service sharing another's network namespace is scraped at that service's name
    hosts = {
        SERVICES[name].get("network_mode", f"service:{name}").removeprefix("service:") for name in _reach_services()
    }
    assert targets == {f"{host}:9100" for host in hosts}
    assert SERVICES["prometheus"]["configs"][0]["target"] == "/etc/prometheus/prometheus.yml"
