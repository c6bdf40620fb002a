"""Maintenance schedules: compaction, snapshot expiry and orphan-file removal per table.

Each table gets three jobs, ``compact_<name>``, ``expire_snapshots_<name>`` and
``remove_orphan_files_<name>``, each with its own schedule (cron in the table's
``maintenance:`` declaration, UTC). They run Iceberg's Spark procedures
(:mod:`kafka_iceberg.ops.maintenance`) in the table's concurrency pool, so they never commit
at the same time as the table's micro-batch (or, on SQLite, as any other commit), and record
an ``AssetObservation`` on the table with live data files and bytes before and after.

A fourth schedule per table runs the full-scan ``duplicate_free`` check (:mod:`kafka_iceberg.schedules.checks`).
"""

from __future__ import annotations

from kafka_iceberg.schedules.checks import full_check_schedule
from kafka_iceberg.schedules.maintenance import maintenance_schedules


def all_schedules(specs, sqlite_catalog: bool = True) -> list:
    """Three maintenance schedules and the full-scan ``duplicate_free`` schedule per declared table."""
    return [
        sched for spec in specs for sched in [*maintenance_schedules(spec, sqlite_catalog), full_check_schedule(spec)]
    ]
