"""The chart's optional console (`reach console`): off by default; when on, a Deployment running
`reach console` with its users from a Secret, a Service, and an Ingress only when asked for."""

from __future__ import annotations

import copy
from typing import Any

import kubernetes_validate
import pytest

from tests.chart.chart import CRDS, KUBE_VERSION, container, env_of, lint, pod_spec, render, render_error
from workers.cli import main as reach_cli
from workers.settings import Settings

NAME = "reach-agent-reach-console"
CONSOLE: dict[str, Any] = {
    "broker": {"existingSecret": "reach-broker"},
    "redis": {"existingSecret": "reach-redis"},
    "console": {
        "enabled": True,
        "replicas": 2,
        "publicUrl": "https://reach-console.example.com",
        "users": {"existingSecret": "reach-console-users"},
        "sessionKey": {"existingSecret": "reach-console-session"},
        "ingress": {
            "enabled": True,
            "host": "reach-console.example.com",
            "tls": [{"secretName": "console-tls", "hosts": ["reach-console.example.com"]}],
        },
    },
}


def with_console(**changes: Any) -> dict[str, Any]:
    values = copy.deepcopy(CONSOLE)
    values["console"].update(changes)
    return values


def test_the_console_is_off_by_default() -> None:
    assert [o for o in render().objects if o["metadata"]["name"] == NAME] == []


def test_enabled_it_renders_a_deployment_a_service_and_an_ingress_valid_for_kubernetes() -> None:
    report = lint(CONSOLE)
    assert [m for m in report["messages"] if m["severity"] >= 2] == [] and report["errors"] == []
    rendered = render(CONSOLE)
    for obj in rendered.objects:
        if (obj["apiVersion"], obj["kind"]) not in CRDS:
            kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
    deployment = rendered.get("Deployment", NAME)
    console = container(deployment)
    assert console["command"] == ["reach"] and console["args"] == ["console"] and "console" in reach_cli.commands
    assert deployment["spec"]["replicas"] == 2
    assert [(p["name"], p["containerPort"]) for p in console["ports"]] == [("console", 8090)]
    env = env_of(deployment)
    settings = Settings.from_env({k: v["value"] for k, v in env.items() if "value" in v})  # every value is valid
    assert (settings.console_host, settings.console_port, settings.console_secure_cookie) == ("0.0.0.0", 8090, True)
    assert settings.console_public_url == "https://reach-console.example.com"
    assert env["REACH_CONSOLE_SESSION_KEY"]["valueFrom"]["secretKeyRef"]["name"] == "reach-console-session"
    assert env["REACH_REDIS_URL"]["valueFrom"]["secretKeyRef"]["name"] == "reach-redis"
    users_dir = settings.console_users.rsplit("/", 1)[0] if settings.console_users else ""
    mounts = {m["name"]: m for m in console["volumeMounts"]}
    assert mounts["console-users"]["mountPath"] == users_dir and "subPath" not in mounts["console-users"]
    volumes = {v["name"]: v for v in pod_spec(deployment)["volumes"]}
    assert volumes["console-users"]["secret"]["secretName"] == "reach-console-users"
    service = rendered.get("Service", NAME)
    assert service["spec"]["ports"][0]["targetPort"] == "console"
    ingress = rendered.get("Ingress", NAME)
    backend = ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
    assert backend == {"name": NAME, "port": {"name": "console"}}
    assert ingress["spec"]["tls"][0]["secretName"] == "console-tls"


def test_no_ingress_unless_asked_for() -> None:
    values = with_console(ingress={"enabled": False, "host": "x.example.com"})
    assert render(values).names("Ingress") == []
    assert NAME in render(values).names("Service")


@pytest.mark.parametrize(
    "changes, complaint",
    [
        ({"users": {"existingSecret": ""}}, "console.users.existingSecret"),
        ({"sessionKey": {"existingSecret": ""}}, "console.sessionKey.existingSecret"),
        ({"publicUrl": ""}, "console.publicUrl"),
    ],
)
def test_what_the_console_cannot_run_without_is_refused(changes: dict[str, Any], complaint: str) -> None:
    assert complaint in render_error(with_console(**changes))
