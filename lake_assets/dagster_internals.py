"""The one place that imports Dagster internals (``dagster._…``), for backfills, where Dagster 1.13
has no public API: ``AssetGraphSubset`` (the argument of the public
``RunRequest.for_asset_graph_subset``), ``PartitionBackfill.from_asset_graph_subset`` and
``make_new_backfill_id`` (what the sensor daemon itself calls to submit such a request), and
``BulkActionsFilter`` / ``BulkActionStatus`` (to find backfills in progress) and ``BACKFILL_ID_TAG``
(the run tag naming a run's backfill); and, for alerts on a change of an asset check's status, the
check's execution history (:func:`completed_check_executions`: the event log storage's
``get_asset_check_execution_history`` and ``AssetCheckExecutionRecordStatus``, which Dagster 1.13
does not export); and, for a worker's hand-over, whether the run queue holds a queued run back for a
pool (:func:`held_back_for_pool`: ``DagsterRun.run_op_concurrency``, which Dagster 1.13 does not document).

Written for the Dagster series :data:`WRITTEN_FOR` and checked unchanged in the releases of
:data:`CHECKED`; ``tests/test_layout.py`` pins the series, so a minor upgrade fails there first and this
module is checked against the new release.
"""

from dagster import AssetCheckKey, DagsterInstance, DagsterRun
from dagster._core.definitions.assets.graph.asset_graph_subset import AssetGraphSubset
from dagster._core.execution.backfill import BulkActionsFilter, BulkActionStatus, PartitionBackfill
from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecordStatus
from dagster._core.storage.tags import BACKFILL_ID_TAG
from dagster._core.utils import make_new_backfill_id

WRITTEN_FOR = "1.13"
"""The Dagster minor series these imports were written for (any patch release of it)."""

CHECKED = ("1.13.27", "1.13.28")
"""The releases whose sources of these privates were compared: the same classes, functions and signatures."""


def completed_check_executions(instance: DagsterInstance, check_key: AssetCheckKey, limit: int = 5) -> list:
    """The latest completed evaluations of an asset check, newest first: ``(run id, passed)`` pairs,
    at most ``limit``. Planned (in progress) evaluations and checks that raised are left out."""
    records = instance.event_log_storage.get_asset_check_execution_history(
        check_key,
        limit=limit,
        status={AssetCheckExecutionRecordStatus.SUCCEEDED, AssetCheckExecutionRecordStatus.FAILED},
    )
    return [(r.run_id, r.status == AssetCheckExecutionRecordStatus.SUCCEEDED) for r in records]


def first_steps_need_pool(run: DagsterRun, pool: str) -> bool:
    """Whether a first step of ``run`` is in ``pool``: while such a run is STARTING, Dagster's queue counts a
    slot of ``pool`` as taken by it (``GlobalOpConcurrencyLimitsCounter``), whoever holds the slot."""
    needs = run.run_op_concurrency
    return needs is not None and pool in needs.root_key_counts


def held_back_for_pool(run: DagsterRun, pool: str) -> bool:
    """Whether the run queue holds the queued ``run`` back while ``pool`` has no free slot: each of its first
    steps is in a pool and ``pool`` is one of them. Dagster's queue (``run_queue.block_op_concurrency_limited_runs``,
    on by default, pools counted per op) starts such a run only once a slot is free, so its step never waits in
    the pool where :meth:`get_concurrency_info` would show it. ``tests/test_worker.py`` pins this against Dagster's
    own judgement (``GlobalOpConcurrencyLimitsCounter.is_blocked``)."""
    return first_steps_need_pool(run, pool) and not run.run_op_concurrency.has_unconstrained_root_nodes


__all__ = [
    "BACKFILL_ID_TAG",
    "AssetGraphSubset",
    "BulkActionStatus",
    "BulkActionsFilter",
    "CHECKED",
    "PartitionBackfill",
    "WRITTEN_FOR",
    "completed_check_executions",
    "first_steps_need_pool",
    "held_back_for_pool",
    "make_new_backfill_id",
]
