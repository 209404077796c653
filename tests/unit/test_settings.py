"""Every REACH_* variable is a validated setting, and the documented table says what the code does.

The "Configuration" table is looked for in README.md and docs/*.md; every copy found must agree
with ``workers.settings.Settings`` (names, defaults), and at least one must exist.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from producers.client_settings import DEFAULT_BROKER_URL, ClientSettings, env_name
from workers.settings import Settings, SettingsError

REPO = Path(__file__).resolve().parents[2]
ROW = re.compile(r"^\|\s*`(REACH_[A-Z_]+)`\s*\|\s*([^|]*?)\s*\|")


def documented_tables() -> dict[str, dict[str, str]]:
    """{document: {variable: default cell}} for each "Configuration" section's REACH_* rows."""
    tables: dict[str, dict[str, str]] = {}
    for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        if not path.is_file():
            continue
        section: str | None = None
        for line in path.read_text().splitlines():
            if line.startswith("#"):
                section = line.lstrip("#").strip()
                continue
            match = ROW.match(line)
            if match and section == "Configuration":
                tables.setdefault(str(path.relative_to(REPO)), {})[match.group(1)] = match.group(2)
    return tables


VARIABLES = {env_name(Settings, field): field for field in Settings.model_fields}


def test_the_configuration_table_is_documented_somewhere() -> None:
    assert documented_tables(), "no Configuration table with REACH_* rows in README.md or docs/*.md"


@pytest.mark.parametrize("document", sorted(documented_tables()))
def test_every_documented_variable_is_a_setting_and_every_setting_is_documented(document: str) -> None:
    documented = set(documented_tables()[document])
    assert documented - set(VARIABLES) == set(), f"{document} documents variables the fleet does not read"
    assert set(VARIABLES) - documented == set(), f"settings missing from {document}'s table"


@pytest.mark.parametrize("document", sorted(documented_tables()))
def test_documented_defaults_are_the_real_defaults(document: str) -> None:
    defaults = Settings()
    for variable, cell in documented_tables()[document].items():
        field = VARIABLES[variable]
        if cell.startswith("unset"):
            assert getattr(defaults, field) is None, variable
            continue
        shown = re.match(r"`([^`]+)`", cell)
        assert shown, f"{document}: {variable}'s default {cell!r} should start with `value` or 'unset'"
        assert getattr(Settings.from_env({variable: shown.group(1)}), field) == getattr(defaults, field), variable


def test_every_setting_says_what_it_is_for() -> None:
    for field, info in Settings.model_fields.items():
        assert info.description, field


def test_an_empty_environment_gives_the_defaults_and_blank_values_count_as_unset() -> None:
    assert Settings.from_env({}) == Settings()
    assert Settings.from_env({name: "  " for name in VARIABLES}) == Settings()


def test_keyword_arguments_are_the_whole_truth(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REACH_MAX_DEPTH", "3")
    monkeypatch.setenv("REACH_CATALOG", "elsewhere")
    assert Settings(broker_url="amqp://x//").max_depth == 32
    assert Settings().catalog_dir == "catalog"
    read = Settings.from_env()
    assert (read.max_depth, read.catalog_dir) == (3, "elsewhere")


def test_variables_named_after_another_word_set_their_field() -> None:
    read = Settings.from_env(
        {"REACH_CATALOG": "cat", "REACH_RECEIPT_TTL": "60", "REACH_IDEMPOTENCY_TTL": "61", "REACH_DLQ_TTL": "62"}
    )
    assert (read.catalog_dir, read.receipt_ttl_seconds, read.idempotency_ttl_seconds, read.dlq_ttl_seconds) == (
        "cat",
        60,
        61,
        62,
    )
    assert Settings(catalog_dir="c", receipt_ttl_seconds=5).catalog_dir == "c"


def test_settings_are_frozen_and_refuse_unknown_fields() -> None:
    with pytest.raises(ValidationError):
        Settings().max_depth = 3  # type: ignore[misc]
    with pytest.raises(ValidationError):
        Settings(max_dept=3)  # type: ignore[call-arg]


BAD = {
    "REACH_METRICS_PORT": ["http", "0", "70000"],
    "REACH_QUEUE_TYPE": ["stream", "mirrored"],
    "REACH_MAX_INTENT_BYTES": ["lots", "63"],
    "REACH_RECEIPT_TTL": ["3w", "500ms", "0"],
    "REACH_HISTORY_TTL": ["forever", "500ms", "0"],
    "REACH_HISTORY_URL": ["redis://localhost", "mysql://x"],
    "REACH_ROUTER_PREFETCH": ["0", "1.5"],
    "REACH_ROUTER_HOLD_BYTES": ["1024"],
    "REACH_ROUTER_FAIR": ["maybe", "2"],
    "REACH_ROUTER_THREADS": ["0", "-1"],
    "REACH_WORKFLOW_THREADS": ["0", "many"],
    "REACH_WORKFLOW_RETENTION": ["0", "a week"],
    "REACH_WORKFLOW_CRASH_AT": ["now", "after_publishing"],
    "REACH_POOL_PREFETCH_PER_THREAD": ["0", "11"],
    "REACH_LOG_LEVEL": ["LOUD"],
    "REACH_REQUIRE_USER_ID": ["yes please"],
    "REACH_IDEMPOTENCY_TTL": ["forever"],
    "REACH_MAX_DELIVERIES": ["0", "101"],
    "REACH_MAX_DEPTH": ["1"],
    "REACH_MAX_DETAILS": ["0"],
    "REACH_MAX_PENDING_APPROVALS": ["0", "many"],
    "REACH_MAX_RECEIPT_BYTES": ["4095"],
    "REACH_DLQ_MAX_LENGTH": ["0"],
    "REACH_DLQ_MAX_BYTES": ["1023"],
    "REACH_DLQ_TTL": ["1 week"],
    "REACH_DLQ_KEEP_UNPARSABLE": ["sometimes"],
    "REACH_AGENT_INVALID_RATE": ["20/day", "0/sec", "fast"],
    "REACH_SEMANTIC_RATE": ["1/fortnight", "often"],
    "REACH_MCP_URL": ["reach.example/mcp", "ftp://reach.example/mcp", "https://reach.example/mcp?x=1"],
    "REACH_MCP_PORT": ["0", "http"],
    "REACH_MCP_JWT_ALGORITHM": ["none", "ES256"],
    "REACH_MCP_ISSUER_URL": ["idp"],
    "REACH_MCP_WAIT": ["soon", "0"],
    "REACH_MCP_CLIENTS_PER_AGENT": ["0", "65"],
    "REACH_REDIS_URL": ["localhost:6379", "http://h:6379", "redis+cluster:h1:7000"],
    "REACH_REDIS_WAIT_REPLICAS": ["-1", "one", "17"],
    "REACH_REDIS_WAIT_TIMEOUT_MS": ["0", "1s"],
    "REACH_CONSOLE_PORT": ["0", "http"],
    "REACH_CONSOLE_PUBLIC_URL": ["console.example"],
    "REACH_CONSOLE_SECURE_COOKIE": ["maybe"],
    "REACH_CONSOLE_SESSION_TTL": ["soon"],
    "REACH_CONSOLE_LOGIN_RATE": ["fast"],
    "REACH_HTTP_HEADER_TIMEOUT": ["0", "500ms", "never"],
    "REACH_HTTP_BODY_TIMEOUT": ["0", "never"],
    "REACH_HTTP_MAX_CONNECTIONS": ["0", "many"],
    "REACH_HTTP_MAX_CONNECTIONS_PER_CLIENT": ["0"],
    "REACH_BINDING_SWEEP_SECONDS": ["-1", "500ms", "never"],
}


@pytest.mark.parametrize("variable, raw", [(v, raw) for v, values in BAD.items() for raw in values])
def test_a_bad_value_is_refused_naming_the_variable_and_the_value(variable: str, raw: str) -> None:
    with pytest.raises(SettingsError, match=f"^{variable}={re.escape(repr(raw))}: "):
        Settings.from_env({variable: raw})


def test_every_variable_with_a_value_to_refuse_is_covered() -> None:
    free_text = {"REACH_BROKER_URL", "REACH_CATALOG"}
    free_text |= {"REACH_MCP_HOST", "REACH_MCP_TOKENS_FILE", "REACH_MCP_JWT_KEY"}  # an address, a path, a key
    free_text |= {"REACH_CONSOLE_HOST", "REACH_CONSOLE_USERS", "REACH_CONSOLE_SESSION_KEY"}
    free_text |= {"REACH_RABBITMQCTL"}  # a command line
    free_text |= {"REACH_ROUTING_VECTORS"}  # a path (or none)
    assert set(BAD) == set(VARIABLES) - free_text


def test_every_bad_variable_is_named_at_once() -> None:
    with pytest.raises(SettingsError) as caught:
        Settings.from_env({"REACH_MAX_DEPTH": "deep", "REACH_DLQ_TTL": "soon"})
    assert "REACH_MAX_DEPTH='deep'" in str(caught.value) and "REACH_DLQ_TTL='soon'" in str(caught.value)


@pytest.mark.parametrize(
    "raw, seconds",
    [("3600", 3600), ("24h", 86400), ("90m", 5400), ("45s", 45), ("1.5h", 5400), (" 2h ", 7200), ("1500ms", 1)],
)
def test_durations_are_whole_seconds_or_a_duration(raw: str, seconds: int) -> None:
    for variable, field in [
        ("REACH_RECEIPT_TTL", "receipt_ttl_seconds"),
        ("REACH_IDEMPOTENCY_TTL", "idempotency_ttl_seconds"),
        ("REACH_DLQ_TTL", "dlq_ttl_seconds"),
    ]:
        assert getattr(Settings.from_env({variable: raw}), field) == seconds


@pytest.mark.parametrize(
    "raw, value",
    [("1", True), ("0", False), ("true", True), ("FALSE", False), ("yes", True), ("off", False), (" On ", True)],
)
def test_flags_are_1_or_0_true_or_false(raw: str, value: bool) -> None:
    read = Settings.from_env({"REACH_ROUTER_FAIR": raw, "REACH_REQUIRE_USER_ID": raw, "REACH_DLQ_KEEP_UNPARSABLE": raw})
    assert read.router_fair is read.require_user_id is read.dlq_keep_unparsable is value


@pytest.mark.parametrize("raw, kept", [("10/sec", "10/sec"), (" 5 / min ", "5 / min"), ("100/hour", "100/hour")])
def test_rates_are_a_count_per_sec_min_or_hour(raw: str, kept: str) -> None:
    assert Settings.from_env({"REACH_AGENT_INVALID_RATE": raw}).agent_invalid_rate == kept


def test_log_level_is_a_level_name_in_any_case() -> None:
    assert Settings.from_env({"REACH_LOG_LEVEL": "debug"}).log_level == "DEBUG"
    assert Settings(log_level="warning").log_level == "WARNING"


def test_a_misspelt_variable_is_reported_with_the_likely_name(caplog: pytest.LogCaptureFixture) -> None:
    assert Settings.from_env({"REACH_MAX_DEPHT": "3"}) == Settings()
    assert "REACH_MAX_DEPHT is not a setting" in caplog.text and "REACH_MAX_DEPTH" in caplog.text


def test_the_client_reads_only_the_broker_url() -> None:
    assert ClientSettings.from_env({}).broker_url == DEFAULT_BROKER_URL == Settings().broker_url
    assert (
        ClientSettings.from_env({"REACH_BROKER_URL": " amqp://a@b// ", "REACH_MAX_DEPTH": "x"}).broker_url
        == "amqp://a@b//"
    )
    assert env_name(ClientSettings, "broker_url") == "REACH_BROKER_URL"


def test_nothing_reads_the_environment_outside_the_settings() -> None:
    """Configuration is read in one place; the catalog's own variables (secrets, ``${VAR}`` in
    endpoints) are data and are read where the catalog is, from an environ that can be passed in."""
    allowed = {
        "producers/client_settings.py",
        "workers/settings.py",
        "connectors/loader.py",  # ${VAR} in endpoints
        "connectors/adapters/auth/secrets.py",  # the secrets a connector's auth names
        "workers/cli/users.py",  # --password-env VAR: the operator names the variable
        "workers/cli/plugins.py",  # --database-env VAR: the operator names the variable
        "workers/ops/local_fleet.py",  # the environment of the processes demo, tests and bench start
        "workers/observability/tracing.py",  # OpenTelemetry's own OTEL_* variables
    }
    readers = re.compile(r"os\.getenv|os\.environ|environ\.get\(")
    found = sorted(
        str(path.relative_to(REPO))
        for package in ("producers", "connectors", "workers")
        for path in (REPO / package).rglob("*.py")
        if readers.search(path.read_text()) and str(path.relative_to(REPO)) not in allowed
    )
    assert not found, f"read the environment through workers.settings / producers.client_settings instead: {found}"


def test_no_module_reads_the_environment_at_import_time() -> None:
    import ast

    def import_time_nodes(node: ast.AST) -> list[ast.AST]:
        """Nodes evaluated when the module is imported: everything but function bodies."""
        out: list[ast.AST] = []
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                evaluated = [*child.decorator_list, *child.args.defaults, *child.args.kw_defaults]
                out += [n for e in evaluated if e is not None for n in ast.walk(e)]
            elif not isinstance(child, ast.Lambda):
                out += [child, *import_time_nodes(child)]
        return out

    found = []
    for package in ("producers", "connectors", "workers"):
        for path in (REPO / package).rglob("*.py"):
            for node in import_time_nodes(ast.parse(path.read_text())):
                text = ast.unparse(node) if isinstance(node, (ast.Call, ast.Subscript)) else ""
                if re.match(r"^os\.(getenv\(|environ\.get\(|environ\[)", text):
                    found.append(f"{path.relative_to(REPO)}:{getattr(node, 'lineno', '?')}: {text}")
    assert not found, found
