"""Hostile input through a running fleet (docs/contract.md section 4, limits against hostile input).

Nothing a message contains may crash, stall or loop the router, fill a store without bound, or put
a sensitive value where it is kept. Each test sends its hostile message(s) to a real router and
pool, then looks from outside: the router's PID and RSS in /proc, its /metrics, the queues
(``rabbitmqctl`` and passive declares), every receipt on ``reach.receipts`` (a tap bound with
``#``), the dead letters in ``reach.dlq``, the bytes of its Redis database and what reached the downstream
(``CountingSystem``). After each one, an intent from *another* agent must still be answered
within 10 s.

Messages with hostile AMQP properties are sent as hand-built frames (``hostile_gen.RawSender``):
py-amqp and pika refuse to encode them, RabbitMQ stores and delivers them.

The generated run (``run_generator``) also holds half-open sockets against the router's /metrics
and probes during each batch, and after each batch sends what must each get exactly one receipt
(``side_checks``): resends of a waiting approval's intent id, approved afterwards, and NULs and odd
code points for a SQL connector on a real PostgreSQL. tests/integration/test_hostile_generated.py
drives the same fleet with Hypothesis (strategies in hostile_strategies.py), shrinking what fails.

Before each test the fleet is brought back to a known state: a dead process is restarted, a
router that no longer answers (stuck on a poison message) is killed and restarted, and
``reach.intents`` and ``reach.dlq`` are purged, so one failure does not cascade into the next test.
``RESTARTS`` lists what had to be revived (printed at the end of the module).
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis

from producers.client import ReachClient
from tests.fleet import BROKER_URL, REDIS_URL, Fleet, agent, purge, queue_depth
from tests.integration.counting_system import CountingSystem
from tests.integration.hostile_gen import (
    DeadLetter,
    Generator,
    Limits,
    PeakRss,
    RawSender,
    ReceiptTap,
    SideGenerator,
    TapReceipt,
    bz2_bomb,
    close_all,
    cpu_seconds,
    dumps,
    fv,
    half_open,
    intent,
    metric_sum,
    nested_json,
    nested_table,
    peek_queue,
    properties,
    rabbit_queues,
    regex_fields_yaml,
    sha256_hex,
    table,
    unknown_params,
    vhost,
    wait_until,
)
from tests.integration.postgres import SHOP_SCHEMA, PostgresServer, serve
from workers.ops import approval_decisions as approvals
from workers.state import keys

RUN = uuid.uuid4().hex[:6]
# agent names follow the v2 rule ^[a-z][a-z0-9_]{0,62}$
AGENT = f"hx_{RUN}"  # sends the hostile intents
BYSTANDER = f"hb_{RUN}"  # must still be served while (and after) the hostile ones are handled
GEN_AGENT = f"hg_{RUN}"  # the generator's identity, so its flood costs nobody else
SIDE_AGENT = f"hs_{RUN}"  # approval resends and odd SQL values: not behind the flood's invalid allowance
CONNECTOR = "hostile_sys"
CREATE, READ = f"{CONNECTOR}.create_item", f"{CONNECTOR}.get_item"
REFUND, REFUND_OVER = f"{CONNECTOR}.refund", 500  # waits for a person's approval above 500
REGISTER = f"{CONNECTOR}.register"  # every field a backtracking pattern (hostile_gen.REGEX_FIELDS)
SQL_CONNECTOR = "hostile_sql"
SQL_ADD = f"{SQL_CONNECTOR}.add_item"
APPROVER = "alice"
INTENTS, DLQ = "reach.intents", "reach.dlq"
VHOST = vhost(BROKER_URL)
MIB = 1 << 20

MAX_DEPTH, MAX_DETAILS, MAX_RECEIPT_BYTES, MAX_INTENT_BYTES = 32, 50, 1 * MIB, 256 * 1024  # the defaults
ROUTER_RSS_LIMIT = 250 * 1000 * 1000

CATALOG = """
connector:
  name: hostile_sys
  endpoint: {url}
  actions:
    - action: create_item
      path: POST /items
      input:
        title: {{ type: string, required: true }}
        token: {{ type: string, sensitive: true, description: an API token of the agent's user }}
        extra: {{ type: object, description: free-form attributes }}
        tags: {{ type: array, items: {{ type: string }} }}
        code: {{ type: string, pattern: '^([a-zA-Z0-9]+\\s?)*$', description: a vendor's backtracking pattern }}
      permission: write
      idempotent: false
    - action: get_item
      path: GET /items/{{item_id}}
      input:
        item_id: {{ type: string, required: true }}
      permission: read
      idempotent: true
    - action: refund
      path: POST /refunds
      input:
        title: {{ type: string, required: true }}
        amount: {{ type: number, required: true }}
      permission: write
      idempotent: false
      approval:
        when: "amount > 500"
        approvers: [finance]
    - action: register
      path: POST /register
      description: a regex-heavy form (hostile_gen.REGEX_FIELDS), for the generated run
      input:
        title: {{ type: string, required: true }}
{regex_fields}      permission: write
      idempotent: false
---
connector:
  name: hostile_sql
  type: sql
  dsn_env: HOSTILE_DSN
  pool: {{ concurrency: 2 }}
  breaker: {{ fail_max: 2, reset_timeout: 30s }}
  retry: {{ max_attempts: 3, initial_backoff: 50ms, max_backoff: 100ms }}
  actions:
    - action: add_item
      procedure: shop.add_item
      input: {{ title: {{ type: string, required: true }} }}
      permission: write
      idempotent: false
      timeout: 5s
---
approvers:
  finance: [alice]
""" + "".join(
    f"""---
agent_app:
  name: {name}
  connector_bindings:
    - connector: hostile_sys
      allowed_actions: ["*"]
    - connector: hostile_sql
      allowed_actions: ["*"]
"""
    for name in (AGENT, BYSTANDER, GEN_AGENT, SIDE_AGENT)
)


def catalog(url: str) -> str:
    return CATALOG.format(url=url, regex_fields=regex_fields_yaml())


RESTARTS: list[str] = []


# --------------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def system() -> Iterator[CountingSystem]:
    downstream = CountingSystem().start()
    yield downstream
    downstream.stop()


@pytest.fixture(scope="module")
def pg() -> Iterator[PostgresServer]:
    """The SQL system the generator sends NULs and odd code points to."""
    yield from serve(SHOP_SCHEMA, "shop")


@pytest.fixture(scope="module")
def fleet(system: CountingSystem, pg: PostgresServer) -> Iterator[Fleet]:
    redis.Redis.from_url(REDIS_URL).delete(keys.breaker(SQL_CONNECTOR), keys.health(SQL_CONNECTOR))
    with Fleet(catalog(system.url), [CONNECTOR, SQL_CONNECTOR], env={"HOSTILE_DSN": pg.dsn}) as running:
        yield running
    if RESTARTS:
        print(f"\nhostile tests had to revive the fleet {len(RESTARTS)} time(s): {'; '.join(RESTARTS)}")


@pytest.fixture(scope="module")
def tap(fleet: Fleet) -> Iterator[ReceiptTap]:
    receipts = ReceiptTap(BROKER_URL)
    yield receipts
    receipts.close()


@pytest.fixture(scope="module")
def redis_client() -> redis.Redis:
    return redis.Redis.from_url(REDIS_URL)


@pytest.fixture(autouse=True)
def known_state(request: pytest.FixtureRequest, fleet: Fleet, system: CountingSystem) -> None:
    """A live, answering fleet with empty reach.intents and reach.dlq, whatever the last test left."""
    ready(fleet, request.node.name)
    system.state.reset()


def ready(fleet: Fleet, why: str) -> None:
    for name, proc in list(fleet.procs.items()):
        if proc.poll() is not None:
            RESTARTS.append(f"before {why}: {name} had exited with {proc.returncode}")
            restart(fleet, name)
    purge(INTENTS, DLQ)
    stuck = wait_until(lambda: intents_left() == 0, 3, every=0.5) is False  # a loop holds its message unacked
    if stuck or probe(timeout=10) is None:
        RESTARTS.append(
            f"before {why}: the router "
            + ("kept messages unacked" if stuck else "did not answer")
            + "; killed and restarted"
        )
        restart(fleet, "router")
        if probe(timeout=60) is None:
            pytest.fail(f"the router does not answer even after a restart: {fleet.log('router')[-2000:]}")
    purge(DLQ)


def restart(fleet: Fleet, name: str) -> None:
    if name in fleet.procs:
        fleet.kill_process(name)
    purge(INTENTS)  # the poison message that killed it would kill the next one too
    fleet.start_process(name, ["router"] if name == "router" else ["worker", name])
    if name != "router":
        fleet.wait_consuming(f"reach.connector.{name}")


# ---------------------------------------------------------------------------------------- helpers


def probe(timeout: float = 10.0) -> Any:
    """A normal intent from another agent, through router and pool; its receipt, or None if none came."""
    try:
        with agent(BYSTANDER) as client:
            return client.call(READ, {"item_id": f"probe-{uuid.uuid4().hex[:8]}"}, timeout=timeout)
    except TimeoutError:
        return None


def assert_bystander_served() -> None:
    receipt = probe(timeout=10)
    assert receipt is not None, "an intent from another agent got no receipt within 10 s"
    assert receipt.status == "succeeded", f"an intent from another agent was not served: {receipt}"


def pids(fleet: Fleet) -> dict[str, int]:
    return {name: proc.pid for name, proc in fleet.procs.items()}


def assert_alive(fleet: Fleet, before: dict[str, int]) -> None:
    for name, pid in before.items():
        proc = fleet.procs.get(name)
        alive = proc is not None and proc.pid == pid and proc.poll() is None
        assert alive, f"{name} (pid {pid}) died: {fleet.log(name)[-1500:]}"


def intents_left() -> int:
    """Messages in reach.intents, ready or delivered-and-unacked (a loop keeps some unacked)."""
    row = rabbit_queues(VHOST).get(INTENTS, {})
    return int(row.get("messages_ready", 0)) + int(row.get("messages_unacknowledged", 0))


def assert_intents_empty(timeout: float = 10.0) -> None:
    left = wait_until(lambda: intents_left() == 0, timeout, every=0.5)
    assert left, f"reach.intents still holds {intents_left()} message(s) after {timeout:g} s"


def dlq_depth() -> int:
    return queue_depth(DLQ)[0]


def watch_dlq(seconds: float) -> list[int]:
    """reach.dlq's depth sampled over ``seconds`` (a loop shows as growth)."""
    seen, deadline = [], time.monotonic() + seconds
    while time.monotonic() < deadline:
        seen.append(dlq_depth())
        time.sleep(0.25)
    return seen


def dlq_bytes() -> int:
    size = rabbit_queues(VHOST).get(DLQ, {}).get("message_bytes", 0)
    if size == "":  # a quorum queue (RabbitMQ 3.x) does not report its bytes: count the bodies
        return sum(len(letter.body) for letter in peek_queue(BROKER_URL, DLQ, limit=100_000))
    return int(size)


def hostile_requests(system: CountingSystem) -> list[dict[str, Any]]:
    """What reached the downstream, except the bystander's probes."""
    return [r for r in system.requests() if not r["path"].startswith("/items/probe-")]


def header_int(letter: DeadLetter, name: str) -> int | None:
    value = letter.headers.get(name)
    try:
        return int(value.decode() if isinstance(value, bytes) else value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


def the_receipt(tap: ReceiptTap, intent_id: str, timeout: float = 15.0) -> TapReceipt:
    got = tap.wait_for(intent_id, timeout)
    assert got, f"no receipt for intent {intent_id} within {timeout:g} s"
    return got[0]


def publish_raw(body: bytes, intent_id: str, *, sender: str = AGENT) -> None:
    """Normal AMQP properties (content_type JSON, persistent, agent_id header), hostile body."""
    with ReachClient(sender, BROKER_URL, drop_duplicates=False, connect_timeout=30) as client:
        client.publish_raw(body, message_id=intent_id)


def new_id(label: str) -> str:
    return f"{label}-{uuid.uuid4().hex[:10]}"


# ------------------------------------------------------------------- 1. unreadable AMQP properties


def _agent_header() -> tuple[bytes, bytes]:
    return b"agent_id", fv("S", AGENT)


PROPERTY_CASES: dict[str, Any] = {
    # ~7 KB; py-amqp's recursive table decoder overflows Python's stack
    "headers_nested_1000_deep": lambda: properties(
        content_type="application/json", delivery_mode=2, headers=nested_table(1000)
    ),
    # datetime.fromtimestamp(2**63-1) raises in py-amqp's decoder
    "timestamp_header_2_63_minus_1": lambda: properties(
        content_type="application/json",
        delivery_mode=2,
        headers=table([_agent_header(), (b"sent_at", fv("T", (1 << 63) - 1))]),
    ),
    # short strings decoded as UTF-8 by py-amqp; user_id absent
    "message_id_invalid_utf8": lambda: properties(
        content_type="application/json",
        delivery_mode=2,
        message_id=b"\xff\xfe-" + RUN.encode(),
        headers=table([_agent_header()]),
    ),
    "content_type_invalid_utf8": lambda: properties(
        content_type=b"application/json\xc3\x28", delivery_mode=2, headers=table([_agent_header()])
    ),
    # kombu's Message() decompresses a body whose headers say `compression`: 256 MiB from ~200 bytes
    "bzip2_bomb_256_mib": lambda: properties(
        content_type="application/json",
        delivery_mode=2,
        headers=table([_agent_header(), (b"compression", fv("S", "application/x-bzip2"))]),
    ),
}


@pytest.mark.parametrize("case", list(PROPERTY_CASES))
def test_unreadable_amqp_properties_are_dead_lettered_once_and_the_router_survives(
    case: str, fleet: Fleet, system: CountingSystem
) -> None:
    before = pids(fleet)
    body = bz2_bomb() if case.startswith("bzip2") else dumps(intent(AGENT, CREATE, {"title": f"props-{case}"}))
    with RawSender(BROKER_URL) as sender, PeakRss(before["router"]) as rss:
        assert sender.send(PROPERTY_CASES[case](), body, case), f"the broker refused the frame: {sender.refused}"
        wait_until(lambda: dlq_depth() >= 1 or fleet.procs["router"].poll() is not None, 15)
        depths = watch_dlq(3)

    assert_alive(fleet, before)
    assert depths[-1] >= 1, f"the message was not dead-lettered within 15 s (reach.dlq holds {depths[-1]})"
    assert max(depths) == 1, f"dead-lettered more than once (reach.dlq depths over 3 s: {depths})"
    letters = peek_queue(BROKER_URL, DLQ)
    reason = letters[0].header_text("x-reach-reason")
    if case.startswith("bzip2"):
        # refusing the compression header, or reading the compressed bytes as a (non-UTF-8) body:
        # either is safe, as long as nothing was decompressed
        assert reason, "the dead letter has no x-reach-reason"
        assert len(letters[0].body) <= len(body), "the dead letter holds the decompressed bomb"
    else:
        assert re.search(r"AMQP propert", reason, re.I), f"x-reach-reason does not say why: {reason!r}"
    assert rss.peak < ROUTER_RSS_LIMIT, f"router RSS reached {rss.peak / 1e6:.0f} MB"
    assert_intents_empty()
    assert_bystander_served()
    assert hostile_requests(system) == []


# ------------------------------------------------------------------- 2. reply_to past 255 bytes


REPLY_TO_CASES = {
    # the agent's own prefix: allowed by the "own routing keys" rule, too long for AMQP
    "ascii_313_chars": f"{AGENT}." + "r" * (313 - len(AGENT) - 1),
    "e_acute_200_chars_400_bytes": "é" * 200,
    "own_prefix_then_e_acute_200_chars": f"{AGENT}." + "é" * (200 - len(AGENT) - 1),
}


@pytest.mark.parametrize("case", list(REPLY_TO_CASES))
def test_reply_to_over_255_bytes_is_answered_once_to_the_agent_and_never_loops(
    case: str, fleet: Fleet, system: CountingSystem, tap: ReceiptTap
) -> None:
    reply_to = REPLY_TO_CASES[case]
    assert len(reply_to.encode()) > 255
    before = pids(fleet)
    intent_id = new_id("reply")
    log_path = fleet.log_dir / "router.log"
    publish_raw(
        dumps(intent(AGENT, CREATE, {"title": f"reply-{case}"}, intent_id=intent_id, reply_to=reply_to)), intent_id
    )
    tap.wait_for(intent_id, 15)
    wait_until(lambda: dlq_depth() >= 1, 5)  # the router dead-letters only after it has answered
    dlq_after, log_after = dlq_depth(), log_path.stat().st_size
    depths = watch_dlq(5)
    tap.drain(0.5)
    log_growth = log_path.stat().st_size - log_after

    assert_alive(fleet, before)
    receipts = tap.for_intent(intent_id)
    assert len(receipts) == 1, (
        f"expected exactly one receipt, got {len(receipts)} (routing keys {[r.routing_key[:40] for r in receipts]})"
    )
    receipt = receipts[0]
    assert receipt.routing_key == AGENT, f"the receipt went to {receipt.routing_key[:60]!r}, not the agent's own id"
    assert receipt.error.get("code") == "INVALID_INTENT", receipt.body[:500]
    assert "reply_to" in receipt.error.get("message", ""), receipt.error
    assert hostile_requests(system) == [], "the downstream was called"
    assert dlq_after <= 1 and set(depths) <= {dlq_after}, (
        f"reach.dlq grew by more than one or kept growing: {dlq_after} then {depths}"
    )
    assert log_growth < 64 * 1024, f"the router log grew {log_growth} bytes in 5 s after the answer"
    assert_intents_empty()
    assert_bystander_served()


# ------------------------------------------------------------------- 3. params nested 1,000 deep


def test_params_nested_1000_deep_are_refused_once_with_the_limit_and_no_requeue_loop(
    fleet: Fleet, system: CountingSystem, tap: ReceiptTap
) -> None:
    before = pids(fleet)
    port = fleet.metrics_port("router")
    received_before = metric_sum(port, "reach_intents_received_total")
    intent_id = new_id("deep")
    body = (
        f'{{"intent_id":"{intent_id}","agent_id":"{AGENT}","action":"{CREATE}",'
        f'"params":{{"title":"deep","extra":{nested_json(1000)}}}}}'
    ).encode()
    publish_raw(body, intent_id)
    tap.wait_for(intent_id, 15)
    cpu_before = cpu_seconds(before["router"])
    time.sleep(3)
    cpu_used = cpu_seconds(before["router"]) - cpu_before
    received = metric_sum(port, "reach_intents_received_total") - received_before
    tap.drain(0.2)

    assert_alive(fleet, before)
    receipts = tap.for_intent(intent_id)
    assert len(receipts) == 1, f"expected exactly one receipt, got {len(receipts)}"
    error = receipts[0].error
    assert error.get("code") == "INVALID_INTENT", receipts[0].body[:500]
    message = error.get("message", "")
    assert str(MAX_DEPTH) in message and re.search(r"nest|depth|deep", message, re.I), (
        f"the message does not name the nesting limit ({MAX_DEPTH}): {message!r}"
    )
    assert received <= 1, f"reach_intents_received_total grew by {received:g} for one intent (a requeue loop)"
    assert cpu_used < 0.6, f"the router used {cpu_used:.2f} s of CPU in the 3 s after answering (not idle)"
    assert_intents_empty()
    assert hostile_requests(system) == []
    assert_bystander_served()


# ------------------------------------------------------------------- 4. a 20 MiB body


def test_a_20_mib_intent_is_never_parsed_and_dead_lettered_as_size_and_digest(
    fleet: Fleet, tap: ReceiptTap, system: CountingSystem
) -> None:
    before = pids(fleet)
    intent_id = new_id("huge")
    head = f'{{"intent_id":"{intent_id}","agent_id":"{AGENT}","action":"{CREATE}","params":{{"title":"'.encode()
    body = head + b"x" * (20 * MIB - len(head) - 3) + b'"}}'
    assert len(body) == 20 * MIB
    with PeakRss(before["router"]) as rss:
        publish_raw(body, intent_id)
        wait_until(lambda: dlq_depth() >= 1 or fleet.procs["router"].poll() is not None, 20)
        depths = watch_dlq(2)

    assert_alive(fleet, before)
    assert depths[-1] == 1 and max(depths) == 1, f"expected one dead letter, reach.dlq depths: {depths}"
    letter = peek_queue(BROKER_URL, DLQ)[0]
    assert letter.body == b"", f"the dead letter keeps {len(letter.body)} bytes of the oversized body"
    assert header_int(letter, "x-reach-body-bytes") == len(body), letter.headers
    assert letter.header_text("x-reach-body-sha256") == sha256_hex(body), letter.headers
    assert rss.peak < ROUTER_RSS_LIMIT, f"router RSS reached {rss.peak / 1e6:.0f} MB"
    receipt = the_receipt(tap, intent_id)
    assert receipt.error.get("code") == "INVALID_INTENT" and receipt.routing_key == AGENT, receipt.body[:500]
    assert_intents_empty()
    assert hostile_requests(system) == []
    assert_bystander_served()


def test_dead_letter_queue_is_declared_with_length_size_and_age_bounds(fleet: Fleet) -> None:
    row = rabbit_queues(VHOST).get(DLQ)
    assert row is not None, "reach.dlq is not declared"
    arguments = (
        {name: value for name, _kind, value in row["arguments"]}
        if isinstance(row["arguments"], list)
        else dict(row["arguments"])
    )
    missing = {"x-max-length", "x-max-length-bytes", "x-message-ttl"} - set(arguments)
    assert not missing, f"reach.dlq has no {sorted(missing)} (arguments: {arguments})"
    assert all(
        isinstance(arguments[k], int) and arguments[k] > 0
        for k in ("x-max-length", "x-max-length-bytes", "x-message-ttl")
    ), arguments


# ------------------------------------------------------------------- 5. detail bombs


def unknown_params_body(intent_id: str, size: int = 244 * 1024) -> tuple[bytes, int]:
    """An intent of at most ``size`` bytes with as many distinct undeclared params as fit."""

    def build(n: int) -> bytes:
        return (
            f'{{"intent_id":"{intent_id}","agent_id":"{AGENT}","action":"{CREATE}","params":{unknown_params(n)}}}'
        ).encode()

    n = size // 9
    while len(build(n)) > size:
        n -= 200
    return build(n), n


def array_items_body(intent_id: str, items: int = 125_000) -> bytes:
    """``tags`` (an array of strings) with 125,000 numbers: 244 KiB, one problem per item."""
    return (
        f'{{"intent_id":"{intent_id}","agent_id":"{AGENT}","action":"{CREATE}",'
        f'"params":{{"title":"t","tags":[{",".join(["0"] * items)}]}}}}'
    ).encode()


MORE = re.compile(r"and (\d[\d,_ ]*) more")


@pytest.mark.parametrize("shape", ["unknown_params", "array_items_125000"])
def test_an_intent_with_tens_of_thousands_of_problems_gets_one_bounded_receipt(
    shape: str, fleet: Fleet, tap: ReceiptTap, system: CountingSystem
) -> None:
    intent_id = new_id("details")
    if shape == "unknown_params":
        body, problems = unknown_params_body(intent_id)
    else:
        body, problems = array_items_body(intent_id), 125_000
    assert len(body) <= MAX_INTENT_BYTES
    publish_raw(body, intent_id)
    tap.wait_for(intent_id, 30)
    tap.drain(1)

    receipts = tap.for_intent(intent_id)
    assert len(receipts) == 1, f"expected exactly one receipt, got {len(receipts)}"
    receipt = receipts[0]
    assert len(receipt.body) <= MAX_RECEIPT_BYTES, f"the receipt is {len(receipt.body)} bytes"
    error = receipt.error
    assert error.get("code") == "VALIDATION_FAILED", receipt.body[:500]
    details = error.get("details") or []
    assert 1 <= len(details) <= MAX_DETAILS, f"{len(details)} details (at most {MAX_DETAILS})"
    if shape == "unknown_params" or len(details) == MAX_DETAILS:
        assert len(details) == MAX_DETAILS, f"{problems} problems but only {len(details)} details"
        more = MORE.search(json.dumps(details[-1], ensure_ascii=False))
        assert more, f"the last detail does not say how many more there were: {details[-1]}"
        k = int(re.sub(r"\D", "", more.group(1)))
        assert problems - MAX_DETAILS <= k <= problems, f"'and {k} more' for {problems} problems"
    assert hostile_requests(system) == []
    assert_bystander_served()


def database_bytes(client: redis.Redis) -> int:
    """Bytes held by this test run's Redis database (MEMORY USAGE of every key): the server's
    used_memory also counts the other databases, which parallel test files fill."""
    pipe = client.pipeline(transaction=False)
    for key in client.scan_iter(count=1000):
        pipe.memory_usage(key, samples=0)
    return sum(int(n or 0) for n in pipe.execute())


def test_forty_detail_bombs_grow_redis_by_less_than_40_mib(
    fleet: Fleet, tap: ReceiptTap, redis_client: redis.Redis
) -> None:
    used_before = database_bytes(redis_client)
    ids = [new_id(f"bomb{i}") for i in range(40)]
    with ReachClient(AGENT, BROKER_URL, drop_duplicates=False) as client:
        for intent_id in ids:
            client.publish_raw(unknown_params_body(intent_id)[0], message_id=intent_id)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and not all(tap.for_intent(i) for i in ids):
        tap.drain(0.5)
    tap.drain(1)
    grown = database_bytes(redis_client) - used_before

    answered = [i for i in ids if tap.for_intent(i)]
    assert len(answered) == 40, f"only {len(answered)} of 40 got a receipt"
    codes = {tap.for_intent(i)[0].error.get("code") for i in ids}
    assert codes == {"VALIDATION_FAILED"}, codes
    assert all(len(tap.for_intent(i)) == 1 for i in ids), "some intent got more than one receipt"
    assert grown < 40 * MIB, f"the Redis database grew by {grown / MIB:.1f} MiB for 40 intents"
    assert_bystander_served()


# ------------------------------------------------------------------- 7. secrets in malformed bodies


SECRET_CASES = ["trailing_comma", "truncated_json", "duplicate_key", "nan", "invalid_utf8", "openai_arguments_not_json"]


def secret_for(case: str) -> str:
    return f"tok-{RUN}-{case.replace('_', '')}-Zq9"


def secret_body(case: str, intent_id: str) -> bytes:
    secret = secret_for(case)
    params = f'"title":"leak","token":"{secret}"'
    head = f'{{"intent_id":"{intent_id}","agent_id":"{AGENT}","action":"{CREATE}",'
    if case == "trailing_comma":
        return f'{head}"params":{{{params}}},}}'.encode()
    if case == "truncated_json":
        return f'{head}"params":{{{params},"extra":{{"a":[1,2'.encode()
    if case == "duplicate_key":
        return f'{head}"params":{{{params},"title":"again"}}}}'.encode()
    if case == "nan":
        return f'{head}"params":{{{params},"extra":{{"ratio":NaN}}}}}}'.encode()
    if case == "invalid_utf8":
        return f'{head}"params":{{{params},"extra":{{"note":"'.encode() + b"\xff\xfe\xc3\x28" + b'"}}}'
    if case == "openai_arguments_not_json":
        arguments = f'{{"title": "leak", "token": "{secret}", '  # cut off: not JSON
        return dumps(
            {
                "id": intent_id,
                "type": "function",
                "function": {"name": f"{CONNECTOR}__create_item", "arguments": arguments},
            }
        )
    raise ValueError(case)


@dataclass
class SecretOutcome:
    intent_id: str
    secret: bytes
    receipts: list[TapReceipt] = field(default_factory=list)
    letters: list[DeadLetter] = field(default_factory=list)


@pytest.fixture(scope="module")
def secret_outcomes(fleet: Fleet, tap: ReceiptTap) -> dict[str, Any]:
    """Every malformed body sent once (with an agent_id header); receipts and dead letters collected."""
    ready(fleet, "the secret cases")
    outcomes = {case: SecretOutcome(new_id(case.replace("_", "")), secret_for(case).encode()) for case in SECRET_CASES}
    with ReachClient(AGENT, BROKER_URL, drop_duplicates=False) as client:
        for case, outcome in outcomes.items():
            client.publish_raw(secret_body(case, outcome.intent_id), message_id=outcome.intent_id)
    for outcome in outcomes.values():
        tap.wait_for(outcome.intent_id, 15)
    wait_until(lambda: dlq_depth() >= len(SECRET_CASES), 10)
    time.sleep(0.5)
    letters = peek_queue(BROKER_URL, DLQ)
    for outcome in outcomes.values():
        outcome.receipts = tap.for_intent(outcome.intent_id)
        outcome.letters = [
            letter
            for letter in letters
            if outcome.intent_id in (letter.properties.get("message_id"), letter.header_text("x-reach-intent-id"))
        ]
    return {"cases": outcomes, "letters": letters, "log": fleet.log("router")}


@pytest.mark.parametrize("case", SECRET_CASES)
def test_a_malformed_intent_never_puts_a_sensitive_value_in_a_dead_letter(
    case: str, secret_outcomes: dict[str, Any]
) -> None:
    outcome: SecretOutcome = secret_outcomes["cases"][case]
    assert outcome.letters, (
        f"intent {outcome.intent_id} was not dead-lettered ({len(secret_outcomes['letters'])} letters in reach.dlq)"
    )
    for letter in secret_outcomes["letters"]:  # in none of them, not just its own
        assert outcome.secret not in letter.all_bytes(), (
            f"a dead letter holds the sensitive value: {letter.body[:300]!r} {letter.headers}"
        )
    assert len(outcome.receipts) == 1, f"expected one receipt, got {len(outcome.receipts)}"
    receipt = outcome.receipts[0]
    assert receipt.error.get("code") == "INVALID_INTENT" and receipt.routing_key == AGENT, receipt.body[:500]
    assert outcome.secret not in receipt.body, f"the receipt echoes the sensitive value: {receipt.body[:500]!r}"


def test_malformed_intents_never_put_a_sensitive_value_in_the_router_log(secret_outcomes: dict[str, Any]) -> None:
    leaked = [
        case for case, outcome in secret_outcomes["cases"].items() if outcome.secret.decode() in secret_outcomes["log"]
    ]
    assert leaked == [], f"the router log holds the sensitive value of: {leaked}"


# ------------------------------------------------------------------- the generator


HALF_OPEN = 12  # half requests held against the router's /metrics and probes during each batch
APPROVALS_PER_BATCH, ODD_VALUES_PER_BATCH = 2, 4
NOT_THE_AGENTS_FAULT = {"DOWNSTREAM_ERROR", "CONNECTOR_UNAVAILABLE", "INTERNAL", "OUTCOME_UNKNOWN"}


@dataclass
class Side:
    """What the side checks of the generated run need: receipts, the systems and Redis."""

    tap: ReceiptTap
    system: CountingSystem
    pg: PostgresServer
    store: redis.Redis


def receipts_only(tap: ReceiptTap, intent_id: str) -> list[TapReceipt]:
    """The intent's receipts on reach.receipts, without its approval_pending notices."""
    return [r for r in tap.for_intent(intent_id) if r.doc.get("type") != "approval_pending"]


def notices(tap: ReceiptTap, intent_id: str) -> list[TapReceipt]:
    return [r for r in tap.for_intent(intent_id) if r.doc.get("type") == "approval_pending"]


def wait_tap(tap: ReceiptTap, done: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            return False
        tap.drain(0.2)
    return True


def side_checks(side: Side, gen: SideGenerator, run: GeneratorRun) -> list[str]:
    """Messages the fleet must answer exactly once, sent beside the generated ones:

    - approval resends: an intent waits for approval, its id comes again (mistyped action, refused
      params, params that need no approval, the same message); once approved, exactly one receipt
      comes for it, a success, and the downstream is called once, with the approved params;
    - NUL and odd code points for a SQL system: a NUL is VALIDATION_FAILED (the driver refuses it
      before sending), nothing is the system's fault, the breaker stays closed, and another agent's
      plain intent is still served.
    """
    problems: list[str] = []
    tap = side.tap
    with ReachClient(SIDE_AGENT, BROKER_URL, drop_duplicates=False, connect_timeout=30) as client:
        gated = [gen.approval_resends(REFUND, REFUND_OVER) for _ in range(APPROVALS_PER_BATCH)]
        for case in gated:
            client.publish_raw(case.original, message_id=case.intent_id)
        if not wait_tap(tap, lambda: all(notices(tap, c.intent_id) for c in gated), 15):
            return [f"no approval_pending notice within 15 s for {[c.intent_id for c in gated]}"]
        for case in gated:
            for body in case.resends:
                client.publish_raw(body, message_id=case.intent_id)
            run.resends += len(case.resends)
        # each resend is answered by the waiting one's notice again (and nothing else)
        wait_tap(tap, lambda: all(len(notices(tap, c.intent_id)) > len(c.resends) for c in gated), 10)
        for case in gated:
            early = receipts_only(tap, case.intent_id)
            if early:
                problems.append(f"{case.intent_id} ({case.kinds}) answered before a decision: {early[0].body[:300]!r}")
            pending = [p for p in approvals.list_pending(side.store, 10_000) if p.intent_id == case.intent_id]
            if len(pending) != 1:
                problems.append(f"{case.intent_id} ({case.kinds}): {len(pending)} pending approvals, not 1")
                continue
            decision = approvals.approve(side.store, BROKER_URL, pending[0].approval_id, APPROVER)
            if not decision.ok:
                problems.append(f"{case.intent_id}: approving it answered {decision}")
                continue
            run.approvals += 1
        wait_tap(tap, lambda: all(receipts_only(tap, c.intent_id) for c in gated), 20)
        odd = gen.odd_values(SQL_ADD, "title", ODD_VALUES_PER_BATCH)
        for value in odd:
            client.publish_raw(value.body, message_id=value.intent_id)
        run.odd_values += len(odd)
        wait_tap(tap, lambda: all(tap.for_intent(v.intent_id) for v in odd), 20)
        tap.drain(0.5)  # a second receipt would come now
    for case in gated:
        got = receipts_only(tap, case.intent_id)
        calls = side.system.requests("POST", title=case.title)
        if len(got) != 1 or got[0].doc.get("status") != "succeeded":
            statuses = [(r.doc.get("status"), r.error.get("code")) for r in got]
            problems.append(f"{case.intent_id} ({case.kinds}) approved: receipts {statuses}, not one success")
        if len(calls) != 1 or calls[0]["body"].get("amount") == "lots":
            problems.append(f"{case.intent_id} ({case.kinds}) approved: the downstream was called {len(calls)} times")
        if side.system.requests("POST", title=f"{case.title}-small"):
            problems.append(f"{case.intent_id}: a resend with other params reached the downstream")
    for value in odd:
        got = tap.for_intent(value.intent_id)
        codes = [r.error.get("code") for r in got]
        if len(got) != 1:
            problems.append(f"SQL {value.label} ({value.intent_id}): {len(got)} receipts, not 1")
        elif value.nul and codes != ["VALIDATION_FAILED"]:
            problems.append(f"SQL {value.label}: {codes}, not VALIDATION_FAILED")
        elif NOT_THE_AGENTS_FAULT & set(codes):
            problems.append(f"SQL {value.label}: {codes} (the agent's input counted against the system)")
    state = side.store.hget(keys.breaker(SQL_CONNECTOR), "state")
    if state not in (None, b"closed"):
        problems.append(f"the SQL connector's breaker is {state!r} after NULs and odd code points")
    with agent(BYSTANDER) as client:
        try:
            served = client.call(SQL_ADD, {"title": f"calm-{uuid.uuid4().hex[:8]}"}, timeout=15)
        except TimeoutError:
            served = None
    if served is None or served.status != "succeeded":
        problems.append(f"another agent's plain SQL intent was not served: {served}")
    return problems


@dataclass
class GeneratorRun:
    seed: int
    tried: int = 0
    refused_by_broker: int = 0
    crashes: int = 0
    loops: int = 0
    dead_letter_bytes: int = 0
    redis_grown: int = 0
    approvals: int = 0  # parked intents approved after their ids were resent
    resends: int = 0
    odd_values: int = 0  # SQL intents with a NUL or an odd code point
    half_open: int = 0  # half-requests held against the router's /metrics while it all ran
    problems: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return (
            f"hostile generator (seed {self.seed}): messages tried {self.tried} "
            f"(broker refused {self.refused_by_broker}), router crashes {self.crashes}, "
            f"loops detected {self.loops}, dead-letter bytes kept {self.dead_letter_bytes}, "
            f"Redis bytes grown {self.redis_grown}; approvals {self.approvals} after {self.resends} resends of "
            f"their ids, odd SQL values {self.odd_values}, half-open sockets held {self.half_open}"
        )


def run_generator(
    fleet: Fleet,
    redis_client: redis.Redis,
    seed: int,
    batches: int,
    per_batch: int,
    limits: Limits,
    side: Side,
    redis_budget: int = 20 * MIB,
) -> GeneratorRun:
    """Send ``batches`` of generated messages; after each, check the fleet from outside. Around each
    batch, half-open sockets hold the router's /metrics (its scrapes must still answer); after each
    batch's own checks, :func:`side_checks` (approval resends and odd SQL values)."""
    run = GeneratorRun(seed)
    gen = Generator(seed, GEN_AGENT, CREATE, limits)
    side_gen = SideGenerator(seed, SIDE_AGENT, RUN)
    redis_start = database_bytes(redis_client)
    sender = RawSender(BROKER_URL)
    kept_before_purge = 0
    try:
        for number in range(1, batches + 1):
            batch = gen.batch(per_batch)
            before = pids(fleet)
            router = fleet.procs["router"]
            port = fleet.metrics_port("router")
            slow = half_open(port, HALF_OPEN)  # more than the probes' 8 per address: the rest are closed
            run.half_open += len(slow)
            received0 = metric_sum(port, "reach_intents_received_total")
            dlq0, mem0 = dlq_depth(), database_bytes(redis_client)
            accepted = sum(sender.send(m.props, m.body, m.label) for m in batch)
            run.tried += len(batch)
            run.refused_by_broker += len(batch) - accepted
            # processed: nothing ready, or the router is gone
            wait_until(lambda: queue_depth(INTENTS)[0] == 0 or router.poll() is not None, 60, every=0.2)
            answered = probe(timeout=10) if router.poll() is None else None
            problems = []
            if any(p.poll() is not None or p.pid != before.get(n) for n, p in fleet.procs.items()):
                dead = [n for n, p in fleet.procs.items() if p.poll() is not None]
                run.crashes += "router" in dead
                problems.append(f"{','.join(dead)} died")
            else:
                left = wait_until(lambda: intents_left() == 0, 10, every=0.5)
                dlq1 = dlq_depth()
                received = metric_sum(port, "reach_intents_received_total") - received0
                grew_after = watch_dlq(1)[-1] - dlq1
                looped = not left or dlq1 - dlq0 > accepted or received > accepted + 1 or grew_after > 0
                run.loops += looped
                if answered is None or answered.status != "succeeded":
                    problems.append(f"the bystander was not served within 10 s ({answered})")
                if not left:
                    problems.append(f"reach.intents still holds {intents_left()}")
                if dlq1 - dlq0 > accepted or grew_after > 0:
                    problems.append(f"reach.dlq grew by {dlq1 - dlq0} (+{grew_after} after) for {accepted} messages")
                if received > accepted + 1:
                    problems.append(f"reach_intents_received_total grew by {received:g} for {accepted} messages")
            if not problems:
                problems += side_checks(side, side_gen, run)
            close_all(slow)
            mem_grown = database_bytes(redis_client) - mem0
            if mem_grown >= redis_budget:
                problems.append(f"the Redis database grew by {mem_grown / MIB:.1f} MiB")
            if problems:
                kinds = sorted({t for m in batch for t in m.tags if t.startswith("body_")})
                run.problems.append(f"batch {number}: {'; '.join(problems)} (body kinds in it: {', '.join(kinds)})")
                kept_before_purge += dlq_bytes()
                ready(fleet, f"generator batch {number + 1}")  # purges reach.dlq
    finally:
        sender.close()
        run.redis_grown = database_bytes(redis_client) - redis_start
        try:
            run.dead_letter_bytes = kept_before_purge + dlq_bytes()
        except Exception as exc:  # the summary must still print
            run.problems.append(f"could not read reach.dlq's size: {exc}")
    return run


def test_generated_hostile_messages_never_crash_or_loop_the_fleet(
    fleet: Fleet,
    redis_client: redis.Redis,
    tap: ReceiptTap,
    system: CountingSystem,
    pg: PostgresServer,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # the same 300 messages as six batches of 50, in three batches: each batch's checks cost ~3 s
    side = Side(tap, system, pg, redis_client)
    run = run_generator(fleet, redis_client, seed=20_240_611, batches=3, per_batch=100, limits=Limits(), side=side)
    with capsys.disabled():
        print("\n" + run.summary())
    assert run.crashes == 0 and run.loops == 0 and run.problems == [], "\n".join(run.problems)


@pytest.mark.soak
def test_soak_generated_hostile_messages_never_crash_or_loop_the_fleet(
    request: pytest.FixtureRequest,
    fleet: Fleet,
    redis_client: redis.Redis,
    tap: ReceiptTap,
    system: CountingSystem,
    pg: PostgresServer,
    capsys: pytest.CaptureFixture[str],
) -> None:
    markexpr = request.config.getoption("markexpr") or ""
    if "soak" not in markexpr or "not soak" in markexpr:
        pytest.skip("the soak variant runs only when asked for: -m soak")
    side = Side(tap, system, pg, redis_client)
    run = run_generator(fleet, redis_client, seed=7, batches=20, per_batch=100, limits=Limits.soak(), side=side)
    with capsys.disabled():
        print("\n" + run.summary())
    assert run.crashes == 0 and run.loops == 0 and run.problems == [], "\n".join(run.problems)
