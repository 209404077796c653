"""The workflow runner in the chart (issue 32): `reach workflows` as a Deployment of its own, on by
default, with the fleet's login and settings, probed and scraped like every other process; and
beat's binding sweep, which needs rabbitmqctl the chart's image does not have."""

from __future__ import annotations

from typing import Any

import pytest

from tests.chart.chart import (
    container,
    env_of,
    merged_values,
    pod_spec,
    render,
    render_error,
    scenario_values,
)
from workers.cli import main as reach_cli
from workers.settings import Settings

NAME = "reach-agent-reach-workflows"
FILES = {
    "connectors": [
        {
            "name": "ledger",
            "files": [{"name": "ledger-wsdl", "configMap": "ledger-wsdl", "env": {"LEDGER_WSDL": "ledger.wsdl"}}],
        }
    ]
}


def runner(values: dict[str, Any] | None = None) -> dict[str, Any]:
    return render(values).get("Deployment", NAME)


def settings_of(deployment: dict[str, Any]) -> Settings:
    """The settings the container's plain env values give (secrets left out)."""
    env = {n: e["value"] for n, e in env_of(deployment).items() if n.startswith("REACH_") and "value" in e}
    return Settings.from_env(env)


def test_the_runner_is_on_by_default_and_runs_reach_workflows() -> None:
    deployment = runner()
    c = container(deployment)
    assert c["name"] == "workflows"
    assert c["command"] == ["reach"] and c["args"] == ["workflows"]
    assert c["args"][0] in reach_cli.commands
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert labels["app.kubernetes.io/component"] == "workflows"
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert pod_spec(deployment)["terminationGracePeriodSeconds"] == 30
    assert "reach-agent-reach-workflows" in render().names("PodDisruptionBudget")
    assert "reach.workflows and reach.workflows.receipts" in render().notes


def test_the_runner_uses_the_fleets_login_redis_catalog_and_queue_type() -> None:
    rendered = render(scenario_values("existing-secrets"))
    deployment, router = rendered.get("Deployment", NAME), rendered.component("router")
    env = env_of(deployment)
    # the fleet's own broker login: the router accepts delegated step intents only from it
    for name in ("REACH_BROKER_URL", "REACH_REDIS_URL"):
        assert env[name] == env_of(router)[name]
    assert env["REACH_QUEUE_TYPE"]["value"] == "quorum"
    assert env["REACH_CATALOG"] == env_of(router)["REACH_CATALOG"]
    mounts = {m["name"]: m for m in container(deployment)["volumeMounts"]}
    assert mounts["catalog"]["readOnly"] is True
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["checksum/catalog"] == router["spec"]["template"]["metadata"]["annotations"]["checksum/catalog"]
    settings = settings_of(deployment)
    assert settings.workflow_threads == 8
    assert settings.workflow_retention_seconds == 168 * 3600


def test_replicas_threads_retention_resources_and_placement_follow_values() -> None:
    values = {
        "workflows": {
            "replicas": 4,
            "threads": 16,
            "retention": "72h",
            "resources": {"requests": {"cpu": "250m", "memory": "256Mi"}, "limits": {"memory": "512Mi"}},
            "env": [{"name": "EXTRA", "value": "1"}],
            "nodeSelector": {"pool": "control"},
            "podLabels": {"team": "ops"},
            "terminationGracePeriodSeconds": 60,
        },
        "console": {"enabled": True, "users": {"existingSecret": "reach-console-users"}},
    }
    rendered = render(values)
    deployment = rendered.get("Deployment", NAME)
    assert deployment["spec"]["replicas"] == 4
    assert container(deployment)["resources"] == values["workflows"]["resources"]
    assert pod_spec(deployment)["nodeSelector"] == {"pool": "control"}
    assert pod_spec(deployment)["terminationGracePeriodSeconds"] == 60
    assert deployment["spec"]["template"]["metadata"]["labels"]["team"] == "ops"
    assert env_of(deployment)["EXTRA"]["value"] == "1"
    settings = settings_of(deployment)
    assert (settings.workflow_threads, settings.workflow_retention_seconds) == (16, 72 * 3600)
    # resume and abort (console, `reach workflow`) write runs too: the same retention everywhere
    for component in ("router", "beat", "console"):
        assert env_of(rendered.component(component))["REACH_WORKFLOW_RETENTION"]["value"] == "72h"
    assert "EXTRA" not in env_of(rendered.component("router"))


def test_the_runner_is_probed_and_scraped_like_every_process() -> None:
    rendered = render({"metrics": {"serviceMonitor": {"enabled": True}}})
    deployment = rendered.get("Deployment", NAME)
    c = container(deployment)
    assert c["ports"] == [{"name": "metrics", "containerPort": 9100, "protocol": "TCP"}]
    assert env_of(deployment)["REACH_METRICS_PORT"]["value"] == "9100"
    for probe, path in (("livenessProbe", "/healthz"), ("startupProbe", "/healthz"), ("readinessProbe", "/readyz")):
        assert c[probe]["httpGet"] == {"path": path, "port": "metrics"}
    pod = deployment["spec"]["template"]["metadata"]
    assert pod["annotations"]["prometheus.io/scrape"] == "true" and pod["annotations"]["prometheus.io/port"] == "9100"
    service = rendered.get("Service", "reach-agent-reach-metrics")
    assert service["spec"]["selector"].items() <= pod["labels"].items()
    (monitor,) = rendered.of_kind("ServiceMonitor")
    assert "app.kubernetes.io/component" in monitor["spec"]["podTargetLabels"]  # component="workflows"


def test_the_runner_runs_as_the_images_user_without_an_api_token() -> None:
    deployment = runner()
    spec = pod_spec(deployment)
    assert spec["securityContext"]["runAsNonRoot"] is True and spec["automountServiceAccountToken"] is False
    assert container(deployment)["securityContext"]["readOnlyRootFilesystem"] is True


def test_the_runner_gets_the_adapter_file_variables_the_catalog_reads_but_mounts_nothing() -> None:
    deployment = runner(FILES)
    assert env_of(deployment)["LEDGER_WSDL"]["value"] == "/etc/agent-reach/files/ledger-wsdl/ledger.wsdl"
    assert not [v for v in pod_spec(deployment)["volumes"] if v["name"].startswith("file-")]


def test_the_disruption_budget_selects_only_the_runners_pods() -> None:
    rendered = render()
    selector = rendered.get("PodDisruptionBudget", NAME)["spec"]["selector"]["matchLabels"]
    covered = [
        d["metadata"]["name"]
        for d in rendered.of_kind("Deployment")
        if selector.items() <= d["spec"]["template"]["metadata"]["labels"].items()
    ]
    assert covered == [NAME]


def test_off_renders_no_runner_and_the_notes_say_runs_wait() -> None:
    rendered = render({"workflows": {"enabled": False}})
    assert NAME not in rendered.names("Deployment")
    assert NAME not in rendered.names("PodDisruptionBudget")
    assert "runs agents start wait in reach.workflows" in rendered.notes
    assert merged_values({})["workflows"]["enabled"] is True


def test_a_connector_named_like_the_runner_is_refused() -> None:
    error = render_error({"connectors": [{"name": "workflows"}]})
    assert 'connectors[0]: "workflows" would be named reach-agent-reach-workflows' in error
    assert "the name of the workflows Deployment" in error


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"workflows": {"replicas": 0}}, "at '/workflows/replicas': minimum: got 0, want 1"),
        ({"workflows": {"threads": 0}}, "at '/workflows/threads': minimum: got 0, want 1"),
        ({"workflows": {"retention": "7 days"}}, "at '/workflows/retention': '7 days' does not match pattern"),
        ({"workflows": {"replica": 3}}, "at '/workflows': additional properties 'replica' not allowed"),
        ({"beat": {"bindingSweepSeconds": -1}}, "at '/beat/bindingSweepSeconds': minimum: got -1, want 0"),
    ],
)
def test_bad_runner_and_sweep_values_are_refused(values: dict[str, Any], message: str) -> None:
    assert message in render_error(values)


def test_beat_does_not_sweep_bindings_by_default_its_image_has_no_rabbitmqctl() -> None:
    beat = render().component("beat")
    env = env_of(beat)
    assert env["REACH_BINDING_SWEEP_SECONDS"]["value"] == "0"
    assert "REACH_RABBITMQCTL" not in env
    assert settings_of(beat).binding_sweep_seconds == 0


def test_a_binding_sweep_needs_a_rabbitmqctl_to_run() -> None:
    error = render_error({"beat": {"bindingSweepSeconds": 300}})
    assert "beat.bindingSweepSeconds" in error and "set beat.rabbitmqctl" in error
    env = env_of(
        render({"beat": {"bindingSweepSeconds": 300, "rabbitmqctl": "rabbitmqctl -n rabbit@rabbitmq-0"}}).component(
            "beat"
        )
    )
    assert env["REACH_BINDING_SWEEP_SECONDS"]["value"] == "300"
    assert env["REACH_RABBITMQCTL"]["value"] == "rabbitmqctl -n rabbit@rabbitmq-0"
