"""Maintenance schedules per table, for a location without worker runs (``workers=0``). A location with
worker runs (every location the component builds) has no schedule: the worker runs compact, expire
snapshots, remove orphan files and run the full-scan ``duplicate_free`` check of their tables themselves,
by the same spread crons (:mod:`kafka_iceberg.ops.rota`).

Without worker runs each table gets four jobs, ``compact_<name>``, ``expire_snapshots_<name>``,
``remove_orphan_files_<name>`` and ``duplicate_free_full_<name>`` (:mod:`kafka_iceberg.schedules.checks`),
each with its own schedule (cron in the table's ``maintenance:`` declaration, UTC). The maintenance jobs run
Iceberg's maintenance (:mod:`kafka_iceberg.ops.maintenance`) in the table's concurrency pool, so they never
commit at the same time as the table's micro-batch (or, on SQLite, as any other commit), and record an
``AssetObservation`` on the table with live data files and bytes before and after. The crons are spread
over time across all the tables (:mod:`kafka_iceberg.ops.spread`), and a run-queue limit on the
``lake/maintenance`` run tag (dagster.yaml) bounds how many of these runs run at once.
"""

from __future__ import annotations

from kafka_iceberg.declaration.groups import group_of, member_identifiers
from kafka_iceberg.ops.spread import maintenance_crons
from kafka_iceberg.resources import LAKE_KEYS, ResourceKeys
from kafka_iceberg.schedules.checks import full_check_schedule
from kafka_iceberg.schedules.maintenance import maintenance_schedules


def all_schedules(specs, sqlite_catalog: bool = True, workers: int = 0, keys: ResourceKeys = LAKE_KEYS) -> list:
    """Three maintenance schedules and the full-scan ``duplicate_free`` schedule per declared table, their
    crons spread over time among all of ``specs``; none with ``workers`` >= 1 (the worker runs do these jobs,
    :mod:`kafka_iceberg.ops.rota`). ``keys``: the lake's resource keys."""
    if workers:
        return []
    crons = maintenance_crons(specs)
    members = member_identifiers(specs)
    return [
        sched
        for spec in specs
        for sched in [
            *maintenance_schedules(spec, sqlite_catalog, crons[spec.identifier], keys, members.get(group_of(spec), ())),
            full_check_schedule(spec, crons[spec.identifier]["full_check"]),
        ]
    ]
