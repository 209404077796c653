"""values.yaml and values.schema.json: documented, enforced, and true to the catalog they deploy."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from connectors.catalog import build
from connectors.loader import load_directory
from tests.chart.chart import (
    CHART_DIR,
    SCENARIOS,
    chart_defaults,
    merged_values,
    render,
    render_error,
    scenario_values,
)

SCHEMA = json.loads((CHART_DIR / "values.schema.json").read_text())


def _key_nodes(node: yaml.Node, path: str = "") -> list[tuple[str, yaml.ScalarNode]]:
    """Every mapping key of the document, with its dotted path (list items as [i])."""
    keys: list[tuple[str, yaml.ScalarNode]] = []
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            here = f"{path}.{key.value}" if path else key.value
            keys.append((here, key))
            keys.extend(_key_nodes(value, here))
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            keys.extend(_key_nodes(item, f"{path}[{i}]"))
    return keys


def test_every_values_key_has_a_comment() -> None:
    text = (CHART_DIR / "values.yaml").read_text()
    lines = text.splitlines()
    undocumented = []
    for path, key in _key_nodes(yaml.compose(text)):
        line = lines[key.start_mark.line]
        above = lines[key.start_mark.line - 1].strip() if key.start_mark.line else ""
        if "#" not in line and not above.startswith("#"):
            undocumented.append(path)
    assert undocumented == []


def _resolve(schema: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        target = SCHEMA
        for part in schema["$ref"].removeprefix("#/").split("/"):
            target = target[part]
        schema = {**target, **{k: v for k, v in schema.items() if k != "$ref"}}
    return schema


def _undescribed(value: Any, schema: dict[str, Any], path: str) -> list[str]:
    schema = _resolve(schema)
    missing = [] if schema.get("description") else [path or "(root)"]
    if isinstance(value, dict) and "properties" in schema:
        for key, child in value.items():
            if key in schema["properties"]:
                missing += _undescribed(child, schema["properties"][key], f"{path}.{key}" if path else key)
            elif schema.get("additionalProperties") is False:
                missing.append(f"{path}.{key} (not in the schema)")
    elif (
        isinstance(value, list) and isinstance(schema.get("items"), dict) and "properties" in _resolve(schema["items"])
    ):
        for i, item in enumerate(value):
            missing += _undescribed(item, schema["items"], f"{path}[{i}]")
    return missing


def test_the_schema_describes_every_values_key() -> None:
    assert _undescribed(chart_defaults(), SCHEMA, "") == []


def test_the_schema_describes_every_connector_entry_key() -> None:
    entry = _resolve(SCHEMA["properties"]["connectors"]["items"])
    assert entry["additionalProperties"] is False
    defaults = _resolve(SCHEMA["properties"]["connectorDefaults"])
    # an entry may set every default, plus its own name, concurrency and grace period
    assert set(entry["properties"]) == set(defaults["properties"]) | {
        "name",
        "concurrency",
        "terminationGracePeriodSeconds",
    }
    for key, sub in entry["properties"].items():
        assert _resolve(sub).get("description"), key


def test_objects_the_chart_owns_refuse_unknown_keys() -> None:
    closed = []

    def walk(schema: dict[str, Any], path: str) -> None:
        schema = _resolve(schema)
        if schema.get("type") == "object" and "properties" in schema:
            closed.append((path, schema.get("additionalProperties")))
            for key, sub in schema["properties"].items():
                walk(sub, f"{path}.{key}")
        if isinstance(schema.get("items"), dict):
            walk(schema["items"], f"{path}[]")

    walk(SCHEMA, "")
    # Kubernetes types passed through as they are (security contexts) stay open; the chart's own are closed
    open_ones = sorted(p for p, extra in closed if extra is not False)
    assert open_ones == [
        ".podSecurityContext",
        ".podSecurityContext.seccompProfile",
        ".securityContext",
        ".securityContext.capabilities",
    ]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"connectors": [{"name": "crm", "concurency": 4}]},
            "at '/connectors/0': additional properties 'concurency' not allowed",
        ),
        ({"connectors": [{"replicas": 2}]}, "at '/connectors/0': missing property 'name'"),
        ({"connectors": [{"name": "crm", "concurrency": 0}]}, "at '/connectors/0/concurrency': minimum: got 0, want 1"),
        (
            {"connectors": [{"name": "crm", "autoscaling": {"enabled": "yes"}}]},
            "at '/connectors/0/autoscaling/enabled': got string, want boolean",
        ),
        (
            {"connectors": [{"name": "crm", "autoscaling": {"queueLenght": 5}}]},
            "at '/connectors/0/autoscaling': additional properties 'queueLenght' not allowed",
        ),
        ({"connectors": [{"name": "crm.v2"}]}, "at '/connectors/0/name': 'crm.v2' does not match pattern"),
        ({"router": {"replicas": 0}}, "at '/router/replicas': minimum: got 0, want 1"),
        (
            {"broker": {"url": "http://rabbitmq:15672"}},
            "at '/broker/url': 'http://rabbitmq:15672' does not match pattern",
        ),
        ({"catalog": {"inline": {"tickets.yaml": "connector: {}"}}}, "at '/catalog/inline': got object, want string"),
        ({"catalog": {"mountPath": "etc/reach"}}, "at '/catalog/mountPath': 'etc/reach' does not match pattern"),
        ({"config": {"logLevel": "verbose"}}, "at '/config/logLevel': value must be one of"),
        (
            {"metrics": {"serviceMonitor": {"interval": "30 seconds"}}},
            "at '/metrics/serviceMonitor/interval': '30 seconds' does not match pattern",
        ),
        ({"replicaCount": 3}, "additional properties 'replicaCount' not allowed"),
    ],
)
def test_values_that_break_the_schema_are_refused_with_the_offending_key(values: dict[str, Any], message: str) -> None:
    error = render_error(values)
    assert "values don't meet the specifications of the schema" in error
    assert message in error


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"connectors": [{"name": "crm", "autoscaling": {"enabled": True, "minReplicas": 5, "maxReplicas": 2}}]},
            "connectors[0] (crm): autoscaling.minReplicas 5 is greater than maxReplicas 2",
        ),
        (
            {"connectors": [{"name": "crm", "maxActionTimeoutSeconds": 30, "terminationGracePeriodSeconds": 60}]},
            "connectors[0] (crm): terminationGracePeriodSeconds 60 is shorter than maxActionTimeoutSeconds x maxAttempts = 90",
        ),
        (
            {"connectors": [{"name": "crm_system"}, {"name": "CRM-system"}]},
            'connectors[1]: "crm_system" and "CRM-system" would both be named reach-agent-reach-crm-system',
        ),
        ({"connectors": [{"name": "reach"}]}, 'connectors[0]: "reach" is not a usable connector name'),
        ({"connectors": [{"name": "crm__v2"}]}, 'connectors[0]: "crm__v2" is not a usable connector name'),
        (
            {"broker": {"url": "", "existingSecret": ""}},
            "broker: set broker.existingSecret (recommended) or broker.url",
        ),
        ({"redis": {"url": ""}}, "redis: set redis.existingSecret (recommended) or redis.url"),
        (
            {"catalog": {"inline": "", "existingConfigMap": ""}},
            "catalog: set catalog.inline (the catalog YAML) or catalog.existingConfigMap",
        ),
    ],
)
def test_values_the_schema_cannot_judge_are_refused_by_the_templates(values: dict[str, Any], message: str) -> None:
    assert message in render_error(values)


def _config_map_volume(config_map: dict[str, Any], mount: Path) -> None:
    """Lay out a ConfigMap volume as the kubelet does: a timestamped directory with the files,
    ..data pointing at it, and one symlink per key through ..data."""
    mount.mkdir()
    (mount / "..2026_01_01_00_00_00.000000001").mkdir()
    for key, content in config_map["data"].items():
        (mount / "..2026_01_01_00_00_00.000000001" / key).write_text(content)
    (mount / "..data").symlink_to("..2026_01_01_00_00_00.000000001")
    for key in config_map["data"]:
        (mount / key).symlink_to(f"..data/{key}")


def _catalog_of(scenario: str, tmp_path: Path) -> Any:
    """Load the rendered catalog ConfigMap the way a pod does: mounted, from REACH_CATALOG."""
    rendered = render(scenario_values(scenario))
    (cm,) = rendered.of_kind("ConfigMap")
    router = rendered.component("router")
    mount = next(
        m["mountPath"]
        for m in router["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
        if m["name"] == "catalog"
    )
    reach_catalog = next(
        e["value"] for e in router["spec"]["template"]["spec"]["containers"][0]["env"] if e["name"] == "REACH_CATALOG"
    )
    root = tmp_path / "mnt"
    root.mkdir()
    _config_map_volume(cm, root / mount.lstrip("/").replace("/", "_"))
    directory = root / mount.lstrip("/").replace("/", "_") / Path(reach_catalog).relative_to(mount)
    catalog, problems = build(load_directory(directory, environ={}))
    assert problems == [], "the catalog as a pod reads it: " + "; ".join(map(str, problems))
    return catalog


@pytest.mark.parametrize("scenario", [s for s in SCENARIOS if s != "existing-secrets"])
def test_every_pool_serves_a_connector_of_the_catalog_it_mounts(scenario: str, tmp_path: Path) -> None:
    catalog = _catalog_of(scenario, tmp_path)
    for entry in merged_values(scenario_values(scenario))["connectors"]:
        assert entry["name"] in catalog.connectors


@pytest.mark.parametrize("scenario", [s for s in SCENARIOS if s != "existing-secrets"])
def test_grace_period_values_cover_the_catalogs_real_timeouts_and_attempts(scenario: str, tmp_path: Path) -> None:
    catalog = _catalog_of(scenario, tmp_path)
    values = merged_values(scenario_values(scenario))
    rendered = render(scenario_values(scenario))
    for entry in values["connectors"]:
        connector = catalog.connectors[entry["name"]]
        worst = max(a.timeout_seconds * (a.retry or connector.retry).max_attempts for a in connector.actions)
        grace = rendered.pool(entry["name"])["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        assert grace >= worst, f"{entry['name']}: {grace}s grace, but one action may take {worst}s"


def test_the_default_catalog_is_the_repositorys_demo_catalog() -> None:
    ours = yaml.safe_load_all(chart_defaults()["catalog"]["inline"])
    demo = yaml.safe_load_all((CHART_DIR.parent / "examples" / "catalog" / "tickets.yaml").read_text())
    assert list(ours) == list(demo), (
        "helm/values.yaml catalog.inline has drifted from examples/catalog/tickets.yaml (docker compose mounts that one)"
    )


_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def test_names_and_labels_are_valid_even_for_long_release_and_connector_names() -> None:
    long_name = "c" + "x" * 61 + "1"
    values = {
        "fullnameOverride": "a-release-name-that-is-forty-chars-long",
        "connectors": [{"name": "local_ticket_system"}, {"name": long_name}],
    }
    rendered = render(values)
    for obj in rendered.objects:
        name = obj["metadata"]["name"]
        assert len(name) <= 63 and _DNS_LABEL.match(name), name
        for key, value in obj["metadata"].get("labels", {}).items():
            assert len(value) <= 63 and _LABEL_VALUE.match(value), (key, value)
    assert rendered.pool(long_name)["metadata"]["name"] == ("a-release-name-that-is-forty-chars-long-" + long_name)[:63]
