"""A real SOAP 1.1 service for the soap adapter's tests, built with spyne and served on 127.0.0.1.

Operations (namespace ``urn:reach:test:invoices``):

- ``CreateInvoice(customer, amount) -> Invoice``: a write. ``amount <= 0`` raises a *Client* fault
  (``Client.InvalidAmount``); a repeated ``Idempotency-Key`` header answers the stored invoice
  without executing again.
- ``GetInvoice(id) -> Invoice``: a read; an unknown id raises ``Client.NotFound``.
- ``ChargeInvoice(id) -> str``: always raises a *Server* fault (a payment backend that is down).
- ``Sleep(seconds) -> str``: answers after ``seconds`` (timeouts).
- ``Pad(size) -> str``: answers ``size`` characters (response size bounds).

Every operation counts its executions in ``state.executions`` (by operation name); ``state.fail_next``
makes the next N calls of an operation raise a Server fault instead of executing. ``state.require``
is the ``Authorization`` header every request (the WSDL too) must carry, else 401. Every POST's
``traceparent``, ``Idempotency-Key`` and ``Authorization`` headers are kept in ``state.headers``;
``state.wsdl_gets`` counts the WSDL's downloads.

In process: ``SoapService().start()``; ``url`` is the service address, ``wsdl_url`` its WSDL.
"""

from __future__ import annotations

import logging
import ssl
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from decimal import Decimal as Dec
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from spyne import Application, ComplexModel, Fault, ServiceBase, rpc
from spyne.model.complex import Array
from spyne.model.primitive import DateTime, Decimal, Double, Integer, Unicode
from spyne.protocol.soap import Soap11
from spyne.server.wsgi import WsgiApplication

NAMESPACE = "urn:reach:test:invoices"


class Invoice(ComplexModel):
    __namespace__ = NAMESPACE
    id = Unicode
    customer = Unicode
    amount = Decimal
    status = Unicode
    created_at = DateTime
    tags = Array(Unicode)


class ServiceState:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.executions: Counter[str] = Counter()
        self.invoices: dict[str, Invoice] = {}
        self.by_key: dict[str, str] = {}
        self.fail_next: Counter[str] = Counter()
        self.headers: list[dict[str, str | None]] = []
        self.require: str | None = None
        self.wsdl_gets = 0

    def execute(self, operation: str) -> None:
        """Count one execution of ``operation``, or raise the Server fault ``fail_next`` asks for."""
        with self.lock:
            if self.fail_next[operation] > 0:
                self.fail_next[operation] -= 1
                fail = True
            else:
                fail = False
            self.executions[operation] += 1
        if fail:
            raise Fault(faultcode="Server", faultstring=f"{operation} failed: injected server fault")


def _state(ctx: Any) -> ServiceState:
    state: ServiceState = ctx.app.state
    return state


class InvoiceService(ServiceBase):
    @rpc(Unicode(min_occurs=1), Decimal(min_occurs=1), _returns=Invoice)
    def CreateInvoice(ctx: Any, customer: str, amount: Dec) -> Invoice:
        state = _state(ctx)
        if amount is None or amount <= 0:
            raise Fault(faultcode="Client.InvalidAmount", faultstring="amount must be greater than 0")
        key = ctx.transport.req_env.get("HTTP_IDEMPOTENCY_KEY")
        with state.lock:
            if key and key in state.by_key:
                return state.invoices[state.by_key[key]]
        state.execute("CreateInvoice")
        with state.lock:
            invoice = Invoice(
                id=f"INV-{len(state.invoices) + 1:05d}",
                customer=customer,
                amount=amount,
                status="open",
                created_at=datetime(2024, 5, 1, 12, 30, tzinfo=UTC),
                tags=["new", "unpaid"],
            )
            state.invoices[invoice.id] = invoice
            if key:
                state.by_key[key] = invoice.id
        return invoice

    @rpc(Unicode(min_occurs=1), _returns=Invoice)
    def GetInvoice(ctx: Any, id: str) -> Invoice:
        state = _state(ctx)
        state.execute("GetInvoice")
        with state.lock:
            invoice = state.invoices.get(id)
        if invoice is None:
            raise Fault(faultcode="Client.NotFound", faultstring=f"no invoice {id}")
        return invoice

    @rpc(Unicode(min_occurs=1), _returns=Unicode)
    def ChargeInvoice(ctx: Any, id: str) -> str:
        _state(ctx).execute("ChargeInvoice")
        raise Fault(faultcode="Server", faultstring="the payment backend is down")

    @rpc(Double(min_occurs=1), _returns=Unicode)
    def Sleep(ctx: Any, seconds: float) -> str:
        _state(ctx).execute("Sleep")
        time.sleep(min(seconds, 30.0))
        return "slept"

    @rpc(Integer(min_occurs=1), _returns=Unicode)
    def Pad(ctx: Any, size: int) -> str:
        _state(ctx).execute("Pad")
        return "x" * min(size, 10_000_000)


class _Threading(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    request_queue_size = 64  # a burst of concurrent calls must not wait for SYN retries


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass


StartResponse = Callable[[str, list[tuple[str, str]]], Any]


class SoapService:
    """The spyne service on a free port of 127.0.0.1, in a thread of this process.

    ``tls``: a server-side SSL context (https, e.g. requiring a client certificate for mtls).
    """

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        app = Application(
            [InvoiceService],
            tns=NAMESPACE,
            in_protocol=Soap11(validator="lxml"),
            out_protocol=Soap11(),
        )
        logging.getLogger("spyne").setLevel(logging.CRITICAL)  # every fault raised on purpose is logged as an error
        self.state = ServiceState()
        app.state = self.state
        self._wsgi = WsgiApplication(app)
        self._server = make_server("127.0.0.1", 0, self._guard, server_class=_Threading, handler_class=_QuietHandler)
        self._scheme = "http"
        if tls is not None:
            self._server.socket = tls.wrap_socket(self._server.socket, server_side=True)
            self._scheme = "https"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True, name="soap-service")

    def _guard(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        state = self.state
        if environ.get("REQUEST_METHOD") == "GET" and "wsdl" in environ.get("QUERY_STRING", "").lower():
            with state.lock:
                state.wsdl_gets += 1
        if environ.get("REQUEST_METHOD") == "POST":
            with state.lock:
                state.headers.append(
                    {
                        "traceparent": environ.get("HTTP_TRACEPARENT"),
                        "idempotency-key": environ.get("HTTP_IDEMPOTENCY_KEY"),
                        "authorization": environ.get("HTTP_AUTHORIZATION"),
                    }
                )
        if state.require is not None and environ.get("HTTP_AUTHORIZATION") != state.require:
            start_response("401 Unauthorized", [("Content-Type", "text/plain"), ("WWW-Authenticate", "Basic")])
            return [b"unauthorized"]
        result: Iterable[bytes] = self._wsgi(environ, start_response)
        return result

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return f"{self._scheme}://127.0.0.1:{self.port}/"

    @property
    def wsdl_url(self) -> str:
        return f"{self.url}?wsdl"

    def executions(self, operation: str) -> int:
        with self.state.lock:
            return self.state.executions[operation]

    def start(self) -> SoapService:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
