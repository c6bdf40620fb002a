"""The Dagster layer's shared vocabulary: asset keys, the micro-batch partitions, concurrency pools,
run tags and run statuses.

Asset modules (:mod:`kafka_iceberg.lake_assets.tables`, ``analytics``, ``quality``, ``replay``), the backfill
library (:mod:`kafka_iceberg.lake_assets.backfill`), the sensors and the schedules all import these names from
here, so sensors and schedules never import an asset module, and the composition root
(:mod:`kafka_iceberg.lake_assets.definitions`) is the only module that imports sensors and schedules. This
module imports nothing from the project but :class:`kafka_iceberg.declaration.spec.TableSpec` and
:class:`kafka_iceberg.ops.alerts.Alert`.
"""

from __future__ import annotations

from dagster import AssetKey, DagsterRunStatus, DynamicPartitionsDefinition

from kafka_iceberg.declaration.spec import TableSpec
from kafka_iceberg.ops.alerts import Alert


def key_part(name: str) -> str:
    """``name`` as one asset-key or pool-name component: every character other than a letter, a
    digit or ``_`` becomes ``_`` (``nycflights13.flights`` -> ``nycflights13_flights``)."""
    return "".join(c if c.isalnum() or c == "_" else "_" for c in name)


def topic_key(spec: TableSpec) -> AssetKey:
    """Asset key of the source topic: ``kafka/<topic>`` (dots become underscores)."""
    return AssetKey(["kafka", key_part(spec.topic)])


def table_key(spec: TableSpec) -> AssetKey:
    """Asset key of the table: ``lake/<namespace>/<table>``."""
    return identifier_key(spec.identifier)


def table_alert(spec: TableSpec, **fields) -> Alert:
    """The :class:`~kafka_iceberg.ops.alerts.Alert` of ``spec``'s table, linked to its asset; ``fields``: the
    alert's other attributes (``measure``, ``value``, ``severity``, ``summary``, ``source``, ...)."""
    return Alert(table=spec.identifier, asset_key_path=list(table_key(spec).path), **fields)


def identifier_key(identifier: str) -> AssetKey:
    """Asset key of the declared table ``identifier``: ``nyc.flights`` -> ``lake/nyc/flights``."""
    return AssetKey(["lake", *identifier.split(".")])


def key_identifier(key: AssetKey) -> str:
    """Iceberg identifier of a table asset's key: ``lake/nyc/flights`` -> ``nyc.flights``.

    Raises:
        ValueError: ``key`` is not ``lake/<namespace>/<table>``.
    """
    if len(key.path) < 3 or key.path[0] != "lake":
        raise ValueError(f"asset {key.to_user_string()} is not a table asset (lake/<namespace>/<table>)")
    return ".".join(key.path[1:])


SNAPSHOT_ID_METADATA = "snapshot_id"
"""Materialization metadata key of a table asset: the Iceberg snapshot id its micro-batch committed
(text; ``none (nothing new)`` when it committed nothing)."""


MICRO_BATCHES = DynamicPartitionsDefinition(name="micro_batches")
"""The partitions of every table asset: micro-batch slots (keys from
:func:`kafka_iceberg.lake_assets.backfill.new_slot_keys`, added by the backfill command, a location's lag sensor
(``sensors/lag.py``, not in the default location), the demo, or by hand in the UI). Shared by all tables so that one partitioned job (``ingest_all``)
can hold every table plus the unpartitioned downstream asset."""

SQLITE_POOL = "lake/sqlite_catalog"
"""The one concurrency pool of every committing step on a SQLite catalog. Every pool of the lake is
named under ``lake/``, so its limits (limit 1: ``dagster instance concurrency set``) touch no other pool."""


def table_pool(spec: TableSpec, sqlite_catalog: bool) -> str:
    """Dagster concurrency pool of a table asset: one per table (``lake/table/<namespace>_<table>``),
    or :data:`SQLITE_POOL` shared by all tables on a SQLite catalog (SQLite admits one committing
    process at a time). Limits: dagster.yaml."""
    return SQLITE_POOL if sqlite_catalog else f"lake/table/{key_part(spec.identifier)}"


def commit_pool(sqlite_catalog: bool) -> str | None:
    """Pool of a committing step that is not one table's micro-batch (the downstream asset, the
    replay op): :data:`SQLITE_POOL` on SQLite, else ``None`` (no pool)."""
    return SQLITE_POOL if sqlite_catalog else None


WORKER_TAG = "lake/worker"
"""Run tag naming the worker (``0`` .. number of workers - 1) of a worker run."""

BUDGET_S = 1800.0
"""Seconds a sensor-launched worker run keeps starting micro-batches (then its successor, launched
``kafka_iceberg.sensors.workers.HANDOVER_S`` before, takes over): long, so a process and Spark session
serve many micro-batches; short enough that a code change or a leak reaches the next run within the hour."""
BUDGET_TAG = "lake/budget_s"
"""Run tag of a short worker run (tests, a run by hand): a sensor-launched run's budget in seconds instead of
:data:`BUDGET_S`, idle time 0, and its last checks keep the process's priority (no successor to yield to)."""


def run_budget_s(tags: dict[str, str]) -> float:
    """Seconds a worker run with these tags may keep starting micro-batches: 0 (one round) for a backfill
    run or a run not launched by a sensor, else :data:`BUDGET_S` or the :data:`BUDGET_TAG` value."""
    if "dagster/backfill" in tags or "dagster/sensor_name" not in tags:
        return 0.0
    return float(tags.get(BUDGET_TAG, BUDGET_S))


def worker_job_name(index: int) -> str:
    """Name of worker ``index``'s job: ``lake_worker_<index>``."""
    return f"lake_worker_{index}"


def worker_pool(index: int, lake: str = "") -> str:
    """Pool of worker ``index``'s serving op off SQLite: ``lake/worker/<index>`` (limit 1); a lake of another
    resource-key prefix (``lake``, e.g. ``orders_``) has its own: ``lake/worker/<lake><index>``."""
    return f"lake/worker/{lake}{index}"


RUN_RETRY_TAGS = {"dagster/max_retries": "2", "dagster/retry_on_asset_or_op_failure": "false"}
"""Run tags of the lake's per-table and backfill runs: a run that died (killed, its pod gone)
is launched again up to twice, a run whose step raised is not (the asset's RetryPolicy covers step errors;
a data error such as DataLossError must stop). The lake's own retry settings, not the instance's: they
need only ``run_retries.enabled`` (the Helm chart's default). Worker runs have ``dagster/max_retries: 0``."""


TABLE_TAG = "lake/table"
"""Run and backfill tag naming the table (its identifier, e.g. ``nyc.flights``)."""

IN_PROGRESS = [
    DagsterRunStatus.QUEUED,
    DagsterRunStatus.NOT_STARTED,
    DagsterRunStatus.STARTING,
    DagsterRunStatus.STARTED,
]
"""Run statuses during which a run may still write."""

__all__ = [
    "BUDGET_S",
    "BUDGET_TAG",
    "RUN_RETRY_TAGS",
    "IN_PROGRESS",
    "MICRO_BATCHES",
    "SQLITE_POOL",
    "SNAPSHOT_ID_METADATA",
    "TABLE_TAG",
    "WORKER_TAG",
    "commit_pool",
    "identifier_key",
    "key_identifier",
    "key_part",
    "run_budget_s",
    "table_key",
    "table_pool",
    "worker_pool",
    "topic_key",
    "worker_job_name",
]
