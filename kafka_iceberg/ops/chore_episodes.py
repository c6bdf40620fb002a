"""Failure episodes of a worker run's chores (maintenance jobs, ``duplicate_free`` checks), so their alerts
post once per episode, as the run-failure alerts do (:mod:`kafka_iceberg.ops.episodes`). Plain Python.

The subject of an episode is one chore of one table (``nyc.flights compact``). Its first failure posts a
``WARN``; the failures after it post nothing; its first success after them posts an ``OK`` with the count of
failures. A worker run keeps the open episodes in memory (:class:`ChoreEpisodes`) and mirrors each in the
table property :data:`FAILING_PROPERTY` (when the episode started, ms since epoch, and its failures), so the
run that takes the table over next (a successor, after a handover or a restart) goes on counting the same
episode instead of posting it again. Writing that property is best effort: when the catalog is what fails,
the episode lives in the run's memory only, and a later run posts it again once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from kafka_iceberg.ops.episodes import Episode, EpisodeBook, Notice, Outcome, advance

FAILING_PROPERTY = "lake.alert.{what}.failing"
"""Table property of an open chore episode: ``<started ms since epoch>:<failures>``; absent: none open."""


def parse_failing(raw: str | None) -> tuple[int, int] | None:
    """(started ms since epoch, failures) of a :data:`FAILING_PROPERTY` value; None for none or a bad value."""
    started, _, failures = (raw or "").partition(":")
    if not (started.isdigit() and failures.isdigit()):
        return None
    return int(started), int(failures)


@dataclass
class ChoreEpisodes:
    """The open chore episodes of one worker run.

    ``read_property(identifier, key)``: the table's property (None when absent; may raise when the catalog
    is unreachable, which counts as absent); ``write_property(identifier, key, value)``: set it (``None``
    removes it; may raise, which is ignored). Both are called from the caller's thread only."""

    read_property: Callable[[str, str], str | None]
    write_property: Callable[[str, str, str | None], object]
    book: EpisodeBook = field(default_factory=EpisodeBook)
    _seen: set[str] = field(default_factory=set)
    _position: int = 0

    def failed(self, identifier: str, what: str, at_ms: int, run_id: str | None = None) -> Notice | None:
        """Note a failure of chore ``what`` on table ``identifier`` at ``at_ms``; the ``started`` notice when
        it opens an episode (post it), else None (an episode already open, in this run or a previous one)."""
        notice = self._fold(identifier, what, False, at_ms, run_id)
        episode = self.book.open.get(f"{identifier} {what}")
        if episode is not None:
            self._write(identifier, what, f"{episode.started_ms}:{episode.failures}")
        return notice

    def succeeded(self, identifier: str, what: str, at_ms: int, run_id: str | None = None) -> Notice | None:
        """Note a success of chore ``what`` on ``identifier``; the ``recovered`` notice (its episode, with every
        failure counted) when it closes one, else None."""
        notice = self._fold(identifier, what, True, at_ms, run_id)
        if notice is not None:
            self._write(identifier, what, None)
        return notice

    def _fold(self, identifier: str, what: str, ok: bool, at_ms: int, run_id: str | None) -> Notice | None:
        subject = f"{identifier} {what}"
        if subject not in self._seen:  # an episode a previous run opened goes on
            self._seen.add(subject)
            self._resume(identifier, what, subject)
        self._position += 1
        self.book, notices = advance(self.book, [Outcome(subject, ok, self._position, at_ms, run_id)])
        return notices[0] if notices else None

    def _resume(self, identifier: str, what: str, subject: str) -> None:
        try:
            opened = parse_failing(self.read_property(identifier, FAILING_PROPERTY.format(what=what)))
        except Exception:  # noqa: BLE001 - the catalog unreachable: as if none were open
            opened = None
        if opened is not None:
            self._position += 1
            episode = Episode(subject, opened[0], None, opened[1], self._position)
            self.book = EpisodeBook({**self.book.open, subject: episode})

    def _write(self, identifier: str, what: str, value: str | None) -> None:
        try:
            self.write_property(identifier, FAILING_PROPERTY.format(what=what), value)
        except Exception:  # noqa: BLE001 - best effort: the episode stays in this run's memory
            pass


__all__ = ["FAILING_PROPERTY", "ChoreEpisodes", "parse_failing"]
