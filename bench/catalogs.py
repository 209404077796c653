"""Catalogs for the benchmarks, generated as the YAML a connector author writes.

The measured action is always ``bench_fast.create_ticket``: write permission, a params schema
with every kind of check (required, max_length, enum with default, pattern, integer bounds),
a declared output, an idempotency header, a binding with a generous rate limit and an
always-open time window, full audit. Scale catalogs add generated connectors and actions
(100 actions per connector) and agents; the intents still target that one action.
"""

from __future__ import annotations

from pathlib import Path

AGENT = "bench_agent"
FAST = "bench_fast"
SLOW = "bench_slow"
SLOW_AGENT = "bench_slow_agent"
ACTIONS_PER_CONNECTOR = 100
GENEROUS_RATE = "100000/min"

CREATE_TICKET = """\
    - action: create_ticket
      description: Create a ticket in the benchmark system
      path: POST /tickets
      input:
        title: {{ type: string, required: true, max_length: 100, description: Ticket title }}
        description: {{ type: string, required: true, description: Problem details }}
        priority: {{ type: enum, values: [low, medium, high], default: medium }}
        customer_id: {{ type: string, required: true, pattern: "^C[0-9]{{4}}$" }}
        quantity: {{ type: integer, min: 1, max: 100 }}
      output:
        item_id: {{ type: string }}
        status: {{ type: enum, values: [open, closed] }}
      permission: write
      timeout: {timeout}
      idempotent: false
"""

# the params every benchmark intent carries (title is made unique per intent by the agent)
PARAMS = {"title": "bench", "description": "printer on fire", "priority": "high", "customer_id": "C0042", "quantity": 3}


def _connector(name: str, endpoint: str, actions: str, concurrency: int = 20) -> str:
    return f"""\
connector:
  name: {name}
  description: Benchmark downstream {name}
  endpoint: {endpoint}
  auth: {{ type: none }}
  idempotency_header: Idempotency-Key
  pool: {{ concurrency: {concurrency} }}
  breaker: {{ fail_max: 5, reset_timeout: 30s }}
  retry: {{ max_attempts: 3, initial_backoff: 100ms, max_backoff: 5s }}
  actions:
{actions}"""


def _generated_actions(prefix: str, count: int) -> str:
    out = []
    for i in range(count):
        out.append(f"""\
    - action: {prefix}_{i:05d}
      description: Generated action {i} of {prefix}
      path: POST /tickets
      input:
        title: {{ type: string, required: true, max_length: 100 }}
        amount: {{ type: number, min: 0 }}
        kind: {{ type: enum, values: [a, b, c] }}
      permission: write
      timeout: 5s
""")
    return "".join(out)


def _agent(name: str, bindings: list[tuple[str, list[str]]]) -> str:
    lines = [f"agent_app:\n  name: {name}\n  connector_bindings:\n"]
    for connector, actions in bindings:
        lines.append(f"""\
    - connector: {connector}
      allowed_actions: [{", ".join(actions)}]
      rate_limit: {GENEROUS_RATE}
      allowed_hours: "00:00-24:00 UTC"
      audit_level: full
""")
    return "".join(lines)


def main_catalog(endpoint: str, concurrency: int = 20, slow_endpoint: str | None = None) -> str:
    """bench_fast (the measured connector) and bench_slow (2 s per call: under /slow of its own
    system ``slow_endpoint``, or of ``endpoint`` when none is given)."""
    return "---\n".join(
        [
            _connector(FAST, endpoint, CREATE_TICKET.format(timeout="5s"), concurrency),
            _connector(
                SLOW,
                (slow_endpoint or endpoint).rstrip("/") + "/slow",
                CREATE_TICKET.format(timeout="10s"),
                concurrency,
            ),
            _agent(AGENT, [(FAST, ["create_ticket"])]),
            _agent(SLOW_AGENT, [(SLOW, ["create_ticket"])]),
        ]
    )


def scale_catalog(endpoint: str, actions: int, agents: int, concurrency: int = 20) -> tuple[str, list[str]]:
    """``actions`` actions in all (bench_fast.create_ticket among them), ``agents`` agent apps, each
    bound to bench_fast and to one generated connector. Returns (YAML, agent names)."""
    docs = []
    first = min(actions, ACTIONS_PER_CONNECTOR) - 1
    docs.append(
        _connector(FAST, endpoint, CREATE_TICKET.format(timeout="5s") + _generated_actions("fast", first), concurrency)
    )
    left = actions - 1 - first
    generated = []
    i = 0
    while left > 0:
        count = min(left, ACTIONS_PER_CONNECTOR)
        name = f"gen_{i:03d}"
        docs.append(_connector(name, endpoint, _generated_actions(name, count), concurrency))
        generated.append(name)
        left -= count
        i += 1
    names = [f"agent_{j:04d}" for j in range(agents)]
    for j, name in enumerate(names):
        bindings = [(FAST, ["create_ticket"])]
        if generated:
            bindings.append((generated[j % len(generated)], ["'*'"]))
        docs.append(_agent(name, bindings))
    return "---\n".join(docs), names


def write(directory: Path, text: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "catalog.yaml"
    path.write_text(text)
    return directory
