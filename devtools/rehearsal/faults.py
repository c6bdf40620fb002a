"""Crash points for failure rehearsal: a crash hook for the write path that kills the process.

The write path calls its ``crash_hook`` at each of
:data:`kafka_iceberg.batch.context.CRASH_POINTS` (``after_branch``, ``after_read``,
``after_write``, ``after_publish``). :func:`env_crash_hook` returns a hook that, when the
environment variable ``LAKE_CRASH_AT`` names the point, kills the process with SIGKILL: no
``finally`` block, no Spark abort, no cleanup, exactly like an OOM kill or a lost node. The
tests and the rehearsal pass it to processes they mean to kill.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Mapping

from kafka_iceberg.batch.context import CRASH_POINTS
from kafka_iceberg.batch.group_commit import GROUP_CRASH_POINTS
from kafka_iceberg.batch.group_marker import MARKER_CRASH_POINTS

ENV = "LAKE_CRASH_AT"


def kill_at(point: str) -> Callable[[str], None]:
    """A crash hook that SIGKILLs this process at ``point``.

    Raises:
        ValueError: ``point`` is not one of :data:`CRASH_POINTS`, ``GROUP_CRASH_POINTS`` or
            ``MARKER_CRASH_POINTS`` (a group commit's, in one transaction or table by table).
    """
    points = CRASH_POINTS + GROUP_CRASH_POINTS + MARKER_CRASH_POINTS
    if point not in points:
        raise ValueError(f"unknown crash point {point!r}; one of {points}")

    def hook(name: str) -> None:
        if name == point:
            os.kill(os.getpid(), signal.SIGKILL)

    return hook


def env_crash_hook(env: Mapping[str, str] | None = None) -> Callable[[str], None]:
    """The hook ``LAKE_CRASH_AT`` asks for (from ``env``, default ``os.environ``): :func:`kill_at` that
    point, or a no-op when unset."""
    point = (os.environ if env is None else env).get(ENV)
    return kill_at(point) if point else (lambda name: None)


__all__ = ["CRASH_POINTS", "ENV", "env_crash_hook", "kill_at"]
