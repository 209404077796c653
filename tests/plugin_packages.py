"""Small plugin packages installed for a test: a module and a ``*.dist-info`` with its own
entry_points.txt in a directory put on sys.path, so importlib.metadata finds real entry points."""

from __future__ import annotations

import textwrap
from pathlib import Path

GOOD_PREAMBLE = """
from connectors.adapters.plugin import CONTRACT_VERSION, Guarantees, Manifest
from producers.wire import ErrorCode
"""

# An adapter that wraps the built-in http adapter, for the kit's negative tests: its fixture is the
# built-in http fixture with the credential moved into the plugin's own config.
WRAPPER = """
import logging
from typing import Any

from pydantic import BaseModel, ConfigDict

from connectors.adapters.base import AdapterOptions, Outcome
from connectors.adapters.builtin.fixtures import http_fixture
from connectors.adapters.http import HttpAdapter
from connectors.adapters.kit import Fixture
from connectors.adapters.plugin import CONTRACT_VERSION, Guarantees, Manifest
from connectors.spec import ConnectorSpec
from producers.wire import ErrorCode


class Config(BaseModel):
    model_config = ConfigDict(extra="forbid")
    token_env: str


class ActionConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: str


manifest = Manifest(
    type="{kind}",
    contract_version=CONTRACT_VERSION,
    description="a deliberately broken adapter",
    connector_config=Config,
    action_config=ActionConfig,
    guarantees=Guarantees(idempotency_key=True, timeout_may_land=True),
    errors={{"any": ErrorCode.DOWNSTREAM_ERROR, "timeout": ErrorCode.OUTCOME_UNKNOWN,
            "t2": ErrorCode.DOWNSTREAM_TIMEOUT, "down": ErrorCode.DOWNSTREAM_UNREACHABLE}},
    conformance="{module}:fixture",
)


def fixture(downstream, context):
    inner = http_fixture(downstream, context)

    def connector(reachable, idempotency):
        doc = inner.connector(reachable, idempotency)
        doc["type"] = "{kind}"
        doc["config"] = {{"token_env": doc.pop("auth")["token_env"]}}
        for action in doc["actions"]:
            action["config"] = {{"path": action.pop("path")}}
        return doc

    return Fixture(connector=connector, close=inner.close, secret=inner.secret, environ=inner.environ)


class Broken:
    def __init__(self, connector, config, options):
        doc = connector.model_dump(by_alias=True, exclude_unset=True)
        doc.pop("config")
        for action in doc["actions"]:
            action["path"] = action.pop("config")["path"]
        doc.update(type="http", auth={{"type": "bearer", "token_env": config.token_env}})
        self.inner = HttpAdapter(ConnectorSpec.model_validate(doc), environ=options.environ)
        self.token = options.environ[config.token_env]

    def probe(self, timeout):
        return self.inner.probe(timeout)

    def close(self):
        self.inner.close()

{body}


def build(connector, config, options):
    return Broken(connector, config, options)
"""

DOUBLE_SEND = """
    def call(self, action, params, ctx):
        action = self.inner.connector.action(action.action)  # the same action, as the http type's
        outcome = self.inner.call(action, params, ctx)
        if not outcome.ok:  # "one more try can't hurt": it can, on a write
            outcome = self.inner.call(action, params, ctx)
        return outcome
"""

LEAKY = """
    def call(self, action, params, ctx):
        action = self.inner.connector.action(action.action)  # the same action, as the http type's
        outcome = self.inner.call(action, params, ctx)
        if not outcome.ok:
            logging.getLogger("leaky").warning("call failed with token %s", self.token)
        return outcome
"""

CARELESS = """
    def call(self, action, params, ctx):
        import dataclasses

        action = self.inner.connector.action(action.action)
        # ignores the intent's deadline and drops its idempotency key
        return self.inner.call(action, params, dataclasses.replace(ctx, timeout=30.0, idempotency_key=None))
"""


def install(root: Path, package: str, module: str, entry_points: dict[str, str], source: str) -> None:
    """Write ``module`` (a package's __init__) and the dist-info of ``package`` declaring
    ``entry_points`` (type -> module) in the group agent_reach.adapters, under ``root``."""
    (root / module).mkdir(parents=True)
    (root / module / "__init__.py").write_text(textwrap.dedent(source))
    dist = root / f"{package.replace('-', '_')}-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {package}\nVersion: 0.1\n")
    lines = "".join(f"{name} = {target}\n" for name, target in entry_points.items())
    (dist / "entry_points.txt").write_text(f"[agent_reach.adapters]\n{lines}")


def manifest_source(kind: str, version: str = "CONTRACT_VERSION", extra: str = "") -> str:
    return (
        GOOD_PREAMBLE
        + f"""
manifest = Manifest(
    type="{kind}",
    contract_version={version},
    description="a test plugin",
    guarantees=Guarantees(idempotency_key=False, timeout_may_land=True),
    errors={{"any": ErrorCode.DOWNSTREAM_ERROR}},
)


def build(connector, config, options):
    raise AssertionError("not built in these tests")
{extra}
"""
    )


def install_zoo(root: Path, tag: str) -> dict[str, str]:
    """The broken plugins of the issue and two deliberately bad adapters; ``tag`` keeps module
    names unique in one test session. Returns type -> package."""
    install(
        root,
        f"reach-import-{tag}",
        f"reach_import_{tag}",
        {f"grpcish{tag}": f"reach_import_{tag}"},
        "import grpc_that_is_not_installed  # noqa\n",
    )
    install(
        root,
        f"reach-old-{tag}",
        f"reach_old_{tag}",
        {f"old{tag}": f"reach_old_{tag}"},
        manifest_source(f"old{tag}", version="99"),
    )
    install(
        root,
        f"reach-invalid-{tag}",
        f"reach_invalid_{tag}",
        {f"invalid{tag}": f"reach_invalid_{tag}"},
        f"manifest = {{'type': 'invalid{tag}', 'contract_version': 1, 'description': 'x', 'errors': {{}}}}\n"
        "def build(c, k, o):\n    pass\n",
    )
    install(root, f"reach-clash-{tag}", f"reach_clash_{tag}", {"http": f"reach_clash_{tag}"}, manifest_source("http"))
    install(
        root,
        f"reach-crashy-{tag}",
        f"reach_crashy_{tag}",
        {f"crashy{tag}": f"reach_crashy_{tag}"},
        manifest_source(f"crashy{tag}"),
    )  # its build raises AssertionError
    for bad, body in (("double", DOUBLE_SEND), ("leaky", LEAKY), ("careless", CARELESS)):
        module = f"reach_{bad}_{tag}"
        install(
            root,
            f"reach-{bad}-{tag}",
            module,
            {f"{bad}{tag}": module},
            WRAPPER.format(kind=f"{bad}{tag}", module=module, body=body),
        )
    return {
        f"grpcish{tag}": f"reach-import-{tag}",
        f"old{tag}": f"reach-old-{tag}",
        f"invalid{tag}": f"reach-invalid-{tag}",
    }
