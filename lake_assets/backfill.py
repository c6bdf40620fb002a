"""Backfills of micro-batches, for a table that lags by more than one micro-batch holds.

One micro-batch reads at most ``max_records_per_partition`` (the *bound*) offsets from every
partition. A table whose largest per-partition offset lag (high watermark minus committed
offset) is ``L`` records therefore needs ``ceil(L / bound)`` micro-batches to catch up
(:func:`plan_catch_up`). Such a catch-up is one Dagster **asset backfill** over that many
micro-batch slots of the table asset (:data:`kafka_iceberg.lake_assets.vocabulary.MICRO_BATCHES`; a ring of
:data:`RING_SLOTS` keys every table reuses, least recently used first, :func:`next_slots`); the asset's
``BackfillPolicy.multi_run(1)`` makes it one run per slot, i.e. one run per micro-batch. It
shows under *Runs -> Backfills* in the UI like any other backfill.

Why the runs commit in order whatever order they run in: a slot is not an offset range. Each
run plans its micro-batch from the table's committed offsets (the Iceberg snapshot summary)
when it starts, so the k runs commit k consecutive ranges; a run that finds nothing new
commits nothing, and a re-run of an old slot ingests the *next* micro-batch, never the old
one again. The table's concurrency pool (``dagster.yaml``) lets one run of a table execute
at a time; the run queue also holds back queued runs whose pool is full.

Launchers, all through Dagster's backfill machinery:

- the lag sensor (``sensors/lag.py``) returns ``AddDynamicPartitionsRequest`` plus
  ``RunRequest.for_asset_graph_subset``; the sensor daemon turns that into a backfill;
- the command line: ``lake backfill --table flights`` (``make backfill TABLE=flights``), which
  adds the slots and submits the same backfill to the instance of ``$DAGSTER_HOME``
  (``DagsterInstance.get()``), or with ``--url`` through the webserver's GraphQL API
  (:mod:`kafka_iceberg.lake_assets.backfill_cli`);
- the UI: the table's *Materialize* dialog, with several new partitions -> *Launch backfill*.

The backfill daemon (part of ``dagster dev``; ``dagster-daemon run`` in production) launches
the runs, as for every Dagster backfill.

Dagster APIs used that are not exported at the top level (1.13) come from
:mod:`kafka_iceberg.lake_assets.dagster_internals`, the one module that imports ``dagster._…``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from dagster import DagsterEventType, DagsterInstance, RunRequest, RunsFilter

from kafka_iceberg.config.run_pods import run_pod_tags
from kafka_iceberg.declaration.spec import TableSpec
from kafka_iceberg.lake_assets.dagster_internals import (
    AssetGraphSubset,
    BulkActionsFilter,
    BulkActionStatus,
    PartitionBackfill,
    make_new_backfill_id,
)
from kafka_iceberg.lake_assets.vocabulary import IN_PROGRESS, MICRO_BATCHES, RUN_RETRY_TAGS, TABLE_TAG, table_key

RING_SLOTS = 50
"""Micro-batch slots (partition keys of :data:`kafka_iceberg.lake_assets.vocabulary.MICRO_BATCHES`) every table
reuses, so partitions stay bounded whatever the uptime and the number of tables."""

MAX_BACKFILL_BATCHES = RING_SLOTS
"""Most micro-batches (runs) one backfill holds: one per ring slot. A larger backlog is caught
up by a backfill of this many, then (the lag sensor sees lag left) by the next one."""

ACTIVE_BACKFILL_STATUSES = [BulkActionStatus.REQUESTED, BulkActionStatus.CANCELING, BulkActionStatus.FAILING]
"""Backfill statuses during which a backfill may still launch or wait on runs."""


def ring_slot_keys() -> list[str]:
    """The :data:`RING_SLOTS` micro-batch slot keys every table reuses: ``slot-00`` … ``slot-49``."""
    return [f"slot-{i:02d}" for i in range(RING_SLOTS)]


def choose_slots(materialized: Mapping[str, int], failed: Mapping[str, int], count: int) -> list[str]:
    """The ``count`` ring slots a table's next micro-batches use, least recently used first.

    ``materialized`` / ``failed``: slot -> an increasing id (event storage id) of the table's
    latest materialization / failed materialization in that slot. Order: slots whose latest
    attempt failed (so the next micro-batch supersedes the failure and the asset is not left
    degraded), then slots never materialized, then the least recently materialized. Pure.

    Raises:
        ValueError: ``count`` < 1 or > :data:`RING_SLOTS`.
    """
    if not 1 <= count <= RING_SLOTS:
        raise ValueError(f"slot count must be between 1 and {RING_SLOTS}, not {count}")

    def rank(item: tuple[int, str]) -> tuple[int, int, int]:
        i, slot = item
        done, bad = materialized.get(slot), failed.get(slot)
        if bad is not None and (done is None or bad > done):
            return (0, bad, i)
        return (1, -1, i) if done is None else (2, done, i)

    return [slot for _, slot in sorted(enumerate(ring_slot_keys()), key=rank)[:count]]


def next_slots(instance: DagsterInstance, spec: TableSpec, count: int) -> list[str]:
    """:func:`choose_slots` for ``spec``'s table from the instance's event log (its latest
    materialization and failed materialization per partition)."""
    key = table_key(spec)
    done = instance.get_latest_storage_id_by_partition(key, DagsterEventType.ASSET_MATERIALIZATION)
    bad = instance.get_latest_storage_id_by_partition(key, DagsterEventType.ASSET_FAILED_TO_MATERIALIZE)
    return choose_slots(done, bad, count)


def new_slot_keys(count: int, now_ms: int) -> list[str]:
    """``count`` consecutive ring slots starting at second ``now_ms // 1000`` of the ring (for
    callers without an instance, e.g. the demo); the sensor and the CLI use :func:`next_slots`.

    Raises:
        ValueError: ``count`` < 1 or > :data:`RING_SLOTS`.
    """
    if not 1 <= count <= RING_SLOTS:
        raise ValueError(f"slot count must be between 1 and {RING_SLOTS}, not {count}")
    ring, start = ring_slot_keys(), (now_ms // 1000) % RING_SLOTS
    return [ring[(start + i) % RING_SLOTS] for i in range(count)]


@dataclass(frozen=True)
class CatchUpPlan:
    """How many micro-batches a table needs to catch up.

    Attributes:
        total_lag: offset lag summed over partitions (records by offset).
        max_partition_lag: the largest per-partition offset lag (records by offset).
        partition: the partition with that lag (``None`` without lag).
        bound: the table's ``max_records_per_partition`` (offsets per partition per micro-batch).
        batches: micro-batches to request: ``ceil(max_partition_lag / bound)``, at least 1, at
            most the cap; 1 for a table that has never committed and does not start at
            ``earliest`` (its first run resolves the starting position; lag is known after).
        capped: whether the cap cut ``batches`` (lag is left after they all run).
    """

    total_lag: int
    max_partition_lag: int
    partition: int | None
    bound: int
    batches: int
    capped: bool

    @property
    def needs_backfill(self) -> bool:
        """More than one micro-batch: launch a backfill rather than a single run."""
        return self.batches > 1


def plan_catch_up(
    spec: TableSpec, lag_by_partition: Mapping[int, int], has_state: bool, cap: int = MAX_BACKFILL_BATCHES
) -> CatchUpPlan:
    """Plan the micro-batches that bring ``spec``'s table to zero lag.

    Args:
        spec: the table declaration (its ``max_records_per_partition`` is the bound).
        lag_by_partition: ``{partition: offset lag}``, e.g. from
            :func:`kafka_iceberg.batch.planning.offset_lag` (records by offset, >= 0).
        has_state: whether the table has committed offsets (a snapshot with ``kafka.offsets``).
        cap: most micro-batches to plan (>= 1).

    Raises:
        ValueError: ``cap`` < 1.
    """
    if cap < 1:
        raise ValueError("cap must be at least 1")
    bound = spec.max_records_per_partition
    total = sum(lag_by_partition.values())
    partition, worst = max(lag_by_partition.items(), key=lambda kv: (kv[1], -kv[0]), default=(None, 0))
    if worst <= 0:
        partition = None
    needed = max(1, math.ceil(worst / bound))
    if not has_state and spec.starting_position.kind != "earliest":
        needed = 1
    return CatchUpPlan(total, worst, partition, bound, min(needed, cap), needed > cap)


def backfill_subset(spec: TableSpec, slot_keys: Sequence[str]) -> AssetGraphSubset:
    """The asset graph subset ``{table asset: slot_keys}`` a backfill of ``spec`` targets.

    The keys need not exist yet (they are added in the same sensor result or just before
    the backfill is submitted)."""
    return AssetGraphSubset(
        partitions_subsets_by_asset_key={table_key(spec): MICRO_BATCHES.subset_with_partition_keys(list(slot_keys))}
    )


def backfill_run_request(spec: TableSpec, slot_keys: Sequence[str], tags: Mapping[str, str]) -> RunRequest:
    """A sensor ``RunRequest`` that the sensor daemon submits as one asset backfill over
    ``slot_keys`` of ``spec``'s table (one run per slot); ``tags`` go on the backfill and its runs."""
    return RunRequest.for_asset_graph_subset(
        backfill_subset(spec, slot_keys), tags={**RUN_RETRY_TAGS, **run_pod_tags(), **tags}
    )


def table_in_progress(instance: DagsterInstance, spec: TableSpec) -> str | None:
    """What is already materializing ``spec``'s table, or ``None``.

    Returns ``"run <id>"`` for a queued or running run tagged ``lake/table`` with the table, or
    the latest run that planned a materialization of the table asset while it is still queued
    or running (this covers runs launched from the UI and ``ingest_all``); ``"backfill <id>"``
    for a backfill that is requested, canceling or failing and whose asset selection holds
    the table asset (sensor, command line or UI). Reads the instance only; never raises for
    an empty instance.
    """
    key = table_key(spec)
    tagged = instance.get_runs(filters=RunsFilter(tags={TABLE_TAG: spec.identifier}, statuses=IN_PROGRESS), limit=1)
    if tagged:
        return f"run {tagged[0].run_id}"
    for record in instance.get_asset_records([key]):
        run_id = record.asset_entry.last_planned_materialization_run_id
        run = instance.get_run_by_id(run_id) if run_id else None
        if run is not None and run.status in IN_PROGRESS:
            return f"run {run_id}"
    for backfill in instance.get_backfills(filters=BulkActionsFilter(statuses=ACTIVE_BACKFILL_STATUSES)):
        if key in (backfill.asset_selection or ()):
            return f"backfill {backfill.backfill_id}"
    return None


def submit_backfill(
    instance: DagsterInstance,
    spec: TableSpec,
    slot_keys: Sequence[str],
    tags: Mapping[str, str],
    title: str | None = None,
    description: str | None = None,
) -> str:
    """Add ``slot_keys`` to :data:`MICRO_BATCHES` and submit an asset backfill over them for
    ``spec``'s table, as the sensor daemon does for :func:`backfill_run_request`.

    Returns the backfill id. The backfill daemon launches its runs (one per slot). Raises
    whatever the instance's storage raises (e.g. an unwritable ``$DAGSTER_HOME``).
    """
    instance.add_dynamic_partitions(MICRO_BATCHES.name, list(slot_keys))
    backfill_id = make_new_backfill_id()
    instance.add_backfill(
        PartitionBackfill.from_asset_graph_subset(
            backfill_id=backfill_id,
            backfill_timestamp=time.time(),
            tags={**RUN_RETRY_TAGS, **run_pod_tags(), **tags},
            dynamic_partitions_store=instance,
            asset_graph_subset=backfill_subset(spec, slot_keys),
            title=title,
            description=description,
            run_config=None,
        )
    )
    return backfill_id


def backfill_url(ui_url: str, backfill_id: str) -> str:
    """Link to a backfill's page in the Dagster UI: ``<ui_url>/runs/b/<backfill_id>``."""
    return f"{ui_url.rstrip('/')}/runs/b/{backfill_id}"


__all__ = [
    "ACTIVE_BACKFILL_STATUSES",
    "CatchUpPlan",
    "MAX_BACKFILL_BATCHES",
    "TABLE_TAG",
    "backfill_run_request",
    "RING_SLOTS",
    "backfill_subset",
    "backfill_url",
    "choose_slots",
    "new_slot_keys",
    "next_slots",
    "ring_slot_keys",
    "plan_catch_up",
    "submit_backfill",
    "table_in_progress",
]
