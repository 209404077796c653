"""The conformance kit: one suite of the guarantees a receipt makes, run against any adapter
(``reach plugins check TYPE``).

The plugin's fixture (connectors/adapters/kit.py) starts a fake system of its protocol that does
what the kit's script says; the kit builds the adapter exactly as a pool does, calls it as a pool
does (the pool's own retry loop, workers/pool/retry.py, with the connector's idempotency rule),
and reads back what the system received. Each row is one guarantee, PASS or FAIL with what was
seen; a guarantee the manifest does not claim is SKIP, never a PASS it did not earn.
"""

from __future__ import annotations

import functools
import importlib
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from connectors.adapters.base import Adapter, AdapterOptions, CallContext, Outcome
from connectors.adapters.kit import Downstream, Fixture, FixtureFactory, KitContext
from connectors.adapters.plugin import ADAPTER_CODES
from connectors.adapters.registry import Plugin, Registry, registry
from connectors.spec import ConnectorSpec, RetryPolicy
from producers.wire import ErrorCode
from workers.ops.conformance_rows import (
    KIT_DEPTH,
    STEPS,
    THREADS,
    TIMEOUT,
    AdapterRaised,
    Row,
    Status,
)
from workers.pool.retry import run_with_retries

RETRY = RetryPolicy(max_attempts=3, initial_backoff=0.01, max_backoff=0.02)


class KitError(Exception):
    """The kit cannot run for this type (not installed, refused, no fixture)."""


def check(kind: str, plugins: Registry | None = None, context: KitContext | None = None) -> list[Row]:
    """Run the suite against the adapter of type ``kind``; raises KitError when it cannot run
    (``context``: what fixtures may use, such as the fleet's broker)."""
    plugins = plugins or registry()
    plugin = plugins.get(kind)
    if plugin is None or plugin.manifest is None:
        raise KitError(plugins.refusal(kind) or f"type {kind!r} is not installed")
    if not plugin.manifest.conformance:
        raise KitError(f"plugin {kind} ({plugin.package}) declares no conformance fixture (manifest.conformance)")
    factory = _resolve(plugin.manifest.conformance)
    downstream = Downstream()
    try:
        fixture = factory(downstream, context or KitContext())
    except Exception as exc:  # a fixture that cannot start says why; the kit has nothing to run
        raise KitError(f"the conformance fixture of {kind} could not start: {type(exc).__name__}: {exc}") from exc
    suite = Suite(plugin, fixture, downstream, context or KitContext())
    try:
        with suite.logs():
            return suite.run()
    finally:
        suite.close()
        fixture.close()


def _resolve(target: str) -> FixtureFactory:
    module, _, attr = target.partition(":")
    try:
        found: FixtureFactory = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise KitError(f"conformance fixture {target!r} cannot be loaded: {exc}") from exc
    return found


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if record.exc_info:
            text += "\n" + logging.Formatter().formatException(record.exc_info)
        self.lines.append(text)


class Suite:
    """The rows, in order; every outcome and log line is kept for the last two rows."""

    def __init__(self, plugin: Plugin, fixture: Fixture, downstream: Downstream, context: KitContext) -> None:
        assert plugin.manifest is not None
        self.context = context
        self.plugin = plugin
        self.manifest = plugin.manifest
        self.fixture = fixture
        self.downstream = downstream
        self.outcomes: list[Outcome] = []
        self.capture = _Capture()
        self._built: dict[tuple[bool, bool], tuple[ConnectorSpec, Adapter]] = {}
        self._n = 0
        self.last_attempts: list[Outcome] = []  # each attempt of the last ``retried`` call

    @contextmanager
    def logs(self) -> Iterator[None]:
        root = logging.getLogger()
        level = root.level
        root.addHandler(self.capture)
        root.setLevel(logging.DEBUG)
        try:
            yield
        finally:
            root.removeHandler(self.capture)
            root.setLevel(level)

    def close(self) -> None:
        for _, adapter in self._built.values():
            adapter.close()

    def adapter(self, reachable: bool = True, idempotency: bool = False) -> tuple[ConnectorSpec, Adapter]:
        if (reachable, idempotency) not in self._built:
            connector = ConnectorSpec.model_validate(self.fixture.connector(reachable, idempotency))
            config = self.manifest.parse_connector(connector)
            options = AdapterOptions(
                max_connections=THREADS,
                max_depth=KIT_DEPTH,
                environ=self.fixture.environ,
                broker_url=self.context.broker_url,
            )
            self._built[(reachable, idempotency)] = (connector, self.plugin.build(connector, config, options))
        return self._built[(reachable, idempotency)]

    def call(
        self, built: tuple[ConnectorSpec, Adapter], name: str, q: str, key: str | None = None, timeout: float = 5.0
    ) -> Outcome:
        connector, adapter = built
        action = connector.action(name)
        assert action is not None, f"the fixture's connector has no action {name}"
        self._n += 1
        ctx = CallContext(
            intent_id=f"kit-intent-{self._n}",
            idempotency_key=key,
            timeout=timeout,
            max_depth=KIT_DEPTH,
            connector=connector.name,
            action=name,
        )
        try:
            outcome = adapter.call(action, {"q": q}, ctx)
        except Exception as exc:  # the pool would answer INTERNAL; the kit names the bug
            outcome = Outcome(False, code=ErrorCode.INTERNAL, message=f"the adapter raised {type(exc).__name__}")
            self.outcomes.append(outcome)
            raise AdapterRaised(f"the adapter raised {type(exc).__name__}: {str(exc)[:120]}") from exc
        self.outcomes.append(outcome)
        return outcome

    def retried(self, built: tuple[ConnectorSpec, Adapter], name: str, key: str | None) -> tuple[Outcome, int]:
        """A call through the pool's own retry loop: the last outcome and the attempts."""
        connector, _ = built
        action = connector.action(name)
        assert action is not None
        self.last_attempts = []
        result = run_with_retries(
            lambda: self.call(built, name, "kit-0-0", key, TIMEOUT),
            RETRY,
            safe_to_repeat=connector.safe_to_repeat(action),
            sleep=lambda s: None,
            after_attempt=lambda n, outcome: self.last_attempts.append(outcome),
        )
        return result.outcome, result.attempts

    def run(self) -> list[Row]:
        rows = [_row(title, functools.partial(step, self)) for title, step in STEPS]
        rows.append(_row("secrets never appear in receipts, logs or errors", self.no_secrets))
        rows.append(_row("every error maps to a code the manifest documents", self.documented_codes))
        return rows

    def no_secrets(self) -> tuple[Status, str]:
        secret = self.fixture.secret
        leaks = [f"an outcome ({o.code})" for o in self.outcomes if secret in repr(o)]
        leaks += ["a log line" for line in self.capture.lines if secret in line]
        if leaks:
            return "FAIL", f"the credential appeared in {len(leaks)} place(s), first in {leaks[0]}"
        return "PASS", f"{len(self.outcomes)} outcomes and {len(self.capture.lines)} log lines checked"

    def documented_codes(self) -> tuple[Status, str]:
        documented = set(self.manifest.errors.values())
        bad = sorted(
            {
                str(o.code)
                for o in self.outcomes
                if not o.ok and (o.code is None or o.code not in ADAPTER_CODES or o.code not in documented)
            }
        )
        wrong_ok = [o for o in self.outcomes if o.ok and o.code is not None]
        if bad or wrong_ok:
            return "FAIL", f"undocumented codes: {', '.join(bad) or '-'}; successes with a code: {len(wrong_ok)}"
        seen = sorted({str(o.code) for o in self.outcomes if not o.ok})
        return "PASS", f"seen: {', '.join(seen)}"


def _row(title: str, step: Callable[[], tuple[Status, str]]) -> Row:
    started = time.monotonic()
    try:
        status, detail = step()
    except AdapterRaised as exc:
        status, detail = "FAIL", str(exc)
    except Exception as exc:  # the fixture or the build failed: the row cannot pass
        status, detail = "FAIL", f"the row could not run: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    return Row(title, status, f"{detail} ({time.monotonic() - started:.1f} s)")


__all__ = ["KitError", "Row", "check"]
