"""The one place that imports Dagster internals (``dagster._…``), for backfills, where Dagster 1.13
has no public API: ``AssetGraphSubset`` (the argument of the public
``RunRequest.for_asset_graph_subset``), ``PartitionBackfill.from_asset_graph_subset`` and
``make_new_backfill_id`` (what the sensor daemon itself calls to submit such a request), and
``BulkActionsFilter`` / ``BulkActionStatus`` (to find backfills in progress) and ``BACKFILL_ID_TAG``
(the run tag naming a run's backfill); and, for alerts on a change of an asset check's status, the
check's execution history (:func:`completed_check_executions`: the event log storage's
``get_asset_check_execution_history`` and ``AssetCheckExecutionRecordStatus``, which Dagster 1.13
does not export).

Written for the Dagster series :data:`WRITTEN_FOR` and checked unchanged in the releases of
:data:`CHECKED`; ``tests/test_layout.py`` pins the series, so a minor upgrade fails there first and this
module is checked against the new release.
"""

from dagster import AssetCheckKey, DagsterInstance
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


__all__ = [
    "BACKFILL_ID_TAG",
    "AssetGraphSubset",
    "BulkActionStatus",
    "BulkActionsFilter",
    "CHECKED",
    "PartitionBackfill",
    "WRITTEN_FOR",
    "completed_check_executions",
    "make_new_backfill_id",
]
