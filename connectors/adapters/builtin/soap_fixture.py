"""The conformance kit's fake SOAP service: a hand-written WSDL (document/literal, two
operations) and envelopes answered as the kit's script says, on the kit's threaded HTTP server."""

from __future__ import annotations

import re
from typing import Any
from xml.sax.saxutils import escape

from connectors.adapters.builtin.fixtures import IDEMPOTENCY_HEADER, KIT_SECRET, HttpServer, closed_port
from connectors.adapters.kit import Downstream, Fixture, KitContext, Received, Reply

NS = "urn:reach:kit"
_OPERATION = re.compile(rb"<(?:\w+:)?(KitRead|KitWrite)[\s>]")

_WSDL = """<?xml version="1.0" encoding="utf-8"?>
<definitions name="Kit" targetNamespace="{ns}" xmlns="http://schemas.xmlsoap.org/wsdl/"
    xmlns:soap="http://schemas.xmlsoap.org/wsdl/soap/" xmlns:tns="{ns}"
    xmlns:xsd="http://www.w3.org/2001/XMLSchema">
  <types>
    <xsd:schema targetNamespace="{ns}" elementFormDefault="qualified">
      <xsd:complexType name="Ask"><xsd:sequence>
        <xsd:element name="q" type="xsd:string"/>
      </xsd:sequence></xsd:complexType>
      <xsd:complexType name="Answer"><xsd:sequence>
        <xsd:element name="seen" type="xsd:string" minOccurs="0"/>
        <xsd:element name="blob" type="xsd:string" minOccurs="0"/>
        <xsd:element name="a" type="xsd:anyType" minOccurs="0"/>
      </xsd:sequence></xsd:complexType>
      <xsd:element name="KitRead" type="tns:Ask"/>
      <xsd:element name="KitReadResponse" type="tns:Answer"/>
      <xsd:element name="KitWrite" type="tns:Ask"/>
      <xsd:element name="KitWriteResponse" type="tns:Answer"/>
    </xsd:schema>
  </types>
  <message name="KitReadIn"><part name="parameters" element="tns:KitRead"/></message>
  <message name="KitReadOut"><part name="parameters" element="tns:KitReadResponse"/></message>
  <message name="KitWriteIn"><part name="parameters" element="tns:KitWrite"/></message>
  <message name="KitWriteOut"><part name="parameters" element="tns:KitWriteResponse"/></message>
  <portType name="KitPort">
    <operation name="KitRead"><input message="tns:KitReadIn"/><output message="tns:KitReadOut"/></operation>
    <operation name="KitWrite"><input message="tns:KitWriteIn"/><output message="tns:KitWriteOut"/></operation>
  </portType>
  <binding name="KitBinding" type="tns:KitPort">
    <soap:binding style="document" transport="http://schemas.xmlsoap.org/soap/http"/>
    <operation name="KitRead"><soap:operation soapAction="{ns}:KitRead"/>
      <input><soap:body use="literal"/></input><output><soap:body use="literal"/></output></operation>
    <operation name="KitWrite"><soap:operation soapAction="{ns}:KitWrite"/>
      <input><soap:body use="literal"/></input><output><soap:body use="literal"/></output></operation>
  </binding>
  <service name="KitService">
    <port name="KitPort" binding="tns:KitBinding"><soap:address location="{address}"/></port>
  </service>
</definitions>
"""

_ENVELOPE = (
    '<?xml version="1.0" encoding="utf-8"?>'
    '<soap:Envelope xmlns:soap="http://schemas.xmlsoap.org/soap/envelope/"><soap:Body>{body}</soap:Body></soap:Envelope>'
)


def _answer(operation: str, reply: Reply) -> bytes:
    if reply.kind == "huge":
        inner = "<blob>" + "x" * reply.size + "</blob>"
    elif reply.kind == "deep":
        inner = "<a>" + "<a>" * reply.depth + "1" + "</a>" * reply.depth + "</a>"
    else:
        data = reply.data if isinstance(reply.data, dict) else {}
        inner = f"<seen>{escape(str(data['seen']))}</seen>" if data.get("seen") is not None else ""
    body = f'<{operation}Response xmlns="{NS}">{inner}</{operation}Response>'
    return _ENVELOPE.format(body=body).encode()


def _fault(message: str) -> bytes:
    body = f"<soap:Fault><faultcode>soap:Server</faultcode><faultstring>{escape(message)}</faultstring></soap:Fault>"
    return _ENVELOPE.format(body=body).encode()


def soap_fixture(downstream: Downstream, context: KitContext) -> Fixture:
    """The soap type: its WSDL fetched from the fake service, bearer auth with the kit's secret."""

    def respond(received: Received, headers: Any) -> tuple[int, str, Any]:
        if headers.get("Authorization") != f"Bearer {KIT_SECRET}":
            return 401, "text/plain", b"who are you?"
        if received.text.startswith("/?wsdl\n") or received.text.startswith("/wsdl\n"):
            return 200, "text/xml", _WSDL.format(ns=NS, address=f"http://127.0.0.1:{server.port}/").encode()
        found = _OPERATION.search(received.text.encode())
        operation = found.group(1).decode() if found else "KitRead"
        reply = downstream.handle(received)
        if reply.kind == "hang":
            return 0, "", reply.seconds
        if reply.kind == "fail":
            return 500, "text/xml; charset=utf-8", _fault(reply.message)
        return 200, "text/xml; charset=utf-8", _answer(operation, reply)

    server = HttpServer(respond)

    def connector(reachable: bool, idempotency: bool) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "name": "kit",
            "type": "soap",
            "wsdl": f"http://127.0.0.1:{server.port}/?wsdl",
            "auth": {"type": "bearer", "token_env": "KIT_TOKEN"},
            "actions": [
                {
                    "action": "kit_read",
                    "description": "Read something from the kit's fake service.",
                    "operation": "KitRead",
                    "input": {"q": {"type": "string"}},
                },
                {
                    "action": "kit_write",
                    "description": "Write something to the kit's fake service.",
                    "operation": "KitWrite",
                    "permission": "write",
                    "input": {"q": {"type": "string"}},
                },
            ],
        }
        if not reachable:  # nothing listens where the WSDL and the service are
            dead = f"http://127.0.0.1:{closed_port()}"
            doc.update(wsdl=f"{dead}/?wsdl", endpoint=dead)
        if idempotency:
            doc["idempotency_header"] = IDEMPOTENCY_HEADER
        return doc

    return Fixture(connector=connector, close=server.close, secret=KIT_SECRET, environ={"KIT_TOKEN": KIT_SECRET})
