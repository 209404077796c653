"""SoapAdapter against a real spyne SOAP service (tests/integration/soap_service.py), no fleet.

A second server, ``Canned``, answers every POST with whatever status, headers and body a test sets:
the answers a real SOAP stack would never give on purpose (401, 429, an HTML 502, a DOCTYPE).
"""

from __future__ import annotations

import base64
import json
import ssl
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import trustme

from connectors.adapters.base import AdapterOptions, CallContext, Outcome
from connectors.adapters.factory import build_adapter, system_problems
from connectors.adapters.soap import SoapAdapter, wsdl_problems
from connectors.spec import ConnectorSpec
from producers.wire import ErrorCode
from tests.fleet import free_port
from tests.integration.soap_service import SoapService

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

ACTIONS: list[dict[str, Any]] = [
    {
        "action": "create_invoice",
        "operation": "CreateInvoice",
        "permission": "write",
        "idempotent": False,
        "input": {"customer": {"required": True}, "amount": {"type": "number", "required": True}},
    },
    {"action": "get_invoice", "operation": "GetInvoice", "input": {"id": {"required": True}}},
    {"action": "charge_invoice", "operation": "ChargeInvoice", "permission": "write", "input": {"id": {}}},
    {"action": "slow_write", "operation": "Sleep", "permission": "write", "input": {"seconds": {"type": "number"}}},
    {"action": "slow_read", "operation": "Sleep", "input": {"seconds": {"type": "number"}}},
    {"action": "pad", "operation": "Pad", "input": {"size": {"type": "integer"}}},
]


def connector(wsdl: str, **extra: Any) -> ConnectorSpec:
    return ConnectorSpec.model_validate({"name": "invoices", "type": "soap", "wsdl": wsdl, "actions": ACTIONS, **extra})


def call(adapter: SoapAdapter, action: str, params: dict[str, Any], **ctx: Any) -> Outcome:
    return adapter.call(adapter.connector.actions[_index(action)], params, CallContext("intent-1", **ctx))


def _index(action: str) -> int:
    return [a["action"] for a in ACTIONS].index(action)


@pytest.fixture(scope="module")
def service() -> Iterator[SoapService]:
    running = SoapService().start()
    yield running
    running.stop()


@pytest.fixture
def adapter(service: SoapService) -> Iterator[SoapAdapter]:
    built = SoapAdapter(connector(service.wsdl_url))
    built.service()  # the WSDL is loaded before a test times a call (a busy machine is slow to load it)
    yield built
    built.close()


@pytest.fixture
def local_wsdl(service: SoapService, tmp_path: Path) -> Path:
    """The service's WSDL saved as a file, its address pointing at a port where nothing listens."""
    text = httpx.get(service.wsdl_url).text.replace(service.url, f"http://127.0.0.1:{free_port()}/")
    path = tmp_path / "invoices.wsdl"
    path.write_text(text)
    return path


def test_a_created_invoice_comes_back_as_plain_json(adapter: SoapAdapter, service: SoapService) -> None:
    before = service.executions("CreateInvoice")
    outcome = call(adapter, "create_invoice", {"customer": "ACME", "amount": "12.50"})
    assert outcome.ok and outcome.sent, outcome
    data = outcome.data
    assert data["customer"] == "ACME" and data["status"] == "open" and data["id"].startswith("INV-")
    assert data["amount"] == "12.50"  # exact, not a binary float
    assert data["created_at"] == "2024-05-01T12:30:00+00:00"
    assert data["tags"] == {"string": ["new", "unpaid"]}
    assert json.loads(json.dumps(data)) == data
    assert service.executions("CreateInvoice") == before + 1
    read = call(adapter, "get_invoice", {"id": data["id"]})
    assert read.ok and read.data == data


def test_params_arrive_as_literal_text_never_as_xml(adapter: SoapAdapter) -> None:
    hostile = "</customer><amount>0</amount><![CDATA[x]]>&amp;<!--"
    created = call(adapter, "create_invoice", {"customer": hostile, "amount": 7})
    assert created.ok, created
    assert created.data["customer"] == hostile and created.data["amount"] == "7"
    assert call(adapter, "get_invoice", {"id": created.data["id"]}).data["customer"] == hostile


def test_a_field_name_maps_a_param_to_the_part_of_that_name(service: SoapService) -> None:
    actions = [
        {
            "action": "bill",
            "operation": "CreateInvoice",
            "permission": "write",
            "input": {"buyer": {"name": "customer"}, "total": {"type": "number", "name": "amount"}},
        }
    ]
    spec = ConnectorSpec.model_validate(
        {"name": "invoices", "type": "soap", "wsdl": service.wsdl_url, "actions": actions}
    )
    adapter = SoapAdapter(spec)
    try:
        outcome = adapter.call(spec.actions[0], {"buyer": "renamed", "total": 9.75}, CallContext("i"))
    finally:
        adapter.close()
    assert outcome.ok and outcome.data["customer"] == "renamed" and outcome.data["amount"] == "9.75", outcome
    assert wsdl_problems(spec) == []


def test_a_value_xml_cannot_carry_is_refused_before_sending(adapter: SoapAdapter, service: SoapService) -> None:
    sent_before = len(service.state.headers)
    outcome = call(adapter, "create_invoice", {"customer": "nul\x00byte", "amount": 1})
    assert outcome.code is ErrorCode.VALIDATION_FAILED and not outcome.sent
    assert len(service.state.headers) == sent_before


def test_a_date_time_its_time_zone_cannot_hold_is_refused_before_sending(service: SoapService) -> None:
    """9999-12-31T23:00:00-10:00 is valid, but in Asia/Tokyo it is in the year 10000: the agent's value
    (VALIDATION_FAILED, never sent, naming the param), not an adapter failure the pool retries."""
    actions = [
        {
            "action": "bill_at",
            "operation": "CreateInvoice",
            "permission": "write",
            "input": {
                "when": {"type": "datetime", "timezone": "Asia/Tokyo", "name": "customer", "required": True},
                "amount": {"type": "number", "required": True},
            },
        }
    ]
    spec = ConnectorSpec.model_validate(
        {"name": "invoices", "type": "soap", "wsdl": service.wsdl_url, "actions": actions}
    )
    adapter = SoapAdapter(spec)
    before = service.executions("CreateInvoice")
    try:
        refused = adapter.call(spec.actions[0], {"when": "9999-12-31T23:00:00-10:00", "amount": 1}, CallContext("i"))
        served = adapter.call(spec.actions[0], {"when": "2026-01-31T12:00:00Z", "amount": 1}, CallContext("j"))
    finally:
        adapter.close()
    assert refused.code is ErrorCode.VALIDATION_FAILED and not refused.sent, refused
    assert [d["field"] for d in refused.details] == ["when"] and "1-9999" in (refused.message or "")
    assert served.ok and served.data["customer"] == "2026-01-31T21:00:00+09:00", served
    assert service.executions("CreateInvoice") == before + 1


def test_a_client_fault_is_downstream_validation_failed_with_the_fault_string(adapter: SoapAdapter) -> None:
    outcome = call(adapter, "create_invoice", {"customer": "ACME", "amount": -5})
    assert outcome.code is ErrorCode.DOWNSTREAM_VALIDATION_FAILED and outcome.sent
    assert outcome.message == "amount must be greater than 0"
    assert outcome.details == [{"code": "soap_fault", "message": "soap11env:Client.InvalidAmount"}]


def test_a_server_fault_is_downstream_error(adapter: SoapAdapter, service: SoapService) -> None:
    before = service.executions("ChargeInvoice")
    outcome = call(adapter, "charge_invoice", {"id": "INV-1"})
    assert outcome.code is ErrorCode.DOWNSTREAM_ERROR and outcome.code.retryable
    assert outcome.message == "the payment backend is down"
    assert service.executions("ChargeInvoice") == before + 1


def test_a_write_that_times_out_is_outcome_unknown_and_a_read_downstream_timeout(
    adapter: SoapAdapter, service: SoapService
) -> None:
    before = service.executions("Sleep")
    write = call(adapter, "slow_write", {"seconds": 3}, timeout=0.3)
    assert write.code is ErrorCode.OUTCOME_UNKNOWN and write.sent
    assert "may have taken effect" in write.suggestion
    read = call(adapter, "slow_read", {"seconds": 3}, timeout=0.3)
    assert read.code is ErrorCode.DOWNSTREAM_TIMEOUT and read.sent
    assert 250 < read.downstream_ms < 2500  # the action's timeout, not the system's 3 s
    assert service.executions("Sleep") == before + 2


def test_a_write_is_safe_to_repeat_when_the_system_dedupes_by_idempotency_header(service: SoapService) -> None:
    deduping = SoapAdapter(connector(service.wsdl_url, idempotency_header="Idempotency-Key"))
    try:
        # the WSDL loads on the first call: load it now, so the 0.3 s below times the write alone
        assert call(deduping, "create_invoice", {"customer": "warm", "amount": 1}, idempotency_key="k-0").ok
        outcome = call(deduping, "slow_write", {"seconds": 3}, timeout=0.3, idempotency_key="k-1")
        assert outcome.code is ErrorCode.DOWNSTREAM_TIMEOUT
    finally:
        deduping.close()


def test_traceparent_and_idempotency_key_travel_as_http_headers(service: SoapService) -> None:
    deduping = SoapAdapter(connector(service.wsdl_url, idempotency_header="Idempotency-Key"))
    try:
        first = call(
            deduping,
            "create_invoice",
            {"customer": "A", "amount": 3},
            idempotency_key="key-42",
            traceparent=TRACEPARENT,
        )
        seen = service.state.headers[-1]
        again = call(deduping, "create_invoice", {"customer": "A", "amount": 3}, idempotency_key="key-42")
    finally:
        deduping.close()
    assert seen["traceparent"] == TRACEPARENT and seen["idempotency-key"] == "key-42"
    assert first.ok and again.ok and again.data["id"] == first.data["id"]  # the service deduplicated


def test_a_header_value_with_a_line_break_is_refused_before_sending(adapter: SoapAdapter, service: SoapService) -> None:
    sent_before = len(service.state.headers)
    outcome = call(adapter, "get_invoice", {"id": "x"}, traceparent="00-a\r\nX-Evil: 1")
    assert outcome.code is ErrorCode.VALIDATION_FAILED and not outcome.sent
    assert len(service.state.headers) == sent_before


def test_an_unreachable_service_is_never_sent(local_wsdl: Path, service: SoapService) -> None:
    dead = SoapAdapter(connector(str(local_wsdl)))  # the WSDL's address: a port where nothing listens
    try:
        outcome = call(dead, "create_invoice", {"customer": "A", "amount": 1})
    finally:
        dead.close()
    assert outcome.code is ErrorCode.DOWNSTREAM_UNREACHABLE and not outcome.sent
    unreachable_wsdl = SoapAdapter(connector(f"http://127.0.0.1:{free_port()}/?wsdl"))
    try:
        outcome = call(unreachable_wsdl, "get_invoice", {"id": "x"})
        assert outcome.code is ErrorCode.DOWNSTREAM_UNREACHABLE and not outcome.sent
        assert not unreachable_wsdl.probe(1.0).healthy
    finally:
        unreachable_wsdl.close()


def test_the_endpoint_overrides_the_wsdl_address(local_wsdl: Path, service: SoapService) -> None:
    overridden = SoapAdapter(connector(str(local_wsdl), endpoint=service.url))
    try:
        outcome = call(overridden, "create_invoice", {"customer": "from a local WSDL", "amount": 2})
        assert outcome.ok, outcome
        assert overridden.probe(2.0).healthy  # the address answers (a GET is refused with 405, but answered)
    finally:
        overridden.close()


def test_a_param_that_is_no_input_part_is_refused_before_sending(service: SoapService) -> None:
    actions = [
        {"action": "get_invoice", "operation": "GetInvoice", "input": {"id": {}, "verbose": {"type": "boolean"}}}
    ]
    spec = ConnectorSpec.model_validate(
        {"name": "invoices", "type": "soap", "wsdl": service.wsdl_url, "actions": actions}
    )
    adapter = SoapAdapter(spec)
    try:
        outcome = adapter.call(spec.actions[0], {"id": "x", "verbose": True}, CallContext("i"))
    finally:
        adapter.close()
    assert outcome.code is ErrorCode.VALIDATION_FAILED and not outcome.sent
    assert outcome.details[0]["field"] == "verbose"


def test_answers_too_large_or_too_deep_keep_their_success_without_the_data(service: SoapService) -> None:
    small = SoapAdapter(connector(service.wsdl_url), AdapterOptions(extra={"max_response_bytes": 50_000}))
    try:
        large = call(small, "pad", {"size": 200_000})
        assert large.ok and "larger than 50000 bytes" in large.data["_reach_omitted"]
        assert call(small, "pad", {"size": 10}).data == {"result": "x" * 10}
        created = call(small, "create_invoice", {"customer": "deep", "amount": 1})
        deep = call(small, "get_invoice", {"id": created.data["id"]}, max_depth=1)  # tags nest 3 levels
        assert deep.ok and "deeper than 1 levels" in deep.data["_reach_omitted"]
    finally:
        small.close()


def test_one_adapter_serves_many_threads_and_loads_the_wsdl_once(service: SoapService) -> None:
    shared = SoapAdapter(connector(service.wsdl_url))
    gets_before, runs_before = service.state.wsdl_gets, service.executions("CreateInvoice")
    barrier = threading.Barrier(12)
    results: dict[int, Outcome] = {}

    def create(i: int) -> None:
        barrier.wait()
        results[i] = call(shared, "create_invoice", {"customer": f"thread-{i}", "amount": i + 1})

    threads = [threading.Thread(target=create, args=(i,)) for i in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=20)
    shared.close()
    assert all(results[i].ok and results[i].data["customer"] == f"thread-{i}" for i in range(12)), results
    assert len({r.data["id"] for r in results.values()}) == 12
    assert service.executions("CreateInvoice") == runs_before + 12
    assert service.state.wsdl_gets == gets_before + 1


def test_basic_auth_guards_the_wsdl_and_the_calls(service: SoapService) -> None:
    auth = {"type": "basic", "username_env": "SOAP_USER", "password_env": "SOAP_PASSWORD"}
    spec = connector(service.wsdl_url, auth=auth)
    service.state.require = "Basic " + base64.b64encode(b"clerk:s3cret").decode()
    try:
        right = SoapAdapter(spec, AdapterOptions(environ={"SOAP_USER": "clerk", "SOAP_PASSWORD": "s3cret"}))
        assert call(right, "create_invoice", {"customer": "authorised", "amount": 1}).ok
        assert service.state.headers[-1]["authorization"] == service.state.require
        wrong = SoapAdapter(spec, AdapterOptions(environ={"SOAP_USER": "clerk", "SOAP_PASSWORD": "guess"}))
        outcome = call(wrong, "get_invoice", {"id": "x"})  # its WSDL download is refused already
        assert outcome.code is ErrorCode.DOWNSTREAM_AUTH_FAILED and not outcome.sent
        right.close()
        wrong.close()
    finally:
        service.state.require = None


def test_a_refused_call_is_downstream_auth_failed(local_wsdl: Path, service: SoapService) -> None:
    spec = connector(str(local_wsdl), endpoint=service.url, auth={"type": "bearer", "token_env": "SOAP_TOKEN"})
    service.state.require = "Bearer right"
    try:
        adapter = SoapAdapter(spec, AdapterOptions(environ={"SOAP_TOKEN": "wrong"}))
        outcome = call(adapter, "get_invoice", {"id": "x"})
        adapter.close()
    finally:
        service.state.require = None
    assert outcome.code is ErrorCode.DOWNSTREAM_AUTH_FAILED and outcome.http_status == 401 and outcome.sent
    assert service.state.headers[-1]["authorization"] == "Bearer wrong"


def test_mtls_presents_the_client_certificate(tmp_path: Path) -> None:
    ca = trustme.CA()
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server_context)
    ca.configure_trust(server_context)
    server_context.verify_mode = ssl.CERT_REQUIRED  # no client certificate, no handshake
    tls_service = SoapService(tls=server_context).start()
    client_cert = ca.issue_cert("agent-reach-client")
    client_cert.private_key_pem.write_to_path(str(tmp_path / "client.key"))
    client_cert.cert_chain_pems[0].write_to_path(str(tmp_path / "client.pem"))
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    auth = {"type": "mtls", "cert_env": "CERT", "key_env": "KEY", "ca_env": "CA"}
    environ = {
        "CERT": str(tmp_path / "client.pem"),
        "KEY": str(tmp_path / "client.key"),
        "CA": str(tmp_path / "ca.pem"),
    }
    adapter = SoapAdapter(connector(tls_service.wsdl_url, auth=auth), AdapterOptions(environ=environ))
    try:
        outcome = call(adapter, "create_invoice", {"customer": "over mtls", "amount": 1})
        assert outcome.ok, outcome
        assert adapter.probe(2.0).healthy
    finally:
        adapter.close()
        tls_service.stop()


def test_the_factory_builds_it_and_the_probe_reads_the_wsdl(service: SoapService) -> None:
    adapter = build_adapter(connector(service.wsdl_url))
    try:
        assert isinstance(adapter, SoapAdapter)
        gets = service.state.wsdl_gets
        probe = adapter.probe(2.0)
        assert probe.healthy and probe.detail == "WSDL: HTTP 200" and service.state.wsdl_gets == gets + 1
    finally:
        adapter.close()


def test_wsdl_problems_finds_misspelled_operations_unknown_params_and_missing_parts(service: SoapService) -> None:
    actions = [
        {"action": "create", "operation": "CreateInvoise", "input": {"customer": {}}},
        {"action": "read", "operation": "GetInvoice", "input": {"id": {}, "invoice_no": {}}},
        {"action": "half", "operation": "CreateInvoice", "input": {"client": {"name": "customer"}}},
        {"action": "fine", "operation": "CreateInvoice", "input": {"customer": {}, "amount": {"type": "number"}}},
    ]
    spec = ConnectorSpec.model_validate(
        {"name": "invoices", "type": "soap", "wsdl": service.wsdl_url, "actions": actions}
    )
    problems = wsdl_problems(spec)
    assert problems == [
        "action create: operation CreateInvoise is not in the WSDL (did you mean CreateInvoice?)",
        "action read: input invoice_no is not an input part of GetInvoice (its parts: id)",
        "action half: CreateInvoice requires part amount, which input lacks",
    ]
    assert system_problems(spec) == problems
    assert wsdl_problems(connector(service.wsdl_url)) == []


RPC_WSDL = """<?xml version="1.0"?>
<definitions name="Calc" targetNamespace="urn:calc" xmlns:tns="urn:calc" xmlns="http://schemas.xmlsoap.org/wsdl/"
  xmlns:soap="http://schemas.xmlsoap.org/wsdl/soap/" xmlns:xsd="http://www.w3.org/2001/XMLSchema">
  <message name="AddRequest"><part name="a" type="xsd:int"/><part name="b" type="xsd:int"/></message>
  <message name="AddResponse"><part name="sum" type="xsd:int"/></message>
  <portType name="CalcPort">
    <operation name="Add"><input message="tns:AddRequest"/><output message="tns:AddResponse"/></operation>
  </portType>
  <binding name="CalcBinding" type="tns:CalcPort">
    <soap:binding style="rpc" transport="http://schemas.xmlsoap.org/soap/http"/>
    <operation name="Add"><soap:operation soapAction="urn:calc#Add"/>
      <input><soap:body use="literal" namespace="urn:calc"/></input>
      <output><soap:body use="literal" namespace="urn:calc"/></output></operation>
  </binding>
  <service name="Calc"><port name="CalcPort" binding="tns:CalcBinding">
    <soap:address location="http://127.0.0.1:9/calc"/></port></service>
</definitions>"""


def test_rpc_style_parts_are_checked_too_and_a_missing_one_is_never_sent(tmp_path: Path) -> None:
    (tmp_path / "calc.wsdl").write_text(RPC_WSDL)
    actions = [{"action": "add", "operation": "Add", "input": {"a": {"type": "integer"}, "c": {"type": "integer"}}}]
    spec = ConnectorSpec.model_validate(
        {"name": "calc", "type": "soap", "wsdl": str(tmp_path / "calc.wsdl"), "actions": actions}
    )
    assert wsdl_problems(spec) == [
        "action add: input c is not an input part of Add (its parts: a, b)",
        "action add: Add requires part b, which input lacks",
    ]
    adapter = SoapAdapter(spec)
    try:
        outcome = adapter.call(spec.actions[0], {"a": 1}, CallContext("i"))
    finally:
        adapter.close()
    assert outcome.code is ErrorCode.VALIDATION_FAILED and not outcome.sent
    assert "Missing element b" in outcome.message


def test_a_wsdl_that_cannot_be_loaded_is_one_clear_problem(tmp_path: Path) -> None:
    missing = wsdl_problems(connector(str(tmp_path / "nowhere.wsdl")))
    assert len(missing) == 1 and "cannot be loaded" in missing[0] and "nowhere.wsdl" in missing[0]
    (tmp_path / "broken.wsdl").write_text("<definitions><unclosed></definitions>")
    broken = wsdl_problems(connector(str(tmp_path / "broken.wsdl")))
    assert len(broken) == 1 and "not a usable WSDL" in broken[0]


# -- answers no SOAP stack gives on purpose --------------------------------------------------------


class Canned(ThreadingHTTPServer):
    """Answers every POST with ``reply`` (status, headers, body)."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _CannedHandler)
        self.reply: tuple[int, dict[str, str], bytes] = (200, {}, b"")
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/"


class _CannedHandler(BaseHTTPRequestHandler):
    server: Canned

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        status, headers, body = self.server.reply
        self.send_response(status)
        for name, value in {"Content-Type": "text/xml; charset=utf-8", **headers}.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


XXE = b"""<?xml version="1.0"?>
<!DOCTYPE r [<!ENTITY leak SYSTEM "file:///etc/passwd">]>
<soap:Envelope xmlns:soap="http://schemas.xmlsoap.org/soap/envelope/"><soap:Body>
<tns:GetInvoiceResponse xmlns:tns="urn:reach:test:invoices"><tns:GetInvoiceResult>
<tns:customer>&leak;</tns:customer></tns:GetInvoiceResult></tns:GetInvoiceResponse></soap:Body></soap:Envelope>"""


@pytest.fixture(scope="module")
def canned() -> Iterator[Canned]:
    server = Canned()
    yield server
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize(
    ("status", "headers", "body", "code"),
    [
        (403, {}, b"forbidden", ErrorCode.DOWNSTREAM_AUTH_FAILED),
        (429, {"Retry-After": "2"}, b"", ErrorCode.DOWNSTREAM_RATE_LIMITED),
        (502, {"Content-Type": "text/html"}, b"<html>bad gateway</html>", ErrorCode.DOWNSTREAM_ERROR),
        (404, {"Content-Type": "text/html"}, b"<html>not here</html>", ErrorCode.DOWNSTREAM_CONTRACT_VIOLATION),
        (200, {}, XXE, ErrorCode.DOWNSTREAM_CONTRACT_VIOLATION),
        (200, {}, b"<not-closed", ErrorCode.DOWNSTREAM_CONTRACT_VIOLATION),
    ],
)
def test_answers_that_are_not_soap_map_to_error_codes(
    canned: Canned, local_wsdl: Path, status: int, headers: dict[str, str], body: bytes, code: ErrorCode
) -> None:
    canned.reply = (status, headers, body)
    adapter = SoapAdapter(connector(str(local_wsdl), endpoint=canned.url))
    try:
        outcome = call(adapter, "get_invoice", {"id": "x"})
    finally:
        adapter.close()
    assert outcome.code is code and outcome.sent, outcome
    assert "root:" not in json.dumps(outcome.data) + outcome.message  # no entity was ever expanded
    if body is XXE:
        assert "DTDForbidden" in outcome.message
    if status == 429:
        assert outcome.retry_after_ms == 2000
