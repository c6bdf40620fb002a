"""What a worker run's main thread shares with its pool threads (:mod:`kafka_iceberg.batch.worker`'s
thread contract): one immutable value at a time, replaced by the main thread and read under a lock."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Generic, TypeVar

from kafka_iceberg.batch.recovery import Attempt

LIVENESS_MARGIN_MS = 30_000
"""An attempt that started at most this many ms before a :class:`RunsInProgress` was taken counts as
alive whatever its run: its run may have started after the runs were listed, or its host's clock may be
behind (ms since epoch on both sides). Larger only delays the clean-up of a dead attempt to a later micro-batch."""

T = TypeVar("T")


class Latest(Generic[T]):
    """One value the run's main thread replaces and pool threads read, under a lock. The value itself
    must be immutable (a frozen dataclass, a frozenset): a reader keeps the one it got."""

    def __init__(self, value: T):
        self._value, self._lock = value, threading.Lock()

    def get(self) -> T:
        """The value set last."""
        with self._lock:
            return self._value

    def set(self, value: T) -> None:
        """Replace the value."""
        with self._lock:
            self._value = value


@dataclass(frozen=True)
class RunsInProgress:
    """The commit tokens (:func:`~kafka_iceberg.batch.recovery.commit_token`) of the runs in progress when
    they were listed at ``taken_ms`` (ms since epoch), on a run's main thread: what a micro-batch in a pool
    thread decides an attempt's liveness by, without asking the orchestrator itself."""

    tokens: frozenset[str]
    taken_ms: int

    def is_alive(self, attempt: Attempt) -> bool:
        """Whether ``attempt``'s run may still be writing: it was in progress at ``taken_ms``, or the attempt
        started within :data:`LIVENESS_MARGIN_MS` before (or after) it."""
        return attempt.token in self.tokens or attempt.started_ms >= self.taken_ms - LIVENESS_MARGIN_MS


__all__ = ["LIVENESS_MARGIN_MS", "Latest", "RunsInProgress"]
