"""Maintenance inside worker runs. Plain Python, no Dagster.

A worker run compacts, expires snapshots of and removes orphan files from the tables it serves, and
runs their scheduled full-scan ``duplicate_free`` checks, on its own warm Spark session, between
micro-batches, one job at a time: no run of its own queues for the commit pool, starts a JVM, or
makes the worker hand over. A job is due when a
tick of its table's (spread) cron has passed since its last run. The time of the last run lives in
a table property, ``lake.maintenance.<kind>.last-run-ms`` (ms since epoch), so every worker run, and
any worker a table moves to, knows it; a table without it counts from its first snapshot.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone

from croniter import croniter
from pyiceberg.exceptions import CommitFailedException

from kafka_iceberg.batch.context import Lake
from kafka_iceberg.batch.group_marker import roll_forward_group
from kafka_iceberg.catalog.tables import TableMetadataView
from kafka_iceberg.cdc import tombstones
from kafka_iceberg.declaration.groups import group_of
from kafka_iceberg.declaration.spec import TableSpec
from kafka_iceberg.ops import maintenance
from kafka_iceberg.ops.maintenance import MaintenanceResult

KINDS = ("compact", "expire_snapshots", "remove_orphan_files")
"""The maintenance jobs a worker runs, in the order they go when due together."""

FULL_CHECK = "full_check"
"""The scheduled full-scan ``duplicate_free`` check (``maintenance.full_check``): due by its cron like a
maintenance job, after them when due together; it reads the table and commits only its last-run property."""

JOBS = (*KINDS, FULL_CHECK)
"""Every job of the rota, in the order they go when due together."""

LAST_RUN_PROPERTY = "lake.maintenance.{kind}.last-run-ms"
"""Table property holding when the job ``kind`` last ran on the table (ms since epoch)."""


def last_runs(properties: Mapping[str, str], first_snapshot_ms: int | None) -> dict[str, int | None]:
    """Per job kind (:data:`JOBS`), when it last ran (ms since epoch): the table property, else the table's
    first snapshot (``first_snapshot_ms``), else None (a table with no snapshot has nothing to maintain)."""
    out = {}
    for kind in JOBS:
        raw = properties.get(LAST_RUN_PROPERTY.format(kind=kind))
        out[kind] = int(raw) if raw and raw.isdigit() else first_snapshot_ms
    return out


def next_tick_ms(cron: str, after_ms: int) -> int:
    """The first tick of ``cron`` (five fields, UTC) strictly after ``after_ms`` (ms since epoch)."""
    after = datetime.fromtimestamp(after_ms / 1000, tz=timezone.utc)
    return int(croniter(cron, after).get_next(datetime).timestamp() * 1000)


@dataclass
class MaintenanceRota:
    """Which maintenance job of which table is due. ``crons``: identifier -> kind -> cron (UTC), the
    spread crons of :func:`kafka_iceberg.schedules.spread.maintenance_crons`; ``last_run_ms``: (identifier,
    kind) -> ms since epoch, from :func:`last_runs` (a missing or None entry is never due)."""

    crons: dict[str, dict[str, str]]
    last_run_ms: dict[tuple[str, str], int | None] = field(default_factory=dict)
    _due_at: dict[tuple[str, str], int] = field(default_factory=dict, init=False, repr=False)

    def next_due(self, now_ms: int, skip: Collection[str] = (), held: Collection[str] = ()) -> tuple[str, str] | None:
        """The (identifier, kind) whose first missed tick is the oldest, or None when nothing is due
        (each job's next tick is computed once per run of it, not per call); tables in ``skip`` and
        jobs in ``held`` (kinds) wait."""
        first = min(self._due_jobs(now_ms, skip, held), default=None)
        return first[2:] if first is not None else None

    def due(self, now_ms: int) -> set[str]:
        """The identifiers with a job due at ``now_ms`` (ms since epoch): a tick of its cron passed since its last run."""
        return {identifier for _, _, identifier, _ in self._due_jobs(now_ms)}

    def _due_jobs(self, now_ms: int, skip: Collection[str] = (), held: Collection[str] = ()):
        """(first missed tick, place in :data:`JOBS`, identifier, kind) of every job due at ``now_ms``."""
        for identifier, crons in self.crons.items():
            if identifier in skip:
                continue
            for kind in (k for k in JOBS if k not in held):
                tick = self._tick(identifier, kind, crons)
                if tick is not None and tick <= now_ms:
                    yield tick, JOBS.index(kind), identifier, kind

    def _tick(self, identifier: str, kind: str, crons: dict[str, str]) -> int | None:
        last = self.last_run_ms.get((identifier, kind))
        if last is None or kind not in crons:
            return None
        if (identifier, kind) not in self._due_at:
            self._due_at[(identifier, kind)] = next_tick_ms(crons[kind], last)
        return self._due_at[(identifier, kind)]

    def mark(self, identifier: str, kind: str, at_ms: int) -> None:
        """Record that ``kind`` ran (or was attempted) on ``identifier`` at ``at_ms``: not due until the next tick."""
        self.last_run_ms[(identifier, kind)] = at_ms
        self._due_at.pop((identifier, kind), None)


def run_job(
    spark,
    catalog_name: str,
    spec: TableSpec,
    kind: str,
    view: Callable[[], TableMetadataView],
    keep: Callable[[TableMetadataView], int] = lambda view: 0,
    *,
    lake: Lake | None = None,
    members: Sequence[str] = (),
) -> MaintenanceResult:
    """Run the maintenance job ``kind`` (one of :data:`KINDS`) on ``spec``'s table through Iceberg
    (:mod:`kafka_iceberg.ops.maintenance`); ``view()`` gives the table's
    :class:`~kafka_iceberg.catalog.tables.TableMetadataView` (snapshot expiry keeps the ingest state,
    and the newest ``keep(view)`` snapshots of ``main``; past ``max_snapshots`` it expires by count).
    A compaction of a consistency group member first rolls forward a group commit a crash left
    half-published (:func:`~kafka_iceberg.batch.group_marker.roll_forward_group` on ``lake``, over
    ``members``: the identifiers of the group's declared members).

    Raises:
        ValueError: an unknown ``kind``; a group member's compaction without ``lake``.
        LakeError, CatalogUnavailableError: that roll-forward failed (nothing compacted).
        Any error of the procedure (Py4J / Spark), unchanged.
    """
    policy = spec.maintenance
    if kind == "compact":
        if (group := group_of(spec)) is not None:
            if lake is None:
                raise ValueError(f"table {spec.identifier}: compacting a consistency group member needs a Lake")
            roll_forward_group(lake, group, sorted({*members, spec.identifier}))
        result = maintenance.compact(spark, catalog_name, spec.identifier, policy.target_file_size_bytes)
        return with_tombstones(spark, catalog_name, spec, kind, result)
    if kind == "expire_snapshots":
        current = view()
        result = maintenance.expire(
            spark,
            catalog_name,
            spec.identifier,
            policy.max_snapshot_age_s,
            policy.retain_last,
            view=current,
            max_snapshots=policy.max_snapshots,
            keep=keep(current),
        )
        return with_tombstones(spark, catalog_name, spec, kind, result)
    if kind == "remove_orphan_files":
        return maintenance.remove_orphans(spark, catalog_name, spec.identifier, policy.orphan_older_than_s)
    raise ValueError(f"unknown maintenance job {kind!r}; known: {', '.join(KINDS)}")


def with_tombstones(spark, catalog_name: str, spec: TableSpec, kind: str, result: MaintenanceResult):
    """``result`` of ``compact`` or ``expire_snapshots`` on an upsert table, with the same job run on its
    tombstone table (:mod:`kafka_iceberg.cdc.tombstones`) when it exists: ``expire_snapshots`` first prunes
    the tombstones older than their retention. Adds ``tombstones_*`` figures to ``result.output``."""
    table = f"{catalog_name}.{spec.identifier}"
    if spec.upsert is None or not tombstones.exists(spark, table):
        return result
    identifier = tombstones.tombstone_table(spec.identifier)
    if kind == "compact":
        done = maintenance.compact(spark, catalog_name, identifier, spec.maintenance.target_file_size_bytes)
    else:
        result.output["tombstones_kept"] = tombstones.prune(spark, table)
        done = maintenance.expire(
            spark, catalog_name, identifier, spec.maintenance.max_snapshot_age_s, spec.maintenance.retain_last
        )
    result.output.update({f"tombstones_{k}": v for k, v in done.output.items()})
    result.seconds = round(result.seconds + done.seconds, 3)
    return result


def record_run(catalog, identifier: str, kind: str, at_ms: int | None = None, attempts: int = 3) -> None:
    """Set the table property :data:`LAST_RUN_PROPERTY` of ``kind`` to ``at_ms`` (default now)
    (:func:`set_table_property`).

    Raises:
        CommitFailedException: every attempt was refused.
    """
    at_ms = int(time.time() * 1000) if at_ms is None else at_ms
    set_table_property(catalog, identifier, LAST_RUN_PROPERTY.format(kind=kind), str(at_ms), attempts=attempts)


def set_table_property(
    catalog, identifier: str, key: str, value: str | None, unless_set: bool = False, attempts: int = 3
) -> bool:
    """Set the table property ``key`` to ``value`` (None: remove it, when the table has it) in a commit of its
    own (pyiceberg's ``Transaction`` on the table loaded from ``catalog``); with ``unless_set``, leave a
    property the table already has; a property that already has ``value`` is not committed again. A
    commit refused because another one changed the table first is retried on a fresh load, ``attempts``
    in all. Returns whether it committed.

    Raises:
        CommitFailedException: every attempt was refused.
    """
    for attempt in range(1, attempts + 1):
        try:
            table = catalog.load_table(identifier)
            if table.properties.get(key) == value or (unless_set and key in table.properties):
                return False  # nothing to change
            change = table.transaction()
            change = change.remove_properties(key) if value is None else change.set_properties(**{key: value})
            change.commit_transaction()
            return True
        except CommitFailedException:
            if attempt == attempts:
                raise
    return False


def rota_for(tables: dict[str, object], crons: dict[str, dict[str, str]]) -> MaintenanceRota:
    """The :class:`MaintenanceRota` of the loaded pyiceberg ``tables`` (identifier -> table, None
    for a table not created yet) under their spread ``crons`` (identifier -> kind -> cron, UTC)."""
    last = {}
    for identifier, table in tables.items():
        if table is None:
            continue
        first = min((s.timestamp_ms for s in table.metadata.snapshots), default=None)
        last.update({(identifier, k): ms for k, ms in last_runs(table.properties, first).items()})
    return MaintenanceRota({i: crons[i] for i in tables if i in crons}, last)


__all__ = [
    "FULL_CHECK",
    "JOBS",
    "KINDS",
    "LAST_RUN_PROPERTY",
    "MaintenanceRota",
    "last_runs",
    "next_tick_ms",
    "record_run",
    "rota_for",
    "run_job",
    "set_table_property",
]
