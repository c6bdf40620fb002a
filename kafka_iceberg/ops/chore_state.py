"""The chores of a worker run as values: one :class:`TableChores` per table, and the next chore a pure
function of those values and the clock (:func:`next_chore`). Plain Python, no Dagster, no threads:
:class:`kafka_iceberg.lake_assets.worker_chores.WorkerChores` keeps the values, replaces them on the
run's main thread only, and does the chore this module names.

Times named ``*_s`` are seconds of the run's monotonic clock; a *ticket* is the run's count of
commits, which orders the tables (the least recently committed table's check goes first; the table that
passed a ceiling first is trimmed first).

A table whose last commit left it more than ``maintenance.max_snapshots`` snapshots has them expired
by count as the next chore, down to ``retain_last`` (:func:`kafka_iceberg.ops.maintenance.expire`):
a streaming table commits up to a few times a second, and each snapshot makes every later commit
slower. Its pending check runs first, unless one started within :data:`TRIM_CHECK_S`, and the expiry
keeps the snapshots that check will read from, so the check stays incremental; while another run of the
worker's job is in progress, expiries wait (:data:`EXPIRY_HOLD_S`). Likewise a table whose
commits in this run added ``maintenance.compact_after_data_files`` data files since its last compaction
is compacted as the next chore: each micro-batch adds at least one data file, and each commit that
merges manifests (about one in a hundred) rewrites an entry per data file, so the table's tail latency
grows with them.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from kafka_iceberg.declaration.spec import TableSpec

CHECK = "duplicate_free"
"""The check a worker run keeps up with on each table it commits to."""

CEILING_JOBS = ("expire_snapshots", "compact")
"""The maintenance jobs a table's own commits make due (``max_snapshots``, ``compact_after_data_files``),
in the order they go when one commit passes both."""

CHECK_EVERY_S = 300.0
"""Seconds between two ``duplicate_free`` checks of one table within a worker run (as often as a
sensor-launched run of the table would check it, at the end of its budget)."""

CHECK_SPACING_S = 6.0
"""Seconds between the starts of two ``duplicate_free`` checks of one worker run while some table has records
waiting: a run serving many tables spreads its checks (100 tables: each every 10 min at most) instead of
running them back to back, which took a core's Spark JVM from the micro-batches for a minute every 5 min."""

EXPIRY_HOLD_S = 900.0
"""Seconds at most a worker run holds its snapshot expiries (by count and scheduled) while another run of its
job is in progress: at a hand-over, the predecessor's last checks read the snapshots it committed since its
previous checks (incremental, about a second each), which the successor's expiry would remove and turn into
full scans of the tables. Meanwhile a table may pass ``max_snapshots`` by that time's commits, expired one
table at a time afterwards. A run that never ends (its process killed before run monitoring fails it) must not
stop the expiry for longer."""

TRIM_CHECK_S = 30.0
"""Seconds within which a started ``duplicate_free`` check lets a table past its ``max_snapshots`` be
expired without another one first (the expiry keeps the snapshots committed after its start); and the
least time between two expiries by count of one table."""


class Chore(NamedTuple):
    """A chore running in the background thread: ``what`` (``duplicate_free``, or the maintenance job
    ``expire_snapshots`` or ``compact``) on table ``identifier``, started at ``started`` (monotonic s);
    ``after``: the snapshot the table's check reads after; ``future``: its outcome."""

    identifier: str
    started: float
    after: int | None
    future: Future
    what: str


@dataclass(frozen=True)
class Ceiling:
    """A job of :data:`CEILING_JOBS` on one table: ``passed``, the ticket of the commit that passed its
    ceiling (None: below it); ``started_s``, when it last started by count (None: not in this run)."""

    passed: int | None = None
    started_s: float | None = None


@dataclass(frozen=True)
class TableChores:
    """One table's chore state in a worker run. ``pending_since``: when its first commit since its last
    check started was noted (None: no check pending); ``last_commit``: the ticket of its latest commit;
    ``checked_s`` and ``checked_after``: when its last collected check started, and the snapshot of
    ``main`` that check covered (its next check reads the rows added after it; None: from the run's first
    commit); ``files_added``: data files its commits added since its last compaction; ``ceilings``: job
    -> :class:`Ceiling`."""

    spec: TableSpec
    pending_since: float | None = None
    last_commit: int = 0
    checked_s: float | None = None
    checked_after: int | None = None
    files_added: int = 0
    ceilings: Mapping[str, Ceiling] = field(default_factory=lambda: {k: Ceiling() for k in CEILING_JOBS})

    def ceiling(self, kind: str) -> Ceiling:
        """The :class:`Ceiling` of job ``kind`` (one of :data:`CEILING_JOBS`)."""
        return self.ceilings[kind]

    def with_ceiling(self, kind: str, **changes) -> TableChores:
        """This state with job ``kind``'s :class:`Ceiling` fields replaced by ``changes``."""
        return replace(self, ceilings={**self.ceilings, kind: replace(self.ceilings[kind], **changes)})


def after_commit(
    state: TableChores, ticket: int, now_s: float, snapshots: int | None = None, data_files_added: int = 0
) -> TableChores:
    """``state`` after a commit of the run (ticket ``ticket``, at ``now_s``) that planned on ``snapshots``
    snapshots (None: unknown) and added ``data_files_added`` data files: its check is pending (since its
    first commit after its last check), and a job whose ceiling it passed is due. A count at or below
    ``max_snapshots`` clears the expiry (a commit planned before an expiry reports a stale count)."""
    policy = state.spec.maintenance
    since = now_s if state.pending_since is None else state.pending_since
    files = state.files_added + data_files_added
    state = replace(state, pending_since=since, last_commit=ticket, files_added=files)
    if policy.past_max_snapshots(snapshots):
        state = _passed(state, "expire_snapshots", ticket)
    elif snapshots is not None:
        state = state.with_ceiling("expire_snapshots", passed=None)
    if files >= policy.compact_after_data_files:
        state = _passed(state, "compact", ticket)
    return state


def _passed(state: TableChores, kind: str, ticket: int) -> TableChores:
    """``state`` with job ``kind`` past its ceiling since ``ticket``, unless it already was (it keeps its place)."""
    return state if state.ceiling(kind).passed is not None else state.with_ceiling(kind, passed=ticket)


def check_ready(state: TableChores, now_s: float, idle: bool) -> bool:
    """Whether ``state``'s pending check may start at ``now_s``: its last check started at least
    :data:`CHECK_EVERY_S` ago, and no table has records waiting (``idle``) or it has been pending that long."""
    if state.pending_since is None:
        return False
    last = state.checked_s
    return (last is None or now_s - last >= CHECK_EVERY_S) and (idle or now_s - state.pending_since >= CHECK_EVERY_S)


def pending_checks(tables: Mapping[str, TableChores]) -> list[TableChores]:
    """The tables whose check is pending, the least recently committed first."""
    return sorted((t for t in tables.values() if t.pending_since is not None), key=lambda t: t.last_commit)


def over_ceiling(
    tables: Mapping[str, TableChores], now_s: float, busy: Collection[str], held: Collection[str] = ()
) -> tuple[str, str] | None:
    """(identifier, job) of the table that passed a ceiling first, not in ``busy``, whose job is not
    ``held`` (kinds) and did not start by count within :data:`TRIM_CHECK_S` of ``now_s``; None when there is none."""
    over = [
        (c.passed, CEILING_JOBS.index(kind), t.spec.identifier, kind)
        for t in tables.values()
        for kind, c in t.ceilings.items()
        if c.passed is not None and kind not in held
    ]
    for _, _, identifier, kind in sorted(over):
        started = tables[identifier].ceiling(kind).started_s
        if identifier not in busy and (started is None or now_s - started >= TRIM_CHECK_S):
            return identifier, kind
    return None


def next_chore(
    tables: Mapping[str, TableChores],
    due: tuple[str, str] | None,
    now_s: float,
    idle: bool,
    busy: Collection[str] = (),
    held: Collection[str] = (),
) -> tuple[str, str, str] | None:
    """The next chore as (what, identifier, job), or None: ``("maintain", identifier, kind)`` for ``due``
    (the rota's due job, :meth:`kafka_iceberg.ops.rota.MaintenanceRota.next_due`); else for a job past
    its ceiling (:func:`over_ceiling`), ``("trim", identifier, kind)``, or first the table's pending
    check, ``("check", identifier, CHECK)``, before an expiry when no check of it started within
    :data:`TRIM_CHECK_S`; else the first pending check that is ready (:func:`check_ready`), unless not ``idle``
    and a check started within :data:`CHECK_SPACING_S`. ``idle``: no
    table has records waiting; ``busy``: tables whose micro-batch runs meanwhile (their jobs wait); ``held``:
    jobs (kinds) that wait for now, e.g. ``expire_snapshots`` while a predecessor's last checks run
    (:data:`EXPIRY_HOLD_S`)."""
    if due is not None:
        return ("maintain", *due)
    over = over_ceiling(tables, now_s, busy, held)
    if over is not None:
        identifier, kind = over
        state = tables[identifier]
        stale = state.checked_s is None or now_s - state.checked_s > TRIM_CHECK_S
        if kind == "expire_snapshots" and state.pending_since is not None and stale:
            return ("check", identifier, CHECK)
        return ("trim", identifier, kind)
    last = max((t.checked_s for t in tables.values() if t.checked_s is not None), default=None)
    if not idle and last is not None and now_s - last < CHECK_SPACING_S:
        return None
    ready = [t for t in pending_checks(tables) if check_ready(t, now_s, idle)]
    return ("check", ready[0].spec.identifier, CHECK) if ready else None


__all__ = [
    "CEILING_JOBS",
    "CHECK",
    "CHECK_EVERY_S",
    "CHECK_SPACING_S",
    "EXPIRY_HOLD_S",
    "TRIM_CHECK_S",
    "Ceiling",
    "Chore",
    "TableChores",
    "after_commit",
    "check_ready",
    "next_chore",
    "over_ceiling",
    "pending_checks",
]
