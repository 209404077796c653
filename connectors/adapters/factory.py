"""Builds a connector's adapter from the plugin registered for its ``type`` (connectors/adapters/
registry.py): the built-ins and third parties' plugins alike. Each plugin's module (and its
library: zeep, SQLAlchemy, ...) is imported only when a connector of its type is built.

A connector whose type no usable plugin serves, or whose ``config`` its plugin's model refuses,
gets an :class:`Unavailable` adapter: its intents are answered CONNECTOR_UNAVAILABLE (nothing
sent) with the reason, its health probe says down, and the pool serves its other connectors.
"""

from __future__ import annotations

import logging
from typing import Any

from pydantic import ValidationError

from connectors.adapters.auth import MissingSecret
from connectors.adapters.base import Adapter, AdapterOptions, CallContext, Outcome, ProbeResult
from connectors.adapters.registry import registry
from connectors.spec import ActionSpec, ConnectorSpec
from producers.wire import ErrorCode

log = logging.getLogger("reach.plugins")
UNAVAILABLE_RETRY_MS = 60_000  # a plugin comes back only with a deploy: no sooner than a minute


class Unavailable:
    """The adapter of a connector that cannot be served: it answers every call with the reason."""

    def __init__(self, connector: ConnectorSpec, reason: str) -> None:
        self.reason = reason
        self._message = f"connector {connector.name} cannot be served: {reason}"[:500]

    def call(self, action: ActionSpec, params: dict[str, Any], ctx: CallContext) -> Outcome:
        return Outcome(
            False,
            code=ErrorCode.CONNECTOR_UNAVAILABLE,
            message=self._message,
            suggestion="Tell an operator: the connector's plugin is missing or refused (`reach plugins list`).",
            retry_after_ms=UNAVAILABLE_RETRY_MS,
            sent=False,
        )

    def probe(self, timeout: float) -> ProbeResult:
        return ProbeResult(False, self._message)

    def close(self) -> None:
        pass


def build_adapter(connector: ConnectorSpec, options: AdapterOptions | None = None) -> Adapter:
    """The adapter for ``connector``. Raises MissingSecret when a secret it names is not set (and
    ValueError for one that is not usable), as before plugins; a type no plugin serves is not an
    exception but an :class:`Unavailable` adapter (logged once per connector)."""
    options = options or AdapterOptions()
    plugins = registry()
    plugin = plugins.get(connector.type)
    if plugin is None or plugin.manifest is None:
        return _unavailable(connector, plugins.refusal(connector.type) or "no plugin")
    try:
        config = plugin.manifest.parse_connector(connector)
    except (ValidationError, ValueError) as exc:
        problems = plugin.manifest.config_problems(connector) or [((), str(exc).splitlines()[0])]
        return _unavailable(connector, f"its config does not fit plugin {plugin.type}: {problems[0][1]}")
    for _, message in plugin.manifest.config_problems(connector):  # the actions' config
        return _unavailable(connector, f"its config does not fit plugin {plugin.type}: {message}")
    if plugin.builtin:
        return plugin.build(connector, config, options)
    try:
        return plugin.build(connector, config, options)
    except (MissingSecret, ValueError):
        raise  # a secret not set or not usable: the process's configuration, as for the built-ins
    except Exception as exc:  # a third party's bug must not stop the pool's other connectors
        return _unavailable(
            connector, f"plugin {plugin.type} ({plugin.package}) failed to build it: {type(exc).__name__}: {exc}"
        )


def _unavailable(connector: ConnectorSpec, reason: str) -> Adapter:
    log.error("connector %s is not served: %s", connector.name, reason)
    return Unavailable(connector, reason)


def system_problems(connector: ConnectorSpec) -> list[str]:
    """What ``reach validate`` learns by asking the system's own description: a soap connector's
    operations and params checked against its WSDL; a sql connector's URL names a database the
    adapter speaks; whatever a plugin's ``problems`` hook finds. Empty for types with nothing to check."""
    plugin = registry().get(connector.type)
    hook = plugin.problems_hook() if plugin is not None else None
    if hook is None or plugin is None:
        return []
    try:
        found: list[str] = hook(connector)
    except Exception as exc:  # a third party's check that breaks is one problem, not a crash
        if plugin.builtin:
            raise
        return [f"plugin {plugin.type} ({plugin.package}) could not check it: {type(exc).__name__}: {exc}"]
    return found


def plugin_problems(connector: ConnectorSpec) -> list[tuple[tuple[Any, ...], str]]:
    """What ``reach validate`` says about a connector's type and ``config``, each with where it
    is under ``connector`` (for its line): a type no usable plugin serves (naming the package and
    why it was refused), or config keys its plugin's models refuse."""
    plugins = registry()
    plugin = plugins.get(connector.type)
    if plugin is None or plugin.manifest is None:
        return [(("type",), f"type {connector.type!r}: {plugins.refusal(connector.type)}")]
    return plugin.manifest.config_problems(connector)
