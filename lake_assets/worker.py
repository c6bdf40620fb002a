"""Worker runs (``LAKE_WORKERS`` >= 1): a few long-running runs serve every table.

Each worker is a job (``lake_worker_<k>``) of one op that keeps one process and one Spark session
and serves its share of the tables (:func:`kafka_iceberg.batch.worker.worker_of`) through
:class:`kafka_iceberg.batch.worker.Worker`: most-waiting table first, one bounded micro-batch at a
time, each through the whole write path. Every commit is logged as an ``AssetMaterialization`` of
that table's asset, with the same metadata as a table asset's run; at the end of the run each table
it committed to gets its ``duplicate_free`` evaluation over the rows the run added. A table whose micro-batch fails is
reported (log and Slack) and set aside; the others keep committing; the run then fails naming it.
Launched by the ``lake_workers`` sensor (:mod:`kafka_iceberg.sensors.workers`); a sensor-launched
run keeps serving up to ``LAKE_STREAM_BUDGET_S`` seconds, a run launched by hand serves one round.
"""

from __future__ import annotations

from dagster import (
    AssetCheckEvaluation,
    AssetCheckSeverity,
    AssetMaterialization,
    Failure,
    JobDefinition,
    OpExecutionContext,
    job,
    op,
)
from dagster_pyspark import PySparkResource

from kafka_iceberg.batch.pipeline import run_micro_batch
from kafka_iceberg.batch.worker import Worker
from kafka_iceberg.catalog.tables import load_table, metadata_view, qualified, read_state
from kafka_iceberg.declaration.spec import TableSpec
from kafka_iceberg.lake_assets.check_alerts import alert_check
from kafka_iceberg.lake_assets.streaming import others_waiting, stream_budget_s
from kafka_iceberg.lake_assets.tables import check_result, dagster_liveness, materialization_metadata
from kafka_iceberg.lake_assets.vocabulary import SQLITE_POOL, WORKER_TAG, table_key, worker_job_name
from kafka_iceberg.ops import checks
from kafka_iceberg.ops.alerts import Alert
from kafka_iceberg.resources import IcebergCatalogResource, KafkaResource, LakeSlackResource, settings_for


def _alert_failure(spec: TableSpec, error: BaseException, sink, run_id: str) -> None:
    sink.send(
        Alert(
            table=spec.identifier,
            asset_key_path=list(table_key(spec).path),
            measure="micro_batch",
            value=type(error).__name__,
            severity="ERROR",
            summary=f"{spec.identifier}: micro-batch failed in worker run {run_id}: {error}",
            source="worker",
        )
    )


def _serve(context: OpExecutionContext, specs: list[TableSpec], pool: str, pyspark, kafka, catalog, slack) -> dict:
    """Run the worker loop over ``specs`` inside an op; returns what it served per table."""
    settings = settings_for(kafka, catalog)
    metadata, pycatalog, sink = kafka.metadata(), catalog.load(), slack.sink()

    def on_commit(spec: TableSpec, result) -> None:
        if result.snapshot_id is not None:
            md = materialization_metadata(result)
            context.log_event(AssetMaterialization(asset_key=table_key(spec), metadata=md))

    def on_failure(spec: TableSpec, error: BaseException) -> None:
        context.log.error(f"{spec.identifier}: micro-batch failed, set aside for this run: {error}")
        _alert_failure(spec, error, sink, context.run_id)

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
        ),
        watermarks=metadata.watermarks_many,
        committed={s.identifier: read_state(pycatalog, s.identifier).offsets for s in specs},
        on_commit=on_commit,
        on_failure=on_failure,
        budget_s=stream_budget_s(dict(context.run.tags), settings.stream.budget_s),
        idle_s=settings.stream.idle_s,
        should_stop=lambda: others_waiting(context, pool),
    )
    return worker.run()


def _check_commits(context, specs: list[TableSpec], served: dict, pyspark, kafka, catalog, slack) -> None:
    """The ``duplicate_free`` check of every table this run committed to, over the rows its commits
    added (the run id is their commit id), logged as that table's check evaluation and alerted on a
    change of status."""
    settings, pycatalog = settings_for(kafka, catalog), catalog.load()
    for spec in specs:
        if not any(r.snapshot_id is not None for r in served[spec.identifier].results):
            continue
        table = load_table(pycatalog, spec.identifier)
        outcome = checks.duplicate_free(
            pyspark.spark_session, qualified(settings, spec), spec, metadata_view(table), commit_id=context.run_id
        )
        alert_check(context, slack, spec, "duplicate_free", outcome, "ERROR")
        result = check_result(outcome, AssetCheckSeverity.ERROR)
        context.log_event(
            AssetCheckEvaluation(
                asset_key=table_key(spec),
                check_name="duplicate_free",
                passed=result.passed,
                metadata=result.metadata,
                severity=result.severity,
                description=result.description,
            )
        )


def worker_job(index: int, specs: list[TableSpec], sqlite_catalog: bool) -> JobDefinition:
    """The job ``lake_worker_<index>``: one op serving ``specs``. On a SQLite catalog its op holds the
    one commit pool; otherwise a pool of its own (``lake_worker_<index>``, limit 1 by default)."""
    name = worker_job_name(index)
    pool = SQLITE_POOL if sqlite_catalog else name

    @op(
        name=f"serve_{name}",
        pool=pool,
        description=f"Serve {len(specs)} tables: one micro-batch at a time, most-waiting table first.",
    )
    def _serve_op(
        context,  # OpExecutionContext (not annotated: annotations are strings here, which Dagster refuses)
        pyspark: PySparkResource,
        kafka: KafkaResource,
        catalog: IcebergCatalogResource,
        slack: LakeSlackResource,
    ) -> None:
        served = _serve(context, specs, pool, pyspark, kafka, catalog, slack)
        _check_commits(context, specs, served, pyspark, kafka, catalog, slack)
        commits = {k: sum(r.snapshot_id is not None for r in v.results) for k, v in served.items()}
        context.log.info(f"{name}: commits per table {commits}")
        failed = {k: str(v.error) for k, v in served.items() if v.error is not None}
        if failed:
            raise Failure(description=f"{len(failed)} of {len(specs)} tables failed: {failed}", allow_retries=False)

    @job(
        name=name,
        tags={WORKER_TAG: str(index)},
        description=f"Worker {index}: serves {', '.join(s.identifier for s in specs)}.",
    )
    def _job():
        _serve_op()

    return _job


__all__ = ["worker_job"]
