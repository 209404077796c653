"""The chart against an external RabbitMQ cluster: several node URLs in broker.url, the queue type
every process declares, and KEDA, which takes one URL."""

from __future__ import annotations

import base64
from typing import Any

from tests.chart.chart import env_of, lint, render, render_error, scenario_values

NODES = ";".join(f"amqp://reach:pw@rabbitmq-{n}.rabbitmq:5672/%2F" for n in range(3))


def cluster_values(**broker: Any) -> dict[str, Any]:
    values = scenario_values("two-connectors")
    return {**values, "broker": {"url": NODES, **broker}}


def test_every_process_gets_every_node_and_the_queue_type() -> None:
    values = cluster_values(queueType="quorum")
    values["keda"] = {"hostSecret": {"name": "keda-rabbitmq", "key": "host"}}
    report = lint(values)
    assert [m for m in report["messages"] if m["severity"] >= 2] == []
    rendered = render(values)
    secret = rendered.get("Secret", "reach-agent-reach-connections")
    assert base64.b64decode(secret["data"]["broker-url"]).decode() == NODES
    deployments = rendered.of_kind("Deployment")
    assert deployments
    for deployment in deployments:
        env = env_of(deployment)
        assert env["REACH_BROKER_URL"]["valueFrom"]["secretKeyRef"]["key"] == "broker-url"
        assert env["REACH_QUEUE_TYPE"]["value"] == "quorum", deployment["metadata"]["name"]


def test_quorum_is_the_default_and_classic_can_be_chosen() -> None:
    assert env_of(render().component("router"))["REACH_QUEUE_TYPE"]["value"] == "quorum"
    classic = render({"broker": {"queueType": "classic"}})
    assert {env_of(d)["REACH_QUEUE_TYPE"]["value"] for d in classic.of_kind("Deployment")} == {"classic"}


def test_an_unknown_queue_type_or_a_list_with_a_non_amqp_url_is_refused() -> None:
    assert "queueType" in render_error({"broker": {"queueType": "mirrored"}})
    assert "url" in render_error({"broker": {"url": "amqp://a:5672//;http://b:5672//"}})


def test_autoscaling_on_a_node_list_needs_a_single_url_for_keda() -> None:
    problem = render_error(cluster_values())  # crm_system is autoscaled, KEDA would read the list
    assert "keda.hostSecret" in problem and "crm_system" in problem
    # with a Secret of its own (one node, or a load balancer) KEDA reads that one
    values = cluster_values()
    values["keda"] = {"hostSecret": {"name": "keda-rabbitmq", "key": "host"}}
    auth = render(values).get("TriggerAuthentication", "reach-agent-reach-crm-system")
    assert auth["spec"]["secretTargetRef"] == [{"parameter": "host", "name": "keda-rabbitmq", "key": "host"}]
    # without autoscaling nothing needs one
    fixed = cluster_values()
    fixed["connectorDefaults"] = {**fixed.get("connectorDefaults", {}), "autoscaling": {"enabled": False}}
    fixed["connectors"] = [{k: v for k, v in c.items() if k != "autoscaling"} for c in fixed["connectors"]]
    assert render(fixed).of_kind("ScaledObject") == []
