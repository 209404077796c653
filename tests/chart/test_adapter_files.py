"""Adapter files in the chart (`files:`): client certificates and WSDL documents mounted read-only
from Secrets and ConfigMaps into the pools that use them and into beat, with the variables the
catalog reads (cert_env, key_env, ca_env, `wsdl: ${VAR}`) pointing at them; the router, the MCP
facade and the console load the catalog too, so they get the variables but no files."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import trustme

from connectors.adapters.auth import ssl_context
from connectors.adapters.base import AdapterOptions
from connectors.adapters.soap import SoapAdapter
from connectors.catalog import load_catalog
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

CATALOG = """
connector:
  name: ledger
  type: soap
  wsdl: ${LEDGER_WSDL}
  auth: { type: mtls, cert_env: LEDGER_CERT, key_env: LEDGER_KEY, ca_env: LEDGER_CA }
  actions:
    - action: post_entry
      description: Post a ledger entry
      operation: PostEntry
      input:
        amount: { type: number, required: true }
      permission: write
      timeout: 10s
---
connector:
  name: wiki
  endpoint: http://wiki.internal
  actions:
    - action: search
      description: Search the wiki
      path: GET /search
      input:
        q: { type: string, required: true }
      permission: read
---
agent_app:
  name: finance_bot
  connector_bindings:
    - connector: ledger
      allowed_actions: [post_entry]
    - connector: wiki
      allowed_actions: [search]
"""

# the ledger's service as its WSDL describes it: PostEntry(amount)
LEDGER_WSDL = """<?xml version="1.0"?>
<definitions name="Ledger" targetNamespace="urn:ledger" xmlns:tns="urn:ledger" xmlns="http://schemas.xmlsoap.org/wsdl/"
  xmlns:soap="http://schemas.xmlsoap.org/wsdl/soap/" xmlns:xsd="http://www.w3.org/2001/XMLSchema">
  <message name="PostEntryRequest"><part name="amount" type="xsd:decimal"/></message>
  <message name="PostEntryResponse"><part name="entry_id" type="xsd:string"/></message>
  <portType name="LedgerPort">
    <operation name="PostEntry"><input message="tns:PostEntryRequest"/><output message="tns:PostEntryResponse"/></operation>
  </portType>
  <binding name="LedgerBinding" type="tns:LedgerPort">
    <soap:binding style="rpc" transport="http://schemas.xmlsoap.org/soap/http"/>
    <operation name="PostEntry"><soap:operation soapAction="urn:ledger#PostEntry"/>
      <input><soap:body use="literal" namespace="urn:ledger"/></input>
      <output><soap:body use="literal" namespace="urn:ledger"/></output></operation>
  </binding>
  <service name="Ledger"><port name="LedgerPort" binding="tns:LedgerBinding">
    <soap:address location="https://ledger.internal/soap"/></port></service>
</definitions>"""

TLS: dict[str, Any] = {
    "name": "ledger-tls",
    "secret": "ledger-client-cert",
    "env": {"LEDGER_CERT": "tls.crt", "LEDGER_KEY": "tls.key"},
}
CA: dict[str, Any] = {
    "name": "ledger-ca",
    "configMap": "ledger-ca",
    "mountPath": "/etc/ledger/ca",
    "env": {"LEDGER_CA": "ca.crt"},
}
WSDL: dict[str, Any] = {"name": "ledger-wsdl", "configMap": "ledger-wsdl", "env": {"LEDGER_WSDL": "ledger.wsdl"}}


def values(ledger_files: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "broker": {"url": "amqp://reach:pw@rabbitmq:5672//"},
        "redis": {"url": "redis://redis:6379/0"},
        "catalog": {"inline": CATALOG},
        "connectors": [{"name": "ledger", "files": ledger_files}, {"name": "wiki"}],
    }
    out.update(extra)
    return out


def mounts(deployment: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["name"]: m for m in container(deployment).get("volumeMounts", [])}


def volumes(deployment: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in pod_spec(deployment)["volumes"]}


def test_the_pool_mounts_its_files_read_only_and_points_the_catalogs_variables_at_them() -> None:
    rendered = render(values([TLS, CA, WSDL]))
    pool = rendered.pool("ledger")
    assert volumes(pool)["file-ledger-tls"]["secret"] == {"secretName": "ledger-client-cert", "defaultMode": 0o440}
    assert volumes(pool)["file-ledger-ca"]["configMap"] == {"name": "ledger-ca", "defaultMode": 0o444}
    assert mounts(pool)["file-ledger-tls"] == {
        "name": "file-ledger-tls",
        "mountPath": "/etc/agent-reach/files/ledger-tls",
        "readOnly": True,
    }
    assert mounts(pool)["file-ledger-ca"]["mountPath"] == "/etc/ledger/ca"
    env = env_of(pool)
    assert env["LEDGER_CERT"]["value"] == "/etc/agent-reach/files/ledger-tls/tls.crt"
    assert env["LEDGER_KEY"]["value"] == "/etc/agent-reach/files/ledger-tls/tls.key"
    assert env["LEDGER_CA"]["value"] == "/etc/ledger/ca/ca.crt"
    assert env["LEDGER_WSDL"]["value"] == "/etc/agent-reach/files/ledger-wsdl/ledger.wsdl"
    # the catalog and /tmp stay mounted next to them
    assert {"catalog", "tmp"} <= set(mounts(pool))
    # another pool gets none of them
    wiki = rendered.pool("wiki")
    assert not [name for name in mounts(wiki) if name.startswith("file-")]
    assert "LEDGER_CERT" not in env_of(wiki)


def test_beat_mounts_every_pools_files_because_it_health_checks_every_connector() -> None:
    beat = render(values([TLS, WSDL])).component("beat")
    assert {"file-ledger-tls", "file-ledger-wsdl"} <= set(mounts(beat))
    assert env_of(beat)["LEDGER_CERT"]["value"] == "/etc/agent-reach/files/ledger-tls/tls.crt"


def test_the_router_gets_the_paths_so_the_catalog_loads_but_neither_files_nor_secrets() -> None:
    router = render(values([TLS, WSDL])).component("router")
    assert env_of(router)["LEDGER_WSDL"]["value"] == "/etc/agent-reach/files/ledger-wsdl/ledger.wsdl"
    assert not [name for name in mounts(router) if name.startswith("file-")]


def test_the_console_gets_the_paths_so_the_catalog_loads_but_neither_files_nor_secrets() -> None:
    console = {"enabled": True, "users": {"existingSecret": "reach-console-users"}}
    deployment = render(values([TLS, CA, WSDL], console=console)).component("console")
    env = env_of(deployment)
    assert env["LEDGER_WSDL"]["value"] == "/etc/agent-reach/files/ledger-wsdl/ledger.wsdl"
    assert env["LEDGER_CERT"]["value"] == "/etc/agent-reach/files/ledger-tls/tls.crt"
    assert env["LEDGER_CA"]["value"] == "/etc/ledger/ca/ca.crt"
    assert not [name for name in mounts(deployment) if name.startswith("file-")]
    assert not [name for name in volumes(deployment) if name.startswith("file-")]


def test_the_mcp_facade_gets_the_paths_so_the_catalog_loads_but_neither_files_nor_secrets() -> None:
    deployment = render(values([TLS, CA, WSDL], mcp=scenario_values("mcp")["mcp"])).component("mcp")
    env = env_of(deployment)
    assert env["LEDGER_WSDL"]["value"] == "/etc/agent-reach/files/ledger-wsdl/ledger.wsdl"
    assert env["LEDGER_KEY"]["value"] == "/etc/agent-reach/files/ledger-tls/tls.key"
    assert env["LEDGER_CA"]["value"] == "/etc/ledger/ca/ca.crt"
    assert not [name for name in mounts(deployment) if name.startswith("file-")]
    assert not [name for name in volumes(deployment) if name.startswith("file-")]


def test_defaults_apply_to_every_pool_and_a_pools_own_entry_wins_by_name() -> None:
    shared_ca = {"name": "corp-ca", "configMap": "corp-ca", "env": {"CORP_CA": "ca.crt"}}
    own_ca = {"name": "corp-ca", "configMap": "ledger-only-ca", "mountPath": "/etc/ledger/corp-ca"}
    # beat mounts every pool's files in one pod, so an override by name needs beat elsewhere
    given = values([own_ca], connectorDefaults={"files": [shared_ca]})
    assert '"corp-ca" is declared differently by two pools' in render_error(given)
    rendered = render(given | {"beat": {"enabled": False}})
    assert volumes(rendered.pool("wiki"))["file-corp-ca"]["configMap"]["name"] == "corp-ca"
    assert env_of(rendered.pool("wiki"))["CORP_CA"]["value"] == "/etc/agent-reach/files/corp-ca/ca.crt"
    assert volumes(rendered.pool("ledger"))["file-corp-ca"]["configMap"]["name"] == "ledger-only-ca"
    assert "CORP_CA" not in env_of(rendered.pool("ledger"))


def test_a_pool_group_mounts_the_files_of_its_entry() -> None:
    rendered = render(
        values([], connectors=[], poolGroups=[{"name": "finance", "connectors": ["ledger", "wiki"], "files": [TLS]}])
    )
    group = rendered.get("Deployment", "reach-agent-reach-group-finance")
    assert mounts(group)["file-ledger-tls"]["readOnly"] is True
    assert env_of(group)["LEDGER_KEY"]["value"] == "/etc/agent-reach/files/ledger-tls/tls.key"


def test_the_rendered_objects_are_valid_kubernetes_and_lint_is_clean() -> None:
    given = values([TLS, CA, WSDL])
    report = lint(given)
    assert [m for m in report["messages"] if m["severity"] >= 2] == [] and report["errors"] == []
    for obj in render(given).objects:
        if (obj["apiVersion"], obj["kind"]) not in CRDS:
            kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)


def test_the_mounted_layout_is_what_the_mtls_auth_and_the_soap_adapter_read(tmp_path: Path) -> None:
    """The paths the chart sets are the ones the pool opens: lay real certificates and the WSDL
    out as the Secret and ConfigMap mounts would, then build the pool's TLS context and load the
    WSDL through the SOAP adapter from the rendered environment."""
    ca = trustme.CA()
    cert = ca.issue_cert("ledger.internal")
    tls, wsdl = tmp_path / "ledger-tls", tmp_path / "ledger-wsdl"
    tls.mkdir()
    wsdl.mkdir()
    cert.cert_chain_pems[0].write_to_path(str(tls / "tls.crt"))
    cert.private_key_pem.write_to_path(str(tls / "tls.key"))
    ca.cert_pem.write_to_path(str(tls / "ca.crt"))
    (wsdl / "ledger.wsdl").write_text(LEDGER_WSDL)
    files = [
        {**TLS, "mountPath": str(tls), "env": {**TLS["env"], "LEDGER_CA": "ca.crt"}},
        {**WSDL, "mountPath": str(wsdl)},
    ]
    env = {name: e["value"] for name, e in env_of(render(values(files)).pool("ledger")).items() if "value" in e}
    (tmp_path / "catalog").mkdir()
    (tmp_path / "catalog" / "ledger.yaml").write_text(CATALOG)
    ledger = load_catalog(tmp_path / "catalog", environ=env).connectors["ledger"]
    assert ledger.auth is not None
    context = ssl_context(ledger.auth, "ledger", env)
    assert context.verify_mode.name == "CERT_REQUIRED"
    adapter = SoapAdapter(ledger, AdapterOptions(max_connections=1, environ=env))
    try:
        service = adapter.service()  # reads the file at the mounted path (WsdlError if it is not there)
    finally:
        adapter.close()
    assert list(service.operations) == ["PostEntry"] and service.address == "https://ledger.internal/soap"


@pytest.mark.parametrize(
    "files, message",
    [
        ([{**TLS, "mountPath": "/tmp"}], "/tmp"),
        ([TLS, {**WSDL, "mountPath": "/etc/agent-reach/files/ledger-tls"}], "both mounted at"),
    ],
)
def test_colliding_mount_paths_are_refused_with_the_entry_named(files: list[dict[str, Any]], message: str) -> None:
    assert message in render_error(values(files))


def test_an_entry_with_both_a_secret_and_a_configmap_or_neither_is_refused_by_the_schema() -> None:
    both = copy.deepcopy(TLS) | {"configMap": "x"}
    neither = {"name": "empty", "env": {"X": "y"}}
    assert "files" in render_error(values([both]))
    assert "files" in render_error(values([neither]))


def test_a_variable_set_both_in_env_and_by_a_file_is_refused() -> None:
    given = values([TLS])
    given["connectors"][0]["env"] = [{"name": "LEDGER_CERT", "value": "/elsewhere"}]
    assert "LEDGER_CERT is set both in env and by files[ledger-tls].env" in render_error(given)


def test_two_pools_declaring_one_file_name_differently_are_refused_because_beat_mounts_both() -> None:
    given = values([TLS])
    given["connectors"][1]["files"] = [{**TLS, "secret": "another-secret"}]
    assert '"ledger-tls" is declared differently by two pools' in render_error(given)
