"""Worker runs (``LAKE_WORKERS`` >= 1): a few long-running runs serve every table.

Each worker is a job (``lake_worker_<k>``) that keeps one process and one Spark session: its ``warm``
op starts the session and checks the tables outside the pool, then its ``serve`` op holds the pool and
serves its share of the tables (:func:`kafka_iceberg.batch.worker.assign_workers`) through
:class:`kafka_iceberg.batch.worker.Worker`: most-waiting table first, one bounded micro-batch at a
time, each through the whole write path. Every commit is logged as an ``AssetMaterialization`` of
that table's asset, with the same metadata as a table asset's run; the consumer groups get the committed
offsets every ``LAKE_GROUP_MIRROR_S`` seconds (:class:`kafka_iceberg.batch.mirror.GroupMirror`). Between micro-batches the run does
its chores (:mod:`kafka_iceberg.lake_assets.worker_chores`): the due maintenance of its tables and the
``duplicate_free`` check of each table it committed to; its ``check`` op runs those still pending,
outside the pool and at a lower CPU priority. It hands over only when another run's step waits for its
pool: its warm successor, launched near the end of its budget
(:data:`kafka_iceberg.sensors.workers.HANDOVER_S`), or a maintenance run; past its budget it serves on
while that successor starts (:data:`SUCCESSOR_GRACE_S` at most). A table whose micro-batch fails is
reported (log and Slack) and set aside; the others keep committing; the run then fails naming it.
Launched by the ``lake_workers`` sensor (:mod:`kafka_iceberg.sensors.workers`); a sensor-launched
run keeps serving up to ``LAKE_STREAM_BUDGET_S`` seconds, a run launched by hand serves one round.
"""

from __future__ import annotations

import time

from dagster import (
    AssetMaterialization,
    DagsterRunStatus,
    Failure,
    In,
    JobDefinition,
    Nothing,
    OpExecutionContext,
    RunsFilter,
    job,
    op,
)
from dagster_pyspark import PySparkResource

from kafka_iceberg.batch.mirror import GroupMirror
from kafka_iceberg.batch.pipeline import connect, run_micro_batch, warm_up
from kafka_iceberg.batch.worker import Worker
from kafka_iceberg.catalog.tables import load_table, table_state
from kafka_iceberg.config.run_pods import run_pod_tags
from kafka_iceberg.declaration.spec import TableSpec
from kafka_iceberg.lake_assets.streaming import (
    POOL_CHECK_S,
    at_most_every,
    lower_cpu_priority,
    pool_waiting,
    stream_budget_s,
)
from kafka_iceberg.lake_assets.tables import dagster_liveness, materialization_metadata
from kafka_iceberg.lake_assets.vocabulary import SQLITE_POOL, WORKER_TAG, table_key, worker_job_name, worker_pool
from kafka_iceberg.lake_assets.worker_chores import WorkerChores, rota_for, worker_alert
from kafka_iceberg.ops.spread import maintenance_crons
from kafka_iceberg.resources import IcebergCatalogResource, KafkaResource, LakeSlackResource, settings_for


def _budget_left(context: OpExecutionContext, budget_s: float) -> float:
    """Seconds left of a run's budget (0: one round), counted from the run's start as the sensor counts
    it for the hand-over (:func:`kafka_iceberg.sensors.workers.handover_due`); at least 1 s."""
    record = context.instance.get_run_record_by_id(context.run_id)
    started = record.start_time if record is not None and record.start_time else time.time()
    return max(1.0, budget_s - (time.time() - started)) if budget_s > 0 else 0.0


SUCCESSOR_GRACE_S = 120.0
"""Seconds a worker run keeps serving past its budget while its successor starts (its process, its Spark
session, its tables' checks) and does not wait for the pool yet, so the table is never left unserved."""
NO_RUN_RETRIES = {"dagster/max_retries": "0"}
"""A worker run that died is not retried by Dagster's ``run_retries`` (dagster.yaml): the ``lake_workers`` sensor
launches the worker's next run as soon as it has none in progress, with its ``warm`` op. A retry beside it
would be a second run of the same worker starting at the same time, both warming on the same cores."""
_ON_ITS_WAY = [
    DagsterRunStatus.QUEUED,
    DagsterRunStatus.NOT_STARTED,
    DagsterRunStatus.STARTING,
    DagsterRunStatus.STARTED,
]


def successor_on_its_way(context: OpExecutionContext) -> bool:
    """Whether another run of this op's job is queued, starting or started (a successor that does not
    serve yet: one that waits for the pool makes the run hand over, :func:`pool_waiting`)."""
    flt = RunsFilter(job_name=context.job_name, statuses=_ON_ITS_WAY)
    return any(r.dagster_run.run_id != context.run_id for r in context.instance.get_run_records(filters=flt, limit=3))


def _chores_env(resources: dict) -> dict:
    """What :class:`WorkerChores` needs of the op's resources: the Spark session, settings, pyiceberg catalog, Slack."""
    kafka, catalog = resources["kafka"], resources["catalog"]
    spark = resources["pyspark"].spark_session
    return {
        "spark": spark,
        "settings": settings_for(kafka, catalog),
        "catalog": catalog.load(),
        "slack": resources["slack"],
    }


def _serve(
    context: OpExecutionContext, specs: list[TableSpec], crons: dict, pool: str, resources: dict
) -> tuple[dict, WorkerChores]:
    """Run the worker loop over ``specs`` inside an op, with its chores (maintenance under the spread
    ``crons``, checks) between micro-batches; returns what it served per table, and the chores (their
    pending checks)."""
    pyspark, kafka, slack = resources["pyspark"], resources["kafka"], resources["slack"]
    env = _chores_env(resources)
    settings, pycatalog, metadata, sink = env["settings"], env["catalog"], kafka.metadata(), slack.sink()
    tables = {s.identifier: load_table(pycatalog, s.identifier) for s in specs}  # once: state and last maintenance
    chores = WorkerChores(context, specs, rota_for(tables, crons), env)
    mirror = GroupMirror(metadata, settings.stream.group_mirror_s) if settings.stream.group_mirror_s > 0 else None

    def flush(final: bool) -> None:
        for identifier, error in (mirror.flush(final) if mirror is not None else {}).items():
            context.log.warning(f"{identifier}: consumer group not updated (the table is the source of truth): {error}")

    def on_commit(spec: TableSpec, result) -> None:
        if result.snapshot_id is not None:
            md = materialization_metadata(result)
            context.log_event(AssetMaterialization(asset_key=table_key(spec), metadata=md))
            chores.committed(spec, result.snapshots, result.data_files_added)

    def on_failure(spec: TableSpec, error: BaseException) -> None:
        context.log.error(f"{spec.identifier}: micro-batch failed, set aside for this run: {error}")
        sink.send(worker_alert(spec, "micro_batch", error, context.run_id, "ERROR"))

    worker = Worker(
        specs=specs,
        run_batch=lambda spec: run_micro_batch(
            pyspark.spark_session,
            settings,
            spec,
            commit_id=context.run_id,
            kafka=metadata,
            catalog=pycatalog,
            is_alive=dagster_liveness(context),  # the runs in progress now, not when the worker started
            mirror=mirror,
        ),
        watermarks=metadata.watermarks_many,
        committed={i: table_state(t).offsets for i, t in tables.items()},
        on_commit=on_commit,
        on_failure=on_failure,
        budget_s=_budget_left(context, stream_budget_s(dict(context.run.tags), settings.stream.budget_s)),
        idle_s=settings.stream.idle_s,
        should_stop=at_most_every(POOL_CHECK_S, lambda: pool_waiting(context, pool)),
        hold=at_most_every(POOL_CHECK_S, lambda: successor_on_its_way(context)),
        grace_s=SUCCESSOR_GRACE_S,
        chores=chores,
        paused=chores.paused,
        flush=flush,
        threads=settings.stream.worker_threads,
    )
    return worker.run(), chores


def _warm_op(name: str, specs: list[TableSpec]):
    """The op ``warm_<name>``: starts the Spark session and checks the existing tables
    (:func:`kafka_iceberg.batch.pipeline.warm_up`, no commit) outside the pool, so a successor is warm when it
    takes over."""

    @op(name=f"warm_{name}", description="Start the Spark session and check the tables, outside the pool.")
    def _warm(context, pyspark: PySparkResource, kafka: KafkaResource, catalog: IcebergCatalogResource) -> None:
        spark = pyspark.spark_session
        spark.range(1).count()  # one job: the session, its executors and JIT
        lake = connect(spark, settings_for(kafka, catalog), kafka.metadata(), catalog.load())
        done = warm_up(lake, specs)
        context.log.info(f"{name}: warmed {sum(v == 'warm' for v in done.values())} of {len(specs)} tables: {done}")

    return _warm


def _check_op(name: str, specs: list[TableSpec]):
    """The op ``check_<name>``: the checks the serving op left pending, outside the pool (a successor may serve)."""

    @op(name=f"check_{name}", description="The checks still pending after serving, outside the pool.")
    def _check(
        context,
        pending: dict,
        pyspark: PySparkResource,
        kafka: KafkaResource,
        catalog: IcebergCatalogResource,
        slack: LakeSlackResource,
    ) -> None:
        resources = {"pyspark": pyspark, "kafka": kafka, "catalog": catalog, "slack": slack}
        env = _chores_env(resources)  # the Spark session first: its JVM is then one of this process's children
        niceness = env["settings"].stream.check_niceness
        if pending and niceness:
            context.log.info(f"{name}: {lower_cpu_priority(niceness)} threads at nice {niceness} for the last checks")
        WorkerChores.resume(context, specs, pending, env).finish()

    return _check


def worker_job(
    index: int, specs: list[TableSpec], sqlite_catalog: bool, crons: dict[str, dict[str, str]] | None = None
) -> JobDefinition:
    """The job ``lake_worker_<index>``: ``warm`` (the Spark session), ``serve`` (``specs``, their chores), ``check``
    (the checks still pending, outside the pool). The serving op runs their maintenance under
    ``crons`` (identifier -> job kind -> cron, UTC; default: spread among ``specs``). On a SQLite
    catalog its op holds the one commit pool; otherwise a pool of its own (``lake/worker/<index>``,
    limit 1 by default)."""
    name = worker_job_name(index)
    crons = crons or maintenance_crons(specs)
    pool = SQLITE_POOL if sqlite_catalog else worker_pool(index)

    @op(
        name=f"serve_{name}",
        pool=pool,
        ins={"warm": In(Nothing)},
        description=f"Serve {len(specs)} tables: one micro-batch at a time, most-waiting table first.",
    )
    def _serve_op(
        context,  # OpExecutionContext (not annotated: annotations are strings here, which Dagster refuses)
        pyspark: PySparkResource,
        kafka: KafkaResource,
        catalog: IcebergCatalogResource,
        slack: LakeSlackResource,
    ) -> dict:
        resources = {"pyspark": pyspark, "kafka": kafka, "catalog": catalog, "slack": slack}
        served, chores = _serve(context, specs, crons, pool, resources)
        commits = {k: sum(r.snapshot_id is not None for r in v.results) for k, v in served.items()}
        context.log.info(f"{name}: commits per table {commits}")
        failed = {k: str(v.error) for k, v in served.items() if v.error is not None}
        if failed:
            chores.finish()
            raise Failure(description=f"{len(failed)} of {len(specs)} tables failed: {failed}", allow_retries=False)
        return chores.pending()

    @job(
        name=name,
        tags={WORKER_TAG: str(index), **NO_RUN_RETRIES, **run_pod_tags()},
        description=f"Worker {index}: serves {', '.join(s.identifier for s in specs)}.",
    )
    def _job():
        _check_op(name, specs)(_serve_op(_warm_op(name, specs)()))

    return _job


__all__ = ["worker_job"]
