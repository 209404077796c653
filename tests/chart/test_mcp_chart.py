"""The chart's optional MCP facade (`reach mcp --http`): off by default; when on, a Deployment and a
Service any replica can answer, its own broker login, its tokens from Secrets, nothing it must not have."""

from __future__ import annotations

import copy
from typing import Any

import kubernetes_validate
import pytest

from producers.client_settings import env_name
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
from workers.cli import main as reach_cli
from workers.settings import Settings

MCP = scenario_values("mcp")
NAME = "reach-agent-reach-mcp"


def with_mcp(**changes: Any) -> dict[str, Any]:
    values = copy.deepcopy(MCP)
    values["mcp"].update(changes)
    return values


def test_the_facade_is_off_by_default() -> None:
    rendered = render()
    assert [o for o in rendered.objects if o["metadata"]["name"] == NAME] == []


def test_helm_lint_is_clean_and_every_object_is_valid_for_kubernetes() -> None:
    report = lint(MCP)
    assert [m for m in report["messages"] if m["severity"] >= 2] == [] and report["errors"] == []
    for obj in render(MCP).objects:
        if (obj["apiVersion"], obj["kind"]) not in CRDS:
            kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)


def test_the_facade_runs_reach_mcp_http_on_its_named_port_behind_a_service_of_its_own() -> None:
    rendered = render(MCP)
    deployment = rendered.get("Deployment", NAME)
    facade = container(deployment)
    assert facade["command"] == ["reach"] and facade["args"] == ["mcp", "--http"]
    assert facade["args"][0] in reach_cli.commands
    assert deployment["spec"]["replicas"] == 3
    assert {p["name"]: p["containerPort"] for p in facade["ports"]} == {"metrics": 9100, "mcp": 8808}
    env = env_of(deployment)
    assert env["REACH_MCP_PORT"]["value"] == "8808" and env["REACH_MCP_HOST"]["value"] == "0.0.0.0"
    assert env["REACH_MCP_URL"]["value"] == "https://reach.example.com/mcp"
    assert facade["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    service = rendered.get("Service", NAME)
    assert service["spec"]["ports"] == [{"name": "mcp", "port": 80, "targetPort": "mcp", "protocol": "TCP"}]
    assert "sessionAffinity" not in service["spec"]  # stateless: any replica answers
    # the Service, the disruption budget and the Deployment's own selector reach the facade's pods only
    pdb = rendered.get("PodDisruptionBudget", NAME)
    for selector in (service["spec"]["selector"], pdb["spec"]["selector"]["matchLabels"]):
        owners = [
            d["metadata"]["name"]
            for d in rendered.of_kind("Deployment")
            if selector.items() <= d["spec"]["template"]["metadata"]["labels"].items()
        ]
        assert owners == [NAME]
    metrics = rendered.get("Service", "reach-agent-reach-metrics")
    assert metrics["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()


def test_the_facade_logs_in_as_itself_and_reads_its_tokens_from_secrets_it_never_renders() -> None:
    rendered = render(MCP)
    deployment = rendered.get("Deployment", NAME)
    env = env_of(deployment)
    assert env["REACH_BROKER_URL"]["valueFrom"] == {"secretKeyRef": {"name": "reach-mcp-broker", "key": "broker-url"}}
    assert "REACH_REDIS_URL" not in env  # it keeps no state of its own
    assert env["REACH_MCP_JWT_KEY"]["valueFrom"] == {"secretKeyRef": {"name": "reach-mcp-jwt", "key": "public.pem"}}
    assert (env["REACH_MCP_JWT_ALGORITHM"]["value"], env["REACH_MCP_ISSUER_URL"]["value"]) == (
        "RS256",
        "https://idp.example.com",
    )
    (volume,) = [v for v in pod_spec(deployment)["volumes"] if v["name"] == "mcp-tokens"]
    assert volume["secret"] == {
        "secretName": "reach-mcp-tokens",
        "items": [{"key": "tokens.yaml", "path": "tokens.yaml"}],
    }
    (mount,) = [m for m in container(deployment)["volumeMounts"] if m["name"] == "mcp-tokens"]
    # a directory, not subPath, so a rotated Secret reaches the running facade
    assert mount == {"name": "mcp-tokens", "mountPath": "/etc/reach/mcp-tokens", "readOnly": True}
    assert env["REACH_MCP_TOKENS_FILE"]["value"] == "/etc/reach/mcp-tokens/tokens.yaml"
    assert [s["metadata"]["name"] for s in rendered.of_kind("Secret")] == []  # every credential is the user's
    # JWTs only: no tokens volume and no tokens file
    only_jwt = render(with_mcp(tokens={"existingSecret": "", "existingSecretKey": "tokens.yaml"}))
    jwt_env = env_of(only_jwt.get("Deployment", NAME))
    assert "REACH_MCP_TOKENS_FILE" not in jwt_env and "REACH_MCP_JWT_KEY" in jwt_env
    assert all(v["name"] != "mcp-tokens" for v in pod_spec(only_jwt.get("Deployment", NAME))["volumes"])


def test_every_variable_the_chart_gives_the_facade_is_a_setting() -> None:
    settings = {env_name(Settings, field) for field in Settings.model_fields}
    env = env_of(render(MCP).get("Deployment", NAME))
    assert {name for name in env if name.startswith("REACH_")} <= settings


def test_the_grace_period_outlasts_the_wait_for_a_receipt() -> None:
    spec = pod_spec(render(with_mcp(waitSeconds=120, terminationGracePeriodSeconds=150)).get("Deployment", NAME))
    assert spec["terminationGracePeriodSeconds"] == 150
    assert (
        env_of(render(with_mcp(waitSeconds=120, terminationGracePeriodSeconds=150)).get("Deployment", NAME))[
            "REACH_MCP_WAIT"
        ]["value"]
        == "120"
    )


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"url": ""}, "mcp.url: set the URL MCP clients reach the facade at"),
        ({"broker": {"existingSecret": "", "existingSecretKey": "broker-url"}}, "mcp.broker.existingSecret"),
        (
            {
                "tokens": {"existingSecret": "", "existingSecretKey": "tokens.yaml"},
                "jwt": {"existingSecret": "", "existingSecretKey": "k", "algorithm": "RS256", "issuerUrl": ""},
            },
            "the facade never serves without authentication",
        ),
        ({"waitSeconds": 120}, "mcp.terminationGracePeriodSeconds 90 is shorter than mcp.waitSeconds 120"),
    ],
)
def test_a_facade_that_could_not_work_safely_is_refused(changes: dict[str, Any], message: str) -> None:
    assert message in render_error(with_mcp(**changes))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"url": "reach.example.com/mcp"}, "at '/mcp/url'"),
        (
            {"jwt": {"existingSecret": "j", "existingSecretKey": "k", "algorithm": "none", "issuerUrl": ""}},
            "at '/mcp/jwt/algorithm'",
        ),
        ({"replicas": 0}, "at '/mcp/replicas': minimum: got 0, want 1"),
        ({"sessionAffinity": "ClientIP"}, "additional properties 'sessionAffinity' not allowed"),
    ],
)
def test_values_that_break_the_schema_are_refused(changes: dict[str, Any], message: str) -> None:
    error = render_error(with_mcp(**changes))
    assert "values don't meet the specifications of the schema" in error and message in error
