"""Failure episodes and relaunch backoff. Plain Python, no Dagster.

An *episode* is the time a subject (a table, e.g. ``nyc.flights``, or a job, e.g. ``job lake_worker_0``)
spends failing: it starts with its first failed run and ends with its first success after it (a
successful run, or a commit of the table). :func:`advance` folds run outcomes into the open episodes and
says what to post: one notice when an episode starts, one when it ends (with the count of failed runs in
between), nothing for the failures in between. The ``run_failure_alert_sensor``
(:mod:`kafka_iceberg.sensors.alerts`) keeps the open episodes in its cursor (:meth:`EpisodeBook.to_json`).

:func:`relaunch_backoff_s` and :func:`relaunch_wait_s` space out the relaunches of a subject whose runs keep
failing: 30 s after the first failure, doubling, at most :data:`RELAUNCH_CAP_S`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

FAILED_TABLES_TAG = "lake/failed_tables"
"""Run tag a worker run sets before it fails because tables failed (their identifiers, comma-separated): the
run served; its failure is those tables' (their episodes), not the worker's (no relaunch backoff)."""
RELAUNCH_BASE_S = 30.0
"""Seconds a subject waits before its relaunch after one failed run (doubles with each further one)."""
RELAUNCH_CAP_S = 900.0
"""The longest wait between relaunches, in seconds (reached after 6 consecutive failed runs)."""


@dataclass(frozen=True)
class Outcome:
    """One run outcome for one subject.

    Attributes:
        subject: a table identifier (``nyc.flights``) or ``job <name>``.
        ok: ``True`` for a success (a successful run, a commit of the table), ``False`` for a failed run.
        position: the order of outcomes (the Dagster event's storage id); outcomes are folded in this order.
        at_ms: when it happened, ms since epoch.
        run_id: the Dagster run it came from, if any.
        key_path: the subject's asset key parts (``["lake", "nyc", "flights"]``; empty for a job).
        detail: what the caller wants back in the notice (the failure's alert, the recovering run); opaque here.
    """

    subject: str
    ok: bool
    position: int
    at_ms: int
    run_id: str | None = None
    key_path: tuple[str, ...] = ()
    detail: Any = None


@dataclass(frozen=True)
class Episode:
    """An open episode: its subject, when it started (ms since epoch), its first failed run, how many
    runs failed so far (>= 1), and the position (storage id) of the latest failure."""

    subject: str
    started_ms: int
    first_run_id: str | None
    failures: int
    last_position: int
    key_path: tuple[str, ...] = ()


@dataclass(frozen=True)
class Notice:
    """What to post: ``started`` (the first failure of an episode) or ``recovered`` (its end); ``episode``
    as it stands then (for ``recovered``: every failed run counted); ``outcome``: the outcome that caused it."""

    kind: Literal["started", "recovered"]
    episode: Episode
    outcome: Outcome


@dataclass(frozen=True)
class EpisodeBook:
    """The open episodes by subject. Immutable: :func:`advance` returns a new book."""

    open: dict[str, Episode] = field(default_factory=dict)

    def to_json(self) -> dict:
        """A JSON-serializable dict: subject -> [started_ms, first_run_id, failures, last_position, key_path]."""
        return {
            s: [e.started_ms, e.first_run_id, e.failures, e.last_position, list(e.key_path)]
            for s, e in self.open.items()
        }

    @classmethod
    def from_json(cls, data: dict | None) -> EpisodeBook:
        """The book of :meth:`to_json`'s dict (``None`` or ``{}``: no open episode).

        Raises:
            ValueError, TypeError: ``data`` is not what :meth:`to_json` wrote.
        """
        episodes = {}
        for subject, (started, run_id, failures, position, key_path) in (data or {}).items():
            episodes[subject] = Episode(subject, int(started), run_id, int(failures), int(position), tuple(key_path))
        return cls(episodes)


def advance(book: EpisodeBook, outcomes: Iterable[Outcome]) -> tuple[EpisodeBook, list[Notice]]:
    """Fold ``outcomes`` (sorted here by position) into ``book``.

    A failure of a subject with no open episode opens one (a ``started`` notice); a failure of a subject
    with one counts in it (no notice); a success after the episode's latest failure closes it (a
    ``recovered`` notice carrying the count); a success with no open episode, or older than the episode's
    latest failure, changes nothing. Returns the new book and the notices, in position order. Pure.
    """
    episodes = dict(book.open)
    notices: list[Notice] = []
    for o in sorted(outcomes, key=lambda o: o.position):
        current = episodes.get(o.subject)
        if not o.ok:
            if current is None:
                episodes[o.subject] = Episode(o.subject, o.at_ms, o.run_id, 1, o.position, tuple(o.key_path))
                notices.append(Notice("started", episodes[o.subject], o))
            else:
                episodes[o.subject] = dataclasses.replace(
                    current, failures=current.failures + 1, last_position=max(current.last_position, o.position)
                )
        elif current is not None and o.position > current.last_position:
            notices.append(Notice("recovered", episodes.pop(o.subject), o))
    return EpisodeBook(episodes), notices


def relaunch_backoff_s(failures: int, base_s: float = RELAUNCH_BASE_S, cap_s: float = RELAUNCH_CAP_S) -> float:
    """Seconds to wait before relaunching a subject after ``failures`` consecutive failed runs: 0 for none,
    then ``base_s`` * 2 ** (failures - 1), at most ``cap_s`` (defaults: 30, 60, 120, 240, 480, then 900 s)."""
    if failures <= 0:
        return 0.0
    return float(min(cap_s, base_s * 2 ** min(failures - 1, 30)))


def relaunch_wait_s(finished: Sequence[tuple[bool, float | None]], now_s: float) -> float:
    """Seconds left before the next relaunch may start (0: now).

    Args:
        finished: the subject's latest finished runs, newest first, as (succeeded, end time in seconds
            since epoch, or ``None`` when unknown); the failures before the newest success count.
        now_s: seconds since epoch.
    """
    failures = 0
    for ok, _ in finished:
        if ok:
            break
        failures += 1
    if failures == 0:
        return 0.0
    ended = finished[0][1]
    waited = 0.0 if ended is None else max(0.0, now_s - ended)
    return max(0.0, relaunch_backoff_s(failures) - waited)


def dumps(cursor: dict[str, Any]) -> str:
    """Compact JSON text of a sensor cursor (sorted keys, so equal states give equal text)."""
    return json.dumps(cursor, sort_keys=True, separators=(",", ":"))


__all__ = [
    "FAILED_TABLES_TAG",
    "RELAUNCH_BASE_S",
    "RELAUNCH_CAP_S",
    "Episode",
    "EpisodeBook",
    "Notice",
    "Outcome",
    "advance",
    "dumps",
    "relaunch_backoff_s",
    "relaunch_wait_s",
]
