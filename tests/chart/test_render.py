"""The chart as Kubernetes sees it: rendered by real Helm, validated against Kubernetes 1.30."""

from __future__ import annotations

import base64
from typing import Any

import kubernetes_validate
import pytest

from tests.chart.chart import (
    CRDS,
    KUBE_VERSION,
    NAMESPACE,
    SCENARIOS,
    chart_defaults,
    container,
    env_of,
    lint,
    pod_spec,
    render,
    render_error,
    scenario_values,
)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_helm_lint_is_clean(scenario: str) -> None:
    report = lint(scenario_values(scenario))
    problems = [m for m in report["messages"] if m["severity"] >= 2]  # 2 warning, 3 error
    assert problems == [] and report["errors"] == []


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_core_object_is_valid_for_kubernetes_1_30(scenario: str) -> None:
    rendered = render(scenario_values(scenario))
    core = [o for o in rendered.objects if (o["apiVersion"], o["kind"]) not in CRDS]
    assert core
    for obj in core:
        try:
            kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            path = "/".join(str(p) for p in exc.path)
            pytest.fail(f"{obj['kind']}/{obj['metadata']['name']} at {path}: {exc.message}")


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_custom_resources_have_the_shape_their_operators_expect(scenario: str) -> None:
    rendered = render(scenario_values(scenario))
    for obj in rendered.objects:
        if (obj["apiVersion"], obj["kind"]) in CRDS:
            assert set(obj) == {"apiVersion", "kind", "metadata", "spec"}
            assert set(obj["metadata"]) == {"name", "labels"}
    for so in rendered.of_kind("ScaledObject"):
        spec = so["spec"]
        assert set(spec) == {
            "scaleTargetRef",
            "minReplicaCount",
            "maxReplicaCount",
            "pollingInterval",
            "cooldownPeriod",
            "triggers",
        }
        assert all(
            isinstance(spec[k], int)
            for k in ("minReplicaCount", "maxReplicaCount", "pollingInterval", "cooldownPeriod")
        )
        (trigger,) = spec["triggers"]
        assert set(trigger) == {"type", "metadata", "authenticationRef"}
        # KEDA's trigger metadata is map[string]string: every value must be a string
        assert all(isinstance(v, str) for v in trigger["metadata"].values())
        assert "host" not in trigger["metadata"]  # credentials only through the TriggerAuthentication
    for auth in rendered.of_kind("TriggerAuthentication"):
        (ref,) = auth["spec"]["secretTargetRef"]
        assert set(ref) == {"parameter", "name", "key"} and all(isinstance(v, str) and v for v in ref.values())
    for sm in rendered.of_kind("ServiceMonitor"):
        assert set(sm["spec"]) == {"selector", "namespaceSelector", "podTargetLabels", "endpoints"}
        for endpoint in sm["spec"]["endpoints"]:
            assert set(endpoint) == {"port", "path", "interval", "scrapeTimeout"}


def test_defaults_render_the_router_beat_the_workflow_runner_and_the_demo_pool() -> None:
    rendered = render()
    assert rendered.names("Deployment") == [
        "reach-agent-reach-beat",
        "reach-agent-reach-local-ticket-system",
        "reach-agent-reach-router",
        "reach-agent-reach-workflows",
    ]
    assert {o["kind"] for o in rendered.objects} == {
        "Deployment",
        "ConfigMap",
        "Secret",
        "Service",
        "ServiceAccount",
        "PodDisruptionBudget",
    }
    router = rendered.component("router")
    assert container(router)["command"] == ["reach"] and container(router)["args"] == ["router"]
    assert router["spec"]["replicas"] == 2
    pool = rendered.pool("local_ticket_system")
    assert container(pool)["args"] == ["worker", "local_ticket_system", "-c", "8"]
    assert pool["spec"]["replicas"] == 2


def test_each_connector_gets_its_own_pool_running_reach_worker_with_its_concurrency() -> None:
    rendered = render(scenario_values("two-connectors"))
    crm, billing = rendered.pool("crm_system"), rendered.pool("billing")
    assert crm["metadata"]["name"] == "reach-agent-reach-crm-system"
    assert container(crm)["command"] == ["reach"]
    assert container(crm)["args"] == ["worker", "crm_system", "-c", "16"]
    assert container(billing)["args"] == ["worker", "billing", "-c", "4"]
    # each pool's pods are selected by its own connector label, so no pool adopts another's pods
    assert crm["spec"]["selector"]["matchLabels"]["agent-reach/connector"] == "crm_system"
    assert billing["spec"]["selector"]["matchLabels"]["agent-reach/connector"] == "billing"


def test_without_concurrency_the_catalogs_pool_concurrency_applies() -> None:
    rendered = render({"connectors": [{"name": "local_ticket_system"}]})
    assert container(rendered.pool("local_ticket_system"))["args"] == ["worker", "local_ticket_system"]


def test_an_autoscaled_pool_has_no_replicas_and_a_keda_scaled_object_on_its_queue() -> None:
    rendered = render(scenario_values("two-connectors"))
    crm, billing = rendered.pool("crm_system"), rendered.pool("billing")
    assert "replicas" not in crm["spec"], "KEDA owns the replica count of an autoscaled pool"
    assert billing["spec"]["replicas"] == 3

    assert rendered.names("ScaledObject") == ["reach-agent-reach-crm-system"]
    so = rendered.get("ScaledObject", "reach-agent-reach-crm-system")
    assert so["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": crm["metadata"]["name"],
    }
    assert (so["spec"]["minReplicaCount"], so["spec"]["maxReplicaCount"]) == (2, 20)
    assert so["spec"]["pollingInterval"] == 15 and so["spec"]["cooldownPeriod"] == 300
    (trigger,) = so["spec"]["triggers"]
    assert trigger["type"] == "rabbitmq"
    assert trigger["metadata"] == {
        "protocol": "amqp",
        "queueName": "reach.connector.crm_system",
        "mode": "QueueLength",
        "value": "25",
    }
    assert trigger["authenticationRef"] == {"name": "reach-agent-reach-crm-system"}

    auth = rendered.get("TriggerAuthentication", "reach-agent-reach-crm-system")
    assert auth["spec"]["secretTargetRef"] == [
        {"parameter": "host", "name": "reach-agent-reach-connections", "key": "broker-url"}
    ]
    # the host KEDA reads is the very URL the pools use
    broker_env = env_of(crm)["REACH_BROKER_URL"]["valueFrom"]["secretKeyRef"]
    assert broker_env == {"name": "reach-agent-reach-connections", "key": "broker-url"}


def test_connector_defaults_apply_unless_an_entry_overrides_them() -> None:
    rendered = render(scenario_values("two-connectors"))
    crm, billing = rendered.pool("crm_system"), rendered.pool("billing")
    # autoscaling.enabled true from the defaults, queueLength from the entry
    so = rendered.get("ScaledObject", "reach-agent-reach-crm-system")
    assert so["spec"]["triggers"][0]["metadata"]["value"] == "25"
    # an explicit `enabled: false` beats a default of true (no sprig merge dropping falsy values)
    assert "reach-agent-reach-billing" not in rendered.names("ScaledObject")
    # nodeSelector merges, tolerations come from the defaults, env is appended
    assert pod_spec(crm)["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert pod_spec(billing)["nodeSelector"] == {"kubernetes.io/os": "linux", "pool": "billing"}
    assert pod_spec(billing)["tolerations"] == pod_spec(crm)["tolerations"] != []
    assert env_of(crm)["SHARED_SETTING"]["value"] == "on"
    assert env_of(billing)["SHARED_SETTING"]["value"] == "on"
    assert env_of(billing)["BILLING_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "billing-api", "key": "token"}
    assert "BILLING_TOKEN" not in env_of(crm)
    assert container(billing)["envFrom"] == [{"secretRef": {"name": "billing-extra"}}]
    assert "envFrom" not in container(crm)
    assert container(billing)["resources"]["limits"]["memory"] == "1Gi"
    assert container(crm)["resources"] == chart_defaults()["connectorDefaults"]["resources"]


def test_an_entrys_variable_replaces_the_default_of_the_same_name() -> None:
    rendered = render(
        {
            "connectorDefaults": {"env": [{"name": "MODE", "value": "shared"}, {"name": "A", "value": "1"}]},
            "beat": {"env": [{"name": "MODE", "value": "shared"}]},
            "connectors": [{"name": "crm", "env": [{"name": "MODE", "value": "crm"}]}, {"name": "erp"}],
        }
    )
    assert [(e["name"], e["value"]) for e in container(rendered.pool("crm"))["env"] if e["name"] in ("MODE", "A")] == [
        ("A", "1"),
        ("MODE", "crm"),
    ]
    assert env_of(rendered.pool("erp"))["MODE"]["value"] == "shared"


def test_grace_period_covers_the_longest_action_times_its_attempts_plus_a_margin() -> None:
    rendered = render(scenario_values("two-connectors"))
    margin = chart_defaults()["connectorDefaults"]["gracePeriodMarginSeconds"]
    assert pod_spec(rendered.pool("crm_system"))["terminationGracePeriodSeconds"] == 30 * 4 + margin
    assert pod_spec(rendered.pool("billing"))["terminationGracePeriodSeconds"] == 120  # explicit
    defaults = render()
    assert pod_spec(defaults.pool("local_ticket_system"))["terminationGracePeriodSeconds"] == 5 * 3 + margin
    assert pod_spec(defaults.component("router"))["terminationGracePeriodSeconds"] == 30
    assert pod_spec(defaults.component("beat"))["terminationGracePeriodSeconds"] == 30
    # chart-wide knobs move every computed grace period
    tuned = render(
        {
            "connectorDefaults": {"maxActionTimeoutSeconds": 60, "gracePeriodMarginSeconds": 10},
            "connectors": [{"name": "local_ticket_system"}],
        }
    )
    assert pod_spec(tuned.pool("local_ticket_system"))["terminationGracePeriodSeconds"] == 60 * 3 + 10


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_process_has_http_probes_on_its_named_metrics_port(scenario: str) -> None:
    rendered = render(scenario_values(scenario))
    for deployment in rendered.of_kind("Deployment"):
        c = container(deployment)
        assert c["ports"] == [{"name": "metrics", "containerPort": 9100, "protocol": "TCP"}]
        assert env_of(deployment)["REACH_METRICS_PORT"]["value"] == "9100"
        for probe, path in (("livenessProbe", "/healthz"), ("startupProbe", "/healthz"), ("readinessProbe", "/readyz")):
            assert c[probe]["httpGet"] == {"path": path, "port": "metrics"}, (deployment["metadata"]["name"], probe)
            assert "exec" not in c[probe]  # never `celery inspect ping`


def test_probe_port_and_timing_follow_values() -> None:
    rendered = render({"metrics": {"port": 9200}, "probes": {"liveness": {"failureThreshold": 9}}})
    router = container(rendered.component("router"))
    assert router["ports"][0]["containerPort"] == 9200
    assert router["livenessProbe"]["failureThreshold"] == 9
    assert env_of(rendered.component("router"))["REACH_METRICS_PORT"]["value"] == "9200"
    assert rendered.get("Service", "reach-agent-reach-metrics")["spec"]["ports"][0]["port"] == 9200


def test_beat_runs_exactly_one_pod_and_is_replaced_not_rolled() -> None:
    beat = render().component("beat")
    assert beat["spec"]["replicas"] == 1
    assert beat["spec"]["strategy"] == {"type": "Recreate"}
    assert container(beat)["args"] == ["beat"]
    without = render({"beat": {"enabled": False}, "connectors": []})
    assert without.names("Deployment") == ["reach-agent-reach-router", "reach-agent-reach-workflows"]


def test_beat_gets_every_pools_environment_to_check_their_connectors() -> None:
    rendered = render(scenario_values("two-connectors"))
    beat = rendered.component("beat")
    env = env_of(beat)
    # the endpoint variables and secrets the catalog reads, each once
    assert env["BILLING_TOKEN"] == env_of(rendered.pool("billing"))["BILLING_TOKEN"]
    assert [e["name"] for e in container(beat)["env"]].count("SHARED_SETTING") == 1
    assert container(beat)["envFrom"] == [{"secretRef": {"name": "billing-extra"}}]
    assert env_of(render().component("beat"))["TICKETS_URL"]["value"] == "http://ticket-system:8000"
    # the router needs none of them: connector secrets stay with the pools (and beat)
    assert "BILLING_TOKEN" not in env_of(rendered.component("router"))


def test_two_pools_giving_one_variable_different_values_cannot_share_a_beat() -> None:
    error = render_error(
        {
            "connectors": [
                {"name": "crm", "env": [{"name": "API_URL", "value": "http://crm"}]},
                {"name": "erp", "env": [{"name": "API_URL", "value": "http://erp"}]},
            ]
        }
    )
    assert "API_URL is set differently by two pools (the second is erp)" in error
    assert "set API_URL in beat.env to choose its value there" in error
    settled = render(
        {
            "beat": {"env": [{"name": "API_URL", "value": "http://crm"}]},
            "connectors": [
                {"name": "crm", "env": [{"name": "API_URL", "value": "http://crm"}]},
                {"name": "erp", "env": [{"name": "API_URL", "value": "http://erp"}]},
            ],
        }
    )
    assert [e for e in container(settled.component("beat"))["env"] if e["name"] == "API_URL"] == [
        {"name": "API_URL", "value": "http://crm"}
    ]
    # the same definition twice is fine
    same = [{"name": "API_KEY", "valueFrom": {"secretKeyRef": {"name": "keys", "key": "api"}}}]
    render({"connectors": [{"name": "crm", "env": same}, {"name": "erp", "env": same}]})


def _checksums(values: dict[str, Any]) -> dict[str, str]:
    return {
        d["metadata"]["name"]: d["spec"]["template"]["metadata"]["annotations"]["checksum/catalog"]
        for d in render(values).of_kind("Deployment")
    }


def test_changing_the_catalog_rolls_every_pod() -> None:
    catalog = chart_defaults()["catalog"]["inline"]
    before = _checksums({})
    after = _checksums({"catalog": {"inline": catalog.replace("rate_limit: 10/min", "rate_limit: 20/min")}})
    assert len(set(before.values())) == 1, "router, beat and pools see the same catalog"
    assert before.keys() == after.keys()
    assert all(before[name] != after[name] for name in before)
    assert _checksums({"router": {"replicas": 5}}) == before  # unrelated values do not roll pods


def test_an_existing_config_map_is_mounted_and_its_name_is_the_checksum() -> None:
    rendered = render(scenario_values("existing-secrets"))
    assert rendered.of_kind("ConfigMap") == []
    for deployment in rendered.of_kind("Deployment"):
        volumes = {v["name"]: v for v in pod_spec(deployment)["volumes"]}
        assert volumes["catalog"]["configMap"] == {"name": "reach-catalog"}
        mounts = {m["name"]: m for m in container(deployment)["volumeMounts"]}
        assert mounts["catalog"] == {"name": "catalog", "mountPath": "/etc/reach/catalog", "readOnly": True}
        assert env_of(deployment)["REACH_CATALOG"]["value"] == "/etc/reach/catalog/..data"
    values = scenario_values("existing-secrets")
    other = {**values, "catalog": {"existingConfigMap": "reach-catalog-v2"}}
    assert set(_checksums(values).values()) != set(_checksums(other).values())


def test_the_inline_catalog_is_rendered_into_the_mounted_config_map() -> None:
    rendered = render()
    cm = rendered.get("ConfigMap", "reach-agent-reach-catalog")
    assert cm["data"] == {"catalog.yaml": chart_defaults()["catalog"]["inline"]}
    router = rendered.component("router")
    assert {"name": "catalog", "configMap": {"name": "reach-agent-reach-catalog"}} in pod_spec(router)["volumes"]


def test_your_catalog_replaces_the_demo_catalog_instead_of_merging_with_it() -> None:
    values = scenario_values("two-connectors")
    (cm,) = render(values).of_kind("ConfigMap")
    assert cm["data"] == {"catalog.yaml": values["catalog"]["inline"]}
    assert "local_ticket_system" not in cm["data"]["catalog.yaml"]


def test_existing_secrets_are_referenced_and_never_rendered() -> None:
    values = scenario_values("existing-secrets")
    rendered = render(values)
    assert rendered.of_kind("Secret") == []
    assert "must-not-render" not in rendered.text and "broker-password" not in rendered.text
    assert "must-not-render" not in rendered.notes
    assert "redis://redis:6379/0" not in rendered.text  # the default inline URL is not used either
    for deployment in rendered.of_kind("Deployment"):
        env = env_of(deployment)
        assert env["REACH_BROKER_URL"] == {
            "name": "REACH_BROKER_URL",
            "valueFrom": {"secretKeyRef": {"name": "reach-broker", "key": "amqp-url"}},
        }
        assert env["REACH_REDIS_URL"]["valueFrom"]["secretKeyRef"] == {"name": "reach-redis", "key": "url"}
        assert env["REACH_REQUIRE_USER_ID"]["value"] == "1"
        annotations = deployment["spec"]["template"]["metadata"]["annotations"]
        assert "checksum/secret" not in annotations
    auth = rendered.get("TriggerAuthentication", "reach-agent-reach-local-ticket-system")
    assert auth["spec"]["secretTargetRef"] == [{"parameter": "host", "name": "keda-rabbitmq", "key": "host"}]
    # without keda.hostSecret KEDA reads the broker's own existing Secret
    plain = render({**values, "keda": {"hostSecret": {"name": "", "key": ""}}})
    auth = plain.get("TriggerAuthentication", "reach-agent-reach-local-ticket-system")
    assert auth["spec"]["secretTargetRef"] == [{"parameter": "host", "name": "reach-broker", "key": "amqp-url"}]


def test_inline_urls_go_into_the_charts_own_secret_and_roll_pods_when_they_change() -> None:
    rendered = render()
    secret = rendered.get("Secret", "reach-agent-reach-connections")
    decoded = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    assert decoded == {"broker-url": "amqp://guest:guest@rabbitmq:5672//", "redis-url": "redis://redis:6379/0"}
    assert "WARNING" in rendered.notes and "existingSecret" in rendered.notes

    def secret_sum(values: dict[str, Any]) -> str:
        return render(values).component("router")["spec"]["template"]["metadata"]["annotations"]["checksum/secret"]

    assert secret_sum({}) != secret_sum({"broker": {"url": "amqp://reach:other@rabbitmq:5672//"}})
    # one URL from an existing Secret, the other inline: the chart's Secret holds only the inline one
    mixed = render({"broker": {"existingSecret": "reach-broker"}})
    assert set(mixed.get("Secret", "reach-agent-reach-connections")["data"]) == {"redis-url"}


def test_disruption_budgets_cover_the_router_and_each_pool_and_select_only_their_pods() -> None:
    rendered = render(scenario_values("two-connectors"))
    pdbs = {p["metadata"]["name"]: p for p in rendered.of_kind("PodDisruptionBudget")}
    assert sorted(pdbs) == [
        "reach-agent-reach-billing",
        "reach-agent-reach-crm-system",
        "reach-agent-reach-router",
        "reach-agent-reach-workflows",
    ]
    deployments = rendered.of_kind("Deployment")
    for name, pdb in pdbs.items():
        assert pdb["spec"]["maxUnavailable"] == 1
        selector = pdb["spec"]["selector"]["matchLabels"]
        covered = [
            d["metadata"]["name"]
            for d in deployments
            if selector.items() <= d["spec"]["template"]["metadata"]["labels"].items()
        ]
        assert covered == [name]
    assert render({"podDisruptionBudget": {"enabled": False}}).of_kind("PodDisruptionBudget") == []


def test_deployment_selectors_never_overlap() -> None:
    deployments = render(scenario_values("two-connectors")).of_kind("Deployment")
    for d in deployments:
        selector = d["spec"]["selector"]["matchLabels"]
        owners = [
            o["metadata"]["name"]
            for o in deployments
            if selector.items() <= o["spec"]["template"]["metadata"]["labels"].items()
        ]
        assert owners == [d["metadata"]["name"]]


def test_the_metrics_service_and_service_monitor_reach_every_pod() -> None:
    rendered = render(scenario_values("two-connectors"))
    service = rendered.get("Service", "reach-agent-reach-metrics")
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["ports"] == [{"name": "metrics", "port": 9100, "targetPort": "metrics", "protocol": "TCP"}]
    for d in rendered.of_kind("Deployment"):
        assert service["spec"]["selector"].items() <= d["spec"]["template"]["metadata"]["labels"].items()
    (sm,) = rendered.of_kind("ServiceMonitor")
    assert sm["metadata"]["labels"]["release"] == "prometheus"
    assert sm["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert sm["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    assert sm["spec"]["endpoints"] == [
        {"port": "metrics", "path": "/metrics", "interval": "30s", "scrapeTimeout": "10s"}
    ]
    assert "agent-reach/connector" in sm["spec"]["podTargetLabels"]
    assert render().of_kind("ServiceMonitor") == []


def test_pods_run_as_the_images_non_root_user_without_an_api_token() -> None:
    for deployment in render().of_kind("Deployment"):
        spec = pod_spec(deployment)
        assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] == 10001
        assert spec["automountServiceAccountToken"] is False
        c = container(deployment)
        assert c["securityContext"]["readOnlyRootFilesystem"] is True
        assert c["securityContext"]["allowPrivilegeEscalation"] is False
        assert c["image"] == "agent-reach:0.1.0"


def test_notes_name_every_pool_and_how_it_scales() -> None:
    notes = render(scenario_values("two-connectors")).notes
    assert "reach.connector.crm_system -- KEDA: 2..20 pods, 25 ready messages per pod" in notes
    assert "reach.connector.billing -- 3 replica(s), grace period 120s" in notes
    assert "KEDA" in notes and "/metrics" in notes
