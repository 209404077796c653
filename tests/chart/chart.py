"""Rendering helm/ with real Helm: helm-python-sdk binds Helm v4's Go SDK (no helm binary, offline)."""

from __future__ import annotations

import copy
import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import helm_python as helm
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART_DIR = REPO / "helm"
VALUES_DIR = Path(__file__).parent / "values"
RELEASE = "reach"
NAMESPACE = "agents"
KUBE_VERSION = "1.30.0"
SCENARIOS = ("defaults", "two-connectors", "existing-secrets")

# Custom resources: no Kubernetes schema for them; the tests check their shape themselves.
CRDS = {
    ("keda.sh/v1alpha1", "ScaledObject"),
    ("keda.sh/v1alpha1", "TriggerAuthentication"),
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
}


@dataclass(frozen=True)
class Rendered:
    """The objects of one render, and NOTES.txt."""

    objects: list[dict[str, Any]]
    notes: str
    text: str

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [o for o in self.objects if o["kind"] == kind]

    def get(self, kind: str, name: str) -> dict[str, Any]:
        matches = [o for o in self.of_kind(kind) if o["metadata"]["name"] == name]
        assert len(matches) == 1, f"{kind}/{name}: {len(matches)} rendered; have {self.names(kind)}"
        return matches[0]

    def names(self, kind: str) -> list[str]:
        return sorted(o["metadata"]["name"] for o in self.of_kind(kind))

    def pool(self, connector: str) -> dict[str, Any]:
        """The Deployment of a connector's pool, found by its connector label."""
        matches = [
            d for d in self.of_kind("Deployment") if d["metadata"]["labels"].get("agent-reach/connector") == connector
        ]
        assert len(matches) == 1, f"pool {connector}: {len(matches)} Deployments"
        return matches[0]

    def component(self, component: str) -> dict[str, Any]:
        matches = [
            d for d in self.of_kind("Deployment") if d["metadata"]["labels"]["app.kubernetes.io/component"] == component
        ]
        assert len(matches) == 1, f"{component}: {len(matches)} Deployments"
        return matches[0]


@functools.cache
def _chart() -> helm.Chart:
    return helm.Chart.load(CHART_DIR)


def scenario_values(name: str) -> dict[str, Any]:
    """The values file of a scenario ("defaults" is no file: the chart's own values)."""
    if name == "defaults":
        return {}
    return yaml.safe_load((VALUES_DIR / f"{name}.yaml").read_text())


def chart_defaults() -> dict[str, Any]:
    return yaml.safe_load((CHART_DIR / "values.yaml").read_text())


def merged_values(values: dict[str, Any]) -> dict[str, Any]:
    """What an install would use: the chart's defaults coalesced with ``values`` by Helm itself."""
    return _chart().merge_values(copy.deepcopy(values))


@functools.cache
def _render(key: str) -> Rendered:
    manifests = _chart().render(json.loads(key), name=RELEASE, namespace=NAMESPACE, is_install=True)
    notes = manifests.pop("agent-reach/templates/NOTES.txt", "")
    objects: list[dict[str, Any]] = []
    for path in sorted(manifests):
        for doc in yaml.safe_load_all(manifests[path]):
            if doc is not None:
                objects.append(doc)
    return Rendered(objects=objects, notes=notes, text="\n".join(manifests.values()))


def render(values: dict[str, Any] | None = None) -> Rendered:
    """Render the chart as `helm template reach helm/ -n agents -f values` would."""
    return _render(json.dumps(values or {}, sort_keys=True))


def render_error(values: dict[str, Any]) -> str:
    """The message Helm refuses ``values`` with (fails the test when it renders)."""
    try:
        _chart().render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    except (helm.HelmValuesError, helm.HelmRenderError) as exc:
        return str(exc)
    raise AssertionError(f"rendered although it should not: {values}")


def lint(values: dict[str, Any]) -> dict[str, Any]:
    return helm.lint(CHART_DIR, values, strict=True, namespace=NAMESPACE, kube_version=f"v{KUBE_VERSION}")


def pod_spec(deployment: dict[str, Any]) -> dict[str, Any]:
    return deployment["spec"]["template"]["spec"]


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    containers = pod_spec(deployment)["containers"]
    assert len(containers) == 1
    return containers[0]


def env_of(deployment: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container(deployment).get("env", [])}
