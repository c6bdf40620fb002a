"""Waiting for a condition in the dev tools (rehearsals, the Kubernetes stand-in)."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_for(predicate: Callable[[], object], timeout_s: float, poll_s: float = 0.5):
    """``predicate()``'s first truthy value within ``timeout_s`` seconds (polled every ``poll_s``), else its
    last value."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(poll_s)
