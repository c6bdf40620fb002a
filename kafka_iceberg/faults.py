"""Crash points for failure rehearsal.

The write path calls :func:`crash_point` between its durable steps. When the environment
variable ``LAKE_CRASH_AT`` names that point, the process kills itself with SIGKILL: no
``finally`` block, no Spark abort, no cleanup, exactly like an OOM kill or a lost node.
The tests and the rehearsal use it to prove that every crash point is recoverable.
Unset (the default), it does nothing.

Points, in write-path order: ``after_branch`` (attempt branch created),
``after_read`` (records read from Kafka), ``after_write`` (data files written and
committed to the attempt branch, not published), ``after_publish`` (``main``
fast-forwarded; branch not dropped, consumer group not committed).
"""

from __future__ import annotations

import os
import signal

CRASH_POINTS = ("after_branch", "after_read", "after_write", "after_publish")
ENV = "LAKE_CRASH_AT"


def crash_point(name: str) -> None:
    """SIGKILL this process if ``LAKE_CRASH_AT`` equals ``name``; otherwise return at once."""
    if name not in CRASH_POINTS:
        raise ValueError(f"unknown crash point {name!r}")
    if os.environ.get(ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)
