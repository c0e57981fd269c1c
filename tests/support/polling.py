"""Waiting in tests for something another process does, without a wall-clock expectation."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def eventually(probe: Callable[[], T], what: str, timeout: float = 30.0) -> T:
    """Poll ``probe`` until it returns something truthy and return that; fail after ``timeout`` seconds.

    ``timeout`` bounds a broken build's wait; it is never an expected duration.
    """
    deadline = time.monotonic() + timeout
    while True:
        result = probe()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)
