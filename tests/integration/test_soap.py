"""A SOAP connector through the real fleet: router, pool and the spyne service of soap_service.py.

``invoices_soap`` reads the service's WSDL by URL and retries up to three times; ``payments_soap``
has a breaker of fail_max 3 that stays open for 30 s. Downstream executions are counted by the
service itself, so a test proves what really ran there, not only what a receipt says.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import redis

from producers.client import ReachClient
from tests.fleet import BROKER_URL, REDIS_URL, Fleet
from tests.integration.soap_service import SoapService
from workers.state import keys

RUN = uuid.uuid4().hex[:6]
AGENT = f"soap_{RUN}"
ATTEMPTS = 3

CATALOG = """
connector:
  name: invoices_soap
  type: soap
  wsdl: {wsdl}
  retry: {{ max_attempts: 3, initial_backoff: 50ms, max_backoff: 200ms }}
  pool: {{ concurrency: 4 }}
  actions:
    - action: create_invoice
      operation: CreateInvoice
      input:
        customer: {{ type: string, required: true }}
        amount: {{ type: number, required: true }}
      permission: write
      idempotent: false
      timeout: 5s
    - action: get_invoice
      operation: GetInvoice
      input:
        id: {{ type: string, required: true }}
      permission: read
      timeout: 5s
---
connector:
  name: payments_soap
  type: soap
  wsdl: {wsdl}
  breaker: {{ fail_max: 3, reset_timeout: 30s }}
  actions:
    - action: charge_invoice
      operation: ChargeInvoice
      input:
        id: {{ type: string, required: true }}
      permission: write
      timeout: 5s
---
agent_app:
  name: {agent}
  connector_bindings:
    - connector: invoices_soap
      allowed_actions: ["*"]
    - connector: payments_soap
      allowed_actions: ["*"]
"""
CONNECTORS = ["invoices_soap", "payments_soap"]


@pytest.fixture(scope="module")
def service() -> Iterator[SoapService]:
    running = SoapService().start()
    yield running
    running.stop()


@pytest.fixture(scope="module")
def fleet(service: SoapService) -> Iterator[Fleet]:
    client = redis.Redis.from_url(REDIS_URL)
    for name in CONNECTORS:  # this Redis database may hold an earlier run's breaker
        client.delete(keys.breaker(name), keys.health(name))
    with Fleet(CATALOG.format(wsdl=service.wsdl_url, agent=AGENT), CONNECTORS) as running:
        yield running


@pytest.fixture
def reach(fleet: Fleet) -> Iterator[ReachClient]:
    with ReachClient(AGENT, BROKER_URL, reply_to=f"{AGENT}.{uuid.uuid4().hex[:8]}", drop_duplicates=False) as client:
        yield client


def test_a_created_invoice_comes_back_in_the_receipt(reach: ReachClient, service: SoapService) -> None:
    before = service.executions("CreateInvoice")
    receipt = reach.call("invoices_soap.create_invoice", {"customer": f"{RUN} ACME", "amount": 12.5}, timeout=30)
    assert receipt.status == "succeeded" and receipt.success, receipt
    assert receipt.data["customer"] == f"{RUN} ACME" and receipt.data["amount"] == "12.5"
    assert receipt.data["status"] == "open" and receipt.data["created_at"] == "2024-05-01T12:30:00+00:00"
    assert receipt.execution.attempts == 1
    assert service.executions("CreateInvoice") == before + 1
    read = reach.call("invoices_soap.get_invoice", {"id": receipt.data["id"]}, timeout=30)
    assert read.success and read.data == receipt.data


def test_a_client_fault_is_a_validation_receipt_with_the_systems_words(reach: ReachClient) -> None:
    receipt = reach.call("invoices_soap.create_invoice", {"customer": "ACME", "amount": -5}, timeout=30)
    assert receipt.status == "failed" and receipt.error is not None, receipt
    assert receipt.error.code == "DOWNSTREAM_VALIDATION_FAILED" and receipt.error.retryable is False
    assert receipt.error.message == "amount must be greater than 0"
    assert receipt.execution.attempts == 1


def test_a_server_fault_is_retried_for_a_read_and_not_for_a_write(reach: ReachClient, service: SoapService) -> None:
    created = reach.call("invoices_soap.create_invoice", {"customer": f"{RUN} retry", "amount": 3}, timeout=30)
    assert created.success, created
    reads, writes = service.executions("GetInvoice"), service.executions("CreateInvoice")
    service.state.fail_next["GetInvoice"] = 2
    read = reach.call("invoices_soap.get_invoice", {"id": created.data["id"]}, timeout=30)
    assert read.success and read.execution.attempts == ATTEMPTS, read
    assert service.executions("GetInvoice") == reads + ATTEMPTS

    service.state.fail_next["CreateInvoice"] = 1
    write = reach.call("invoices_soap.create_invoice", {"customer": f"{RUN} once", "amount": 3}, timeout=30)
    assert write.status == "failed" and write.error.code == "DOWNSTREAM_ERROR", write
    assert write.execution.attempts == 1  # not idempotent: a second call could create a second invoice
    assert service.executions("CreateInvoice") == writes + 1


def test_the_same_idempotency_key_runs_once_and_answers_the_same_receipt(
    reach: ReachClient, service: SoapService
) -> None:
    before = service.executions("CreateInvoice")
    params = {"customer": f"{RUN} once only", "amount": 42}
    first = reach.call("invoices_soap.create_invoice", params, idempotency_key=f"inv-{RUN}", timeout=30)
    second = reach.call("invoices_soap.create_invoice", params, idempotency_key=f"inv-{RUN}", timeout=30)
    assert first.success and second.success, (first, second)
    assert second.execution.deduplicated and not first.execution.deduplicated
    assert second.data == first.data and second.intent_id != first.intent_id
    assert service.executions("CreateInvoice") == before + 1


def test_repeated_server_faults_open_the_breaker(reach: ReachClient, service: SoapService) -> None:
    before = service.executions("ChargeInvoice")
    for n in range(3):
        receipt = reach.call("payments_soap.charge_invoice", {"id": f"INV-{n}"}, timeout=30)
        assert receipt.error is not None and receipt.error.code == "DOWNSTREAM_ERROR", receipt
        assert receipt.error.message == "the payment backend is down"
    refused = reach.call("payments_soap.charge_invoice", {"id": "INV-4"}, timeout=30)
    assert refused.status == "rejected" and refused.error.code == "CONNECTOR_UNAVAILABLE", refused
    assert refused.error.retryable and refused.error.retry_after_ms
    assert service.executions("ChargeInvoice") == before + 3
