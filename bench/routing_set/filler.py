"""Filler for the semantic-routing benchmark: ten thousand more actions, each with a text of its
own (100 connectors of 100 actions), so the index, BM25's statistics, the embedding cache and the
router's memory are those of a 10,000-action catalog. Deterministic (fixed seed)."""

from __future__ import annotations

import random

SYSTEMS = [
    ("inventory", "Warehouse inventory: stock levels, bins and pallets"),
    ("ledger", "General ledger of the finance team: journals, accounts and periods"),
    ("crm", "Sales CRM: leads, accounts, opportunities and pipelines"),
    ("fleet", "Truck fleet management: vehicles, drivers, routes and fuel"),
    ("lab", "Laboratory information system: samples, tests and results"),
    ("plm", "Product lifecycle management: parts, bills of materials and revisions"),
    ("mes", "Manufacturing execution: work orders, machines and shifts"),
    ("lms", "Learning management: courses, enrolments and certificates"),
    ("cms", "Web content management: pages, assets and publishing"),
    ("dms", "Document management: folders, versions and approvals"),
    ("iam", "Identity and access: users, groups and roles"),
    ("siem", "Security events: alerts, incidents and detection rules"),
    ("billing", "Customer billing: invoices, credit notes and dunning"),
    ("payroll", "Payroll runs: wage types, deductions and payslips"),
    ("recruit", "Recruiting: job openings, candidates and interviews"),
    ("survey", "Surveys: questionnaires, responses and reports"),
    ("tax", "Tax reporting: VAT returns, filings and rates"),
    ("treasury", "Treasury: cash positions, FX deals and bank accounts"),
    ("assets", "Fixed assets: acquisitions, depreciation and disposals"),
    ("procure", "Procurement: purchase requisitions, suppliers and catalogues"),
]
VERBS = [
    "list",
    "get",
    "export",
    "import",
    "archive",
    "approve",
    "reject",
    "assign",
    "close",
    "reopen",
    "merge",
    "validate",
    "schedule",
    "recalculate",
    "forecast",
    "audit",
    "tag",
    "lock",
    "unlock",
    "publish",
    "sync",
    "transfer",
    "split",
    "summarise",
    "notify",
]
OBJECTS = [
    "monthly report",
    "open items",
    "draft records",
    "exceptions",
    "batch jobs",
    "quarterly figures",
    "master data",
    "pending approvals",
    "error log",
    "historical entries",
    "templates",
    "attachments",
    "comments",
    "owners",
    "thresholds",
    "regional totals",
    "reminders",
    "duplicates",
    "change history",
    "access list",
    "cost centres",
    "KPIs",
    "snapshots",
    "labels",
    "custom fields",
]
CONNECTORS = 100
ACTIONS_PER_CONNECTOR = 100


def filler_catalog(endpoint: str = "http://127.0.0.1:9", agent: str = "everything", unique: bool = False) -> str:
    """The filler connectors and an agent bound to all of them (YAML). Action names repeat across
    connectors (``export_monthly_report`` on many systems), so semantic routing has work to do;
    ``unique`` suffixes them with the connector's number, so no bare action is shared (a catalog
    that never needs the model)."""
    rng = random.Random(20261130)
    docs = []
    names = []
    for i in range(CONNECTORS):
        system, about = SYSTEMS[i % len(SYSTEMS)]
        name = f"{system}_{i:03d}"
        names.append(name)
        region = ["EMEA", "APAC", "Americas", "China", "Germany"][i // len(SYSTEMS) % 5]
        pairs = rng.sample([(v, o) for v in VERBS for o in OBJECTS], ACTIONS_PER_CONNECTOR)
        actions = []
        for verb, obj in pairs:
            action = f"{verb}_{obj.lower().replace(' ', '_')}" + (f"_{i:03d}" if unique else "")
            actions.append(
                f"""\
    - action: {action}
      description: "{verb.capitalize()} the {obj} of the {region} {system} system"
      path: POST /{name}/{action}
      input:
        scope: {{ type: string, description: "Which {obj} (filter)" }}
"""
            )
        docs.append(
            f"""\
connector:
  name: {name}
  description: "{about} ({region})"
  endpoint: {endpoint}
  actions:
{"".join(actions)}"""
        )
    bindings = "".join(f"    - {{ connector: {n}, allowed_actions: ['*'] }}\n" for n in names)
    docs.append(f"agent_app:\n  name: {agent}\n  connector_bindings:\n{bindings}")
    return "---\n".join(docs)
