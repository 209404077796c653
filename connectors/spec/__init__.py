"""Catalog models: connectors with their semantic actions, and agent apps with their bindings.

The YAML shapes of docs/contract.md section 5 load into these models unchanged. Every model forbids
unknown keys so a typo in YAML is an error with a line number, not a silent default. One module an
idea, importers use the names here:

    base.py         the strict base model (Spec) and the name rules several models share
    http_parts.py   method and path template, header names
    fields.py       FieldSpec: an input or output field
    policies.py     RetryPolicy, BreakerSpec, PoolSpec, HealthSpec
    auth.py         AuthSpec: a connector's credentials, by env variable name
    action.py       ActionSpec, with its ErrorRule list and ApprovalSpec
    connector.py    ConnectorSpec, and what each connector type needs (type_problems)
    agent_app.py    AgentApp, its Bindings and their BudgetSpecs
    documents.py    the document types (connector:, agent_app:, routing:, approvers:)
"""

from connectors.spec.action import ActionSpec, ApprovalSpec, ErrorRule, HistorySpec
from connectors.spec.agent_app import AgentApp, Binding, BudgetSpec, budget_problems, parse_budget_window
from connectors.spec.auth import AuthSpec, AuthType
from connectors.spec.base import HOURS_WINDOW, NAME_PATTERN, PERSON_PATTERN
from connectors.spec.connector import BUILTIN_TYPES, ConnectorSpec, ConnectorType, type_problems
from connectors.spec.documents import (
    AgentAppDocument,
    ApproversDocument,
    ConnectorDocument,
    EmbeddingModel,
    RoutingDocument,
    RoutingSpec,
    RoutingWeights,
)
from connectors.spec.fields import (
    DEFAULT_FILE_BYTES,
    MAX_FILE_BYTES,
    FieldSpec,
    FieldType,
    Placement,
    base64_chars,
)
from connectors.spec.http_parts import (
    BODY_KINDS,
    HEADER_NAME,
    HTTP_METHODS,
    PATH_PARAM,
    body_problems,
    header_name_problem,
    path_param_problems,
    split_path,
)
from connectors.spec.policies import BreakerSpec, HealthSpec, PoolSpec, RetryPolicy

__all__ = [
    "BODY_KINDS",
    "DEFAULT_FILE_BYTES",
    "MAX_FILE_BYTES",
    "Placement",
    "base64_chars",
    "body_problems",
    "HEADER_NAME",
    "HOURS_WINDOW",
    "HTTP_METHODS",
    "NAME_PATTERN",
    "PATH_PARAM",
    "PERSON_PATTERN",
    "ActionSpec",
    "AgentApp",
    "AgentAppDocument",
    "ApprovalSpec",
    "ApproversDocument",
    "AuthSpec",
    "AuthType",
    "Binding",
    "BreakerSpec",
    "BudgetSpec",
    "ConnectorDocument",
    "ConnectorSpec",
    "BUILTIN_TYPES",
    "ConnectorType",
    "EmbeddingModel",
    "ErrorRule",
    "FieldSpec",
    "FieldType",
    "HealthSpec",
    "HistorySpec",
    "PoolSpec",
    "RetryPolicy",
    "RoutingDocument",
    "RoutingSpec",
    "RoutingWeights",
    "budget_problems",
    "header_name_problem",
    "parse_budget_window",
    "path_param_problems",
    "split_path",
    "type_problems",
]
