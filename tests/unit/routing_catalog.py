"""A catalog for router unit tests (no services needed)."""

from __future__ import annotations

from pathlib import Path

from connectors.catalog import Catalog, build
from connectors.loader import load_directory

YAML = """
connector:
  name: tickets
  endpoint: http://127.0.0.1:9
  domain: support
  actions:
    - action: create_ticket
      path: POST /tickets
      input:
        title: { type: string, required: true, max_length: 100 }
        priority: { type: enum, values: [low, medium, high], default: medium }
        api_token: { type: string, sensitive: true, in: header, name: X-Token }
        card: { type: object, properties: { number: { type: string, sensitive: true }, holder: { type: string } } }
      permission: write
    - action: query_ticket
      path: GET /tickets/{tid}
      input:
        tid: { type: string, required: true }
    - action: night_batch
      path: POST /batch
      allowed_hours: "22:00-06:00 Asia/Shanghai"
      permission: write
---
connector:
  name: crm
  endpoint: http://127.0.0.1:9
  actions:
    - action: query_ticket
      path: GET /crm/tickets/{tid}
      input:
        tid: { type: string, required: true }
---
agent_app:
  name: bot
  connector_bindings:
    - connector: tickets
      allowed_actions: ["*"]
      rate_limit: 5/min
---
agent_app:
  name: office_bot
  connector_bindings:
    - connector: tickets
      allowed_actions: [query_ticket]
      allowed_hours: "09:00-17:00 Europe/Berlin"
"""


def routing_catalog(tmp: Path) -> Catalog:
    (tmp / "catalog.yaml").write_text(YAML)
    catalog, problems = build(load_directory(tmp))
    assert not problems, problems
    return catalog
