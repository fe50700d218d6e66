"""Bounded waits for the tests: poll a condition until it holds or a deadline passes."""

from __future__ import annotations

import time


def wait_for(what: str, ready, timeout: float = 120, interval: float = 0.1) -> None:
    """Poll ``ready()`` until it is true; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(interval)
