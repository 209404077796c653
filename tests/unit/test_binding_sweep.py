"""The beat's sweep of agents' exchange bindings: on its interval, off at 0, and a failure is a
warning and a metric, never the end of the beat."""

from __future__ import annotations

import logging
import threading

import pytest

from workers.observability.metrics import BINDING_SWEEPS
from workers.ops.agents import AgentUserError
from workers.ops.binding_sweep import BindingSweep
from workers.settings import Settings


def count(outcome: str) -> float:
    return BINDING_SWEEPS.labels(outcome=outcome)._value.get()


def test_zero_turns_the_sweep_off_and_the_default_is_every_five_minutes() -> None:
    assert BindingSweep.from_settings(Settings(binding_sweep_seconds=0)) is None
    assert Settings().binding_sweep_seconds == 300
    assert Settings.from_env({"REACH_BINDING_SWEEP_SECONDS": "10m"}).binding_sweep_seconds == 600


def test_a_failed_sweep_is_logged_and_counted_and_the_next_one_still_runs(caplog: pytest.LogCaptureFixture) -> None:
    calls: list[int] = []
    done = threading.Event()

    def sweep() -> int:
        calls.append(1)
        if len(calls) == 1:
            raise AgentUserError("'rabbitmqctl' not found")
        done.set()
        return 2

    failed, swept = count("failed"), count("swept")
    sweeper = BindingSweep(0.05, sweep)
    with caplog.at_level(logging.WARNING, "reach.beat"):
        sweeper.start()
        assert done.wait(5)
        sweeper.stop()
        sweeper.join(5)
    assert count("failed") == failed + 1 and count("swept") >= swept + 1
    assert "not swept" in caplog.text and "removed 2 exchange-to-exchange binding(s)" in caplog.text


def test_the_first_sweep_waits_one_interval() -> None:
    calls: list[int] = []
    sweeper = BindingSweep(60, lambda: calls.append(1) or 0)
    sweeper.start()
    sweeper.stop()
    sweeper.join(5)
    assert calls == []
