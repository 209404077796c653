"""The chart's pool groups (`poolGroups`): a Deployment per group running `reach worker A B C --group
NAME`, KEDA scaling on the sum of the group's queues, and a connector consumed by one Deployment only."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.chart.chart import (
    CRDS,
    KUBE_VERSION,
    container,
    env_of,
    lint,
    pod_spec,
    render,
    render_error,
    scenario_values,
)
from tests.chart.test_values import _catalog_of
from workers.cli import main as reach_cli
from workers.ops.startup import GROUP_NAME, parse_members

GROUPS = scenario_values("pool-groups")
BACKOFFICE = "reach-agent-reach-group-backoffice"
SMALL = "reach-agent-reach-group-small-things"


def with_groups(groups: list[dict[str, Any]], connectors: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    values = copy.deepcopy(GROUPS)
    values["poolGroups"] = groups
    if connectors is not None:
        values["connectors"] = connectors
    return values


def test_no_group_is_rendered_by_default() -> None:
    rendered = render()
    assert [o for o in rendered.objects if "agent-reach/pool-group" in o["metadata"].get("labels", {})] == []


def test_helm_lint_is_clean_and_every_object_is_valid_for_kubernetes() -> None:
    report = lint(GROUPS)
    assert [m for m in report["messages"] if m["severity"] >= 2] == [] and report["errors"] == []
    for obj in render(GROUPS).objects:
        if (obj["apiVersion"], obj["kind"]) not in CRDS:
            kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)


def test_a_group_is_one_deployment_running_reach_worker_with_all_its_connectors() -> None:
    rendered = render(GROUPS)
    deployment = rendered.get("Deployment", BACKOFFICE)
    worker = container(deployment)
    assert worker["command"] == ["reach"]
    assert worker["args"] == ["worker", "wiki", "billing:4", "hr", "--group", "backoffice"]
    # the arguments are what `reach worker` itself accepts
    assert worker["args"][0] in reach_cli.commands
    members = parse_members(worker["args"][1:-2])
    assert [(m.connector, m.threads) for m in members] == [("wiki", None), ("billing", 4), ("hr", None)]
    assert GROUP_NAME.match(worker["args"][-1])
    assert "replicas" not in deployment["spec"]  # KEDA owns the count
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert labels["agent-reach/pool-group"] == "backoffice" and labels["app.kubernetes.io/component"] == "worker"
    assert "agent-reach/connector" not in labels
    assert deployment["spec"]["selector"]["matchLabels"]["agent-reach/pool-group"] == "backoffice"
    assert pod_spec(deployment)["terminationGracePeriodSeconds"] == 20 * 3 + 30
    assert env_of(deployment)["BILLING_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "billing-api"
    small = rendered.get("Deployment", SMALL)
    assert small["spec"]["replicas"] == 2 and container(small)["args"] == [
        "worker",
        "facilities",
        "--group",
        "small_things",
    ]
    # the large connector keeps a Deployment of its own
    assert rendered.pool("crm_system")["metadata"]["name"] == "reach-agent-reach-crm-system"
    assert rendered.names("PodDisruptionBudget") == sorted(
        ["reach-agent-reach-router", "reach-agent-reach-workflows", "reach-agent-reach-crm-system", BACKOFFICE, SMALL]
    )


def test_keda_scales_a_group_on_the_sum_of_its_queues() -> None:
    rendered = render(GROUPS)
    scaled = rendered.get("ScaledObject", BACKOFFICE)["spec"]
    assert scaled["scaleTargetRef"]["name"] == BACKOFFICE
    assert (scaled["minReplicaCount"], scaled["maxReplicaCount"]) == (1, 4)
    triggers = scaled["triggers"]
    assert [(t["name"], t["metadata"]["queueName"]) for t in triggers] == [
        ("q0", "reach.connector.wiki"),
        ("q1", "reach.connector.billing"),
        ("q2", "reach.connector.hr"),
    ]
    for trigger in triggers:
        assert trigger["type"] == "rabbitmq" and trigger["authenticationRef"] == {"name": BACKOFFICE}
        assert trigger["metadata"] == {
            "protocol": "amqp",
            "queueName": trigger["metadata"]["queueName"],
            "mode": "QueueLength",
            "value": "30",
        }
        assert "host" not in trigger["metadata"]  # credentials only through the TriggerAuthentication
    assert scaled["advanced"] == {
        "scalingModifiers": {"formula": "q0 + q1 + q2", "target": "30", "metricType": "AverageValue"}
    }
    (ref,) = rendered.get("TriggerAuthentication", BACKOFFICE)["spec"]["secretTargetRef"]
    assert ref["parameter"] == "host"
    assert SMALL not in rendered.names("ScaledObject")  # not autoscaled


def test_beat_gets_the_groups_environment_and_prometheus_their_group_label() -> None:
    rendered = render(GROUPS)
    assert env_of(rendered.component("beat"))["BILLING_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "billing-api"
    (monitor,) = rendered.of_kind("ServiceMonitor")
    assert "agent-reach/pool-group" in monitor["spec"]["podTargetLabels"]
    assert "group   reach-agent-reach-group-backoffice  consumes reach.connector.wiki, reach.connector.billing" in (
        rendered.notes
    )


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            with_groups([{"name": "a", "connectors": ["crm_system"]}]),
            'poolGroups[0] (a): connector "crm_system" already runs in its own pool (connectors)',
        ),
        (
            with_groups([{"name": "a", "connectors": ["wiki"]}, {"name": "b", "connectors": ["hr", "wiki"]}]),
            'poolGroups[1] (b): connector "wiki" already runs in pool group a',
        ),
        (
            with_groups([{"name": "a_b", "connectors": ["wiki"]}, {"name": "a-b", "connectors": ["hr"]}]),
            'poolGroups[1]: "a_b" and "a-b" would both be named reach-agent-reach-group-a-b',
        ),
        (
            with_groups([{"name": "a", "connectors": ["reach"]}]),
            'poolGroups[0] (a): "reach" is not a usable connector name',
        ),
        (
            with_groups(
                [
                    {
                        "name": "a",
                        "connectors": ["wiki"],
                        "autoscaling": {"enabled": True, "minReplicas": 3, "maxReplicas": 2},
                    }
                ]
            ),
            "poolGroups[0] (a): autoscaling.minReplicas 3 is greater than maxReplicas 2",
        ),
        (
            with_groups([{"name": "a", "connectors": ["wiki"], "terminationGracePeriodSeconds": 10}]),
            "poolGroups[0] (a): terminationGracePeriodSeconds 10 is shorter than maxActionTimeoutSeconds x maxAttempts",
        ),
    ],
)
def test_groups_the_schema_cannot_judge_are_refused_by_the_templates(values: dict[str, Any], message: str) -> None:
    assert message in render_error(values)


@pytest.mark.parametrize(
    ("groups", "message"),
    [
        ([{"name": "a", "connectors": []}], "at '/poolGroups/0/connectors': minItems"),
        ([{"connectors": ["wiki"]}], "at '/poolGroups/0': missing property 'name'"),
        ([{"name": "A group", "connectors": ["wiki"]}], "at '/poolGroups/0/name': 'A group' does not match pattern"),
        ([{"name": "a", "connectors": ["wiki"], "concurrency": 4}], "additional properties 'concurrency' not allowed"),
        ([{"name": "a", "connectors": [{"name": "wiki", "threads": 4}]}], "at '/poolGroups/0/connectors/0'"),
    ],
)
def test_groups_that_break_the_schema_are_refused_with_the_offending_key(
    groups: list[dict[str, Any]], message: str
) -> None:
    error = render_error(with_groups(groups))
    assert "values don't meet the specifications of the schema" in error
    assert message in error


def test_the_values_file_documents_pool_groups() -> None:
    from tests.chart.chart import CHART_DIR

    text = (CHART_DIR / "values.yaml").read_text()
    assert yaml.safe_load(text)["poolGroups"] == []
    assert "reach worker A B C --group NAME" in text


def test_every_group_serves_connectors_of_the_catalog_it_mounts_within_its_grace_period(tmp_path: Path) -> None:
    catalog = _catalog_of("pool-groups", tmp_path)
    rendered = render(GROUPS)
    for group in GROUPS["poolGroups"]:
        names = [m if isinstance(m, str) else m["name"] for m in group["connectors"]]
        assert set(names) <= set(catalog.connectors), group["name"]
        deployment = next(
            d
            for d in rendered.of_kind("Deployment")
            if d["metadata"]["labels"].get("agent-reach/pool-group") == group["name"]
        )
        grace = pod_spec(deployment)["terminationGracePeriodSeconds"]
        for name in names:
            connector = catalog.connectors[name]
            worst = max(a.timeout_seconds * (a.retry or connector.retry).max_attempts for a in connector.actions)
            assert grace >= worst, f"{group['name']}: {grace}s grace, but {name} may take {worst}s"
