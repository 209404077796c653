"""Waiting for a condition instead of sleeping a fixed time: the one helper every test uses."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_for(
    condition: Callable[[], Any],
    timeout: float,
    message: str,
    every: float = 0.05,
    until: Callable[[Any], Any] = bool,
) -> Any:
    """Call ``condition`` until ``until`` accepts its value (truthy by default) and return that value;
    after ``timeout`` seconds raise AssertionError with ``message``."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if until(value):
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{message} (after {timeout:g} s; last value {repr(value)[:500]})")
        time.sleep(every)
