"""What a worker run's chore thread runs (:mod:`kafka_iceberg.lake_assets.worker_chores`): a maintenance
job, the incremental ``duplicate_free`` check of the rows a run committed, and the scheduled full-scan
check. Each reads only its arguments and the :class:`ChoreEnv`, so it may run beside the micro-batches.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from pyiceberg.exceptions import CommitFailedException

from kafka_iceberg.batch.context import Lake
from kafka_iceberg.catalog.tables import load_table, metadata_view, qualified
from kafka_iceberg.config.settings import Settings
from kafka_iceberg.declaration.spec import TableSpec
from kafka_iceberg.errors import LakeError
from kafka_iceberg.ops import checks
from kafka_iceberg.ops.incremental_check import snapshots_to_keep
from kafka_iceberg.ops.maintenance import CONCURRENT_COMMITS, MaintenanceResult
from kafka_iceberg.ops.rota import FULL_CHECK, record_run, run_job, set_table_property
from kafka_iceberg.resources import IcebergCatalogResource, KafkaResource, LakeSlackResource, settings_for

if TYPE_CHECKING:  # pyspark only for the annotation: importing it starts nothing, but it is heavy
    from pyspark.sql import SparkSession

T = TypeVar("T")

CONCURRENT_COMMIT_RETRIES = 20
"""``commit.retry.num-retries`` a worker sets on a table it compacts in the background (unless the table
has its own; Iceberg's default is 4): ``rewrite_data_files`` then commits beside micro-batches that
commit several times a second, each of which makes its commit try again."""


@dataclass(frozen=True)
class ChoreEnv:
    """What chores work with, shared read-only with their background thread: the op's Spark session,
    the runtime settings, the pyiceberg catalog, and the Slack resource (its ``sink()`` sends alerts)."""

    spark: SparkSession | None
    settings: Settings | None
    catalog: object
    slack: LakeSlackResource | None

    @classmethod
    def of(
        cls, spark: SparkSession, kafka: KafkaResource, catalog: IcebergCatalogResource, slack: LakeSlackResource
    ) -> ChoreEnv:
        """The environment of an op from its resources (the Spark session already started)."""
        return cls(spark, settings_for(kafka, catalog), catalog.load(), slack)


def maintenance_job(
    env: ChoreEnv,
    spec: TableSpec,
    kind: str,
    started_ms: int,
    *,
    members: Sequence[str] = (),
    concurrent: bool = False,
    after: int | None,
    run_id: str,
) -> MaintenanceResult:
    """Run the maintenance job ``kind`` on ``spec``'s table (:func:`kafka_iceberg.ops.rota.run_job`;
    an expiry keeps what the next check of run ``run_id``'s rows after snapshot ``after`` reads, and
    :data:`~kafka_iceberg.ops.maintenance.CONCURRENT_COMMITS` more; a group member's compaction first
    completes its group, ``members``: the group's identifiers) and record that it ran at ``started_ms``
    (ms since epoch; when the table's own commits refuse that record three times, the result's output says
    ``last_run_not_recorded``, and a later run may run the job again at its next tick). A job that raised is
    recorded too, best effort (:func:`_recorded`). ``concurrent``: the table's micro-batches commit meanwhile
    (a compaction first sets :data:`CONCURRENT_COMMIT_RETRIES`). Returns its ``MaintenanceResult``; raises
    what Spark or the catalog raise."""

    def keep(view) -> int:
        return (snapshots_to_keep(view, run_id, after) or 1) + CONCURRENT_COMMITS

    def view():
        return metadata_view(load_table(env.catalog, spec.identifier))

    if concurrent and kind == "compact":
        retries = str(CONCURRENT_COMMIT_RETRIES)
        set_table_property(env.catalog, spec.identifier, "commit.retry.num-retries", retries, unless_set=True)
    lake = Lake(env.spark, env.settings, None, env.catalog)
    name = env.settings.catalog.name
    result, refused = _recorded(
        env,
        spec,
        kind,
        started_ms,
        lambda: run_job(env.spark, name, spec, kind, view, keep=keep, lake=lake, members=members),
    )
    if refused:  # the job committed; only its time is not recorded
        result.output["last_run_not_recorded"] = refused
    return result


def incremental_check(
    env: ChoreEnv, spec: TableSpec, after: int | None, run_id: str
) -> tuple[int | None, checks.CheckOutcome]:
    """(main's snapshot id, the ``duplicate_free`` outcome) of ``spec``'s table over the rows run ``run_id``'s
    commits added after snapshot ``after`` (pyiceberg; the full scan of an upsert table is a Spark job,
    :func:`~kafka_iceberg.ops.checks.duplicate_free`). Raises what the catalog, the files or Spark raise."""
    table = load_table(env.catalog, spec.identifier)
    outcome = checks.duplicate_free(
        env.spark, qualified(env.settings, spec), spec, table, commit_id=run_id, after=after
    )
    return outcome.snapshot_id, outcome


def full_check(env: ChoreEnv, spec: TableSpec, started_ms: int) -> checks.CheckOutcome:
    """The full-scan ``duplicate_free`` outcome of ``spec``'s table (every row and snapshot summary of ``main``,
    Spark jobs on the worker's session), then its last run recorded at ``started_ms`` (ms since epoch;
    refused three times by the table's own commits: the figure ``last_run_not_recorded``, and a later run
    may check again at its next tick; a check that raised is recorded too, best effort: :func:`_recorded`).
    Raises ``LakeError`` for a table that is gone, and what the catalog, the files or Spark raise."""

    def scan() -> checks.CheckOutcome:
        table = load_table(env.catalog, spec.identifier)
        if table is None:
            raise LakeError(f"table {spec.identifier} does not exist")
        return checks.duplicate_free(env.spark, qualified(env.settings, spec), spec, table)

    outcome, refused = _recorded(env, spec, FULL_CHECK, started_ms, scan)
    if refused:
        outcome.figures["last_run_not_recorded"] = refused
    return outcome


def _recorded(env: ChoreEnv, spec: TableSpec, kind: str, started_ms: int, job: Callable[[], T]) -> tuple[T, str | None]:
    """(what ``job()`` returned, why its run was not recorded or None): run job ``kind`` of the rota on ``spec``'s
    table, then record it as run at ``started_ms`` (ms since epoch; :func:`~kafka_iceberg.ops.rota.record_run`),
    so no worker run, and no launch by the ``lake_workers`` sensor, runs it again before its cron's next tick.
    A job that raised is recorded too, best effort (the failure may be the catalog's), and its error raised."""
    try:
        result = job()
    except Exception:
        try:
            record_run(env.catalog, spec.identifier, kind, started_ms)
        except Exception:  # noqa: BLE001 - the job's own error is the one raised
            pass
        raise
    try:
        record_run(env.catalog, spec.identifier, kind, started_ms)
    except CommitFailedException as exc:  # refused three times by the table's own commits
        return result, str(exc)
    return result, None


__all__ = ["CONCURRENT_COMMIT_RETRIES", "ChoreEnv", "full_check", "incremental_check", "maintenance_job"]
