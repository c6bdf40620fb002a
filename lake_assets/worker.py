"""Worker runs: a few long-running runs serve every table (how many: ``LAKE_WORKERS``, or
:func:`kafka_iceberg.batch.worker.worker_count`).

Each worker is a job (``lake_worker_<k>``) that keeps one process and one Spark session: its ``warm``
op starts the session and checks the tables outside the pool, then its ``serve`` op holds the pool and
serves its share of the tables (:func:`kafka_iceberg.batch.worker.assign_workers`) through
:class:`kafka_iceberg.batch.worker.Worker`: most-waiting table first, one bounded micro-batch at a
time, each through the whole write path. Its commits are logged as ``AssetMaterialization`` s of
that table's asset, at most one per table per :data:`~kafka_iceberg.batch.coalesce.MATERIALIZE_EVERY_S`
(:func:`coalesced_metadata`: a table asset run's metadata, covering them all); the consumer groups get the committed
offsets every :data:`GROUP_MIRROR_S` seconds (:class:`kafka_iceberg.batch.mirror.GroupMirror`). Between micro-batches the run does
its chores (:mod:`kafka_iceberg.lake_assets.worker_chores`): the due maintenance and full-scan checks of its
tables, and the ``duplicate_free`` check of each table it committed to; its ``check`` op runs those still pending,
outside the pool and at a lower CPU priority. It hands over only when another run waits for its pool
(:func:`pool_waiting`): its warm successor, launched near the end of its budget
(:data:`kafka_iceberg.sensors.workers.HANDOVER_S`), or a backfill's or a manual run; past its budget it serves on
while that successor starts (:data:`SUCCESSOR_GRACE_S` at most). A table whose micro-batch fails is
logged and set aside; the others keep committing; the run then fails naming it (Slack: once per failure
episode, :mod:`kafka_iceberg.sensors.alerts`).
While serving it exports per-table Prometheus metrics on ``LAKE_METRICS_PORT`` (:mod:`kafka_iceberg.ops.metrics`).
Launched by the ``lake_workers`` sensor (:mod:`kafka_iceberg.sensors.workers`); a sensor-launched
run keeps serving up to :data:`BUDGET_S` seconds (the run tag ``lake/budget_s`` may shorten it), a run
launched by hand or by a backfill serves one round: one micro-batch per table with records waiting.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import closing

from dagster import (
    AssetMaterialization,
    DagsterRunStatus,
    Failure,
    In,
    JobDefinition,
    MetadataValue,
    Nothing,
    OpExecutionContext,
    RunsFilter,
    job,
    op,
)

from kafka_iceberg.batch.coalesce import MATERIALIZE_EVERY_S, Coalesced, Coalescer
from kafka_iceberg.batch.group_batch import run_group_micro_batch
from kafka_iceberg.batch.mirror import GroupMirror
from kafka_iceberg.batch.pipeline import connect, run_micro_batch, warm_up
from kafka_iceberg.batch.recovery import commit_token
from kafka_iceberg.batch.worker import Latest, RunsInProgress, Worker, WorkerPorts
from kafka_iceberg.catalog.tables import load_table, table_state
from kafka_iceberg.config.run_pods import run_pod_tags
from kafka_iceberg.declaration.spec import TableSpec
from kafka_iceberg.kafka.admin import KafkaMetadata
from kafka_iceberg.lake_assets.dagster_internals import first_steps_need_pool, held_back_for_pool
from kafka_iceberg.lake_assets.tables import materialization_metadata
from kafka_iceberg.lake_assets.vocabulary import (
    BUDGET_S,
    BUDGET_TAG,
    IN_PROGRESS,
    SQLITE_POOL,
    WORKER_TAG,
    run_budget_s,
    table_key,
    worker_job_name,
    worker_pool,
)
from kafka_iceberg.lake_assets.worker_chores import ChoreEnv, WorkerChores
from kafka_iceberg.ops import metrics
from kafka_iceberg.ops.episodes import FAILED_TABLES_TAG
from kafka_iceberg.ops.niceness import lower_cpu_priority
from kafka_iceberg.ops.rota import rota_for
from kafka_iceberg.resources import LAKE_KEYS, ResourceKeys, settings_for

IDLE_S = 60.0
"""Seconds a worker run with no records waiting for any of its tables polls before it ends."""
THREADS = 2
"""Micro-batches of different tables one worker run runs at once, in threads of its one process and
Spark session: one table's read (librdkafka, pyarrow, the JVM) overlaps another's commit."""
GROUP_MIRROR_S = 30.0
"""Seconds between a worker run's consumer-group offset commits (and all of them when it stops serving): a
commit per group costs a consumer's connection (:mod:`kafka_iceberg.kafka.groups`); Kafka Connect's
``offset.flush.interval.ms`` is 60 s."""
CHECK_NICENESS = 10
"""The nice value of a sensor-launched worker run's process tree (its Spark JVM included) for its last
checks, so its successor serving on the same host gets the cores first."""
POOL_CHECK_S = 5.0
"""Seconds between two looks of a worker run at the Dagster instance: another run waiting for its pool, a
successor on its way, the runs in progress (four queries, each about 15 ms of the main thread's CPU on a SQLite
instance: 6% of a 100-table worker's time at one look a second, py-spy on 100fd3f). A waiting run is served
within seconds either way; attempts are judged alive with a margin of 30 s (``LIVENESS_MARGIN_MS``)."""
REPORT_GAP_S = 1.0
"""Seconds per table of a worker run's interval between two reports of a table's commits: a run serving more
than 60 tables reports each less often than every :data:`~kafka_iceberg.batch.coalesce.MATERIALIZE_EVERY_S`,
so it logs about one ``AssetMaterialization`` a second in all (each about 57 ms of the main thread's CPU on a
SQLite instance, py-spy on 100fd3f)."""


def at_most_every(seconds: float, predicate: Callable[[], bool], clock: Callable[[], float] = time.monotonic):
    """``predicate`` evaluated at most once per ``seconds``; in between, its last answer."""
    last: list = [None, False]  # (clock when evaluated, answer)

    def throttled() -> bool:
        now = clock()
        if last[0] is None or now - last[0] >= seconds:
            last[:] = [now, predicate()]
        return last[1]

    return throttled


QUEUED_LOOKED_AT = 200
"""Newest queued or starting runs :func:`pool_waiting` looks at (a queue is rarely longer; older ones are seen as
newer ones start)."""


def pool_waiting(context, pool: str) -> bool:
    """Whether another run waits for a slot of ``pool``: a step inside its run (Dagster's pool concurrency
    info), or a queued run that Dagster's run queue starts only once the slot is free (a backfill's, the UI's or
    ``ingest_all``'s micro-batch run on a SQLite catalog; :func:`held_back_for_pool`), unless a STARTING run holds
    the queue back for that pool (one whose worker died: run monitoring fails it), which a hand-over would not
    change. Reads the instance: two queries. False on a storage without pools."""
    storage = context.instance.event_log_storage
    if not storage.supports_global_concurrency_limits:
        return False
    if storage.get_concurrency_info(pool).pending_run_ids - {context.run_id}:
        return True
    flt = RunsFilter(statuses=[DagsterRunStatus.QUEUED, DagsterRunStatus.STARTING])
    others = [r for r in context.instance.get_runs(filters=flt, limit=QUEUED_LOOKED_AT) if r.run_id != context.run_id]
    if any(r.status == DagsterRunStatus.STARTING and first_steps_need_pool(r, pool) for r in others):
        return False
    return any(r.status == DagsterRunStatus.QUEUED and held_back_for_pool(r, pool) for r in others)


def report_every_s(spec: TableSpec, tables: int = 1) -> float:
    """Seconds between two ``AssetMaterialization`` s of ``spec``'s commits in a worker run serving ``tables``
    tables: :data:`MATERIALIZE_EVERY_S`, or ``tables`` x :data:`REPORT_GAP_S` when that is more; but half the
    table's ``freshness.max_snapshot_age`` when that is less (at least 1 s), so the asset's freshness policy
    (:func:`kafka_iceberg.lake_assets.asset_metadata.freshness_policy`) sees a fresh table fresh."""
    return max(1.0, min(max(MATERIALIZE_EVERY_S, tables * REPORT_GAP_S), spec.freshness.max_snapshot_age_s / 2))


def coalesced_metadata(done: Coalesced) -> dict:
    """The materialization metadata of a table's commits since its last report: those of one micro-batch
    (:func:`materialization_metadata` of the merged result: ``records``, ``offset_ranges``, ... cover them
    all; ``snapshot_id``, ``committed_offsets``, ``lag_after_commit`` are the last commit's), with
    ``micro_batches`` (commits merged) and ``first_snapshot_id``."""
    md = materialization_metadata(done.result)
    md["micro_batches"] = MetadataValue.int(done.commits)
    md["first_snapshot_id"] = MetadataValue.text(str(done.first_snapshot_id))
    return md


def _reporter(context: OpExecutionContext, specs: list[TableSpec]):
    """(the :class:`Coalescer` of a worker run's commits of ``specs``, the function that logs what it hands
    out as ``AssetMaterialization`` s of their tables, :func:`coalesced_metadata`)."""
    by_id = {s.identifier: s for s in specs}

    def report(done: dict[str, Coalesced]) -> None:
        for identifier, commits in done.items():
            md = coalesced_metadata(commits)
            context.log_event(AssetMaterialization(asset_key=table_key(by_id[identifier]), metadata=md))

    return Coalescer(every_s=lambda identifier: report_every_s(by_id[identifier], len(by_id))), report


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


def runs_in_progress(context: OpExecutionContext) -> RunsInProgress:
    """The commit tokens of the runs in progress now, from the Dagster instance (call it on the op's main
    thread only): what a worker's micro-batches in pool threads judge attempts' liveness by."""
    runs = context.instance.get_runs(filters=RunsFilter(statuses=IN_PROGRESS))
    return RunsInProgress(frozenset(commit_token(r.run_id) for r in runs), int(time.time() * 1000))


def _batch_runner(run_id: str, env: ChoreEnv, metadata, alive: Latest, mirror: GroupMirror) -> tuple:
    """(``run_batch``, ``run_group``) of a worker run ``run_id``: one micro-batch of a table through the whole
    write path (:func:`run_micro_batch`, its ``BatchResult``), or of a consistency group's tables
    (:func:`run_group_micro_batch`, one ``BatchResult`` per member), called in pool threads: they read ``alive``
    (the runs in progress the main thread listed) and never the Dagster instance."""
    clients = {"commit_id": run_id, "kafka": metadata, "catalog": env.catalog}

    def run_batch(spec: TableSpec):
        return run_micro_batch(env.spark, env.settings, spec, **clients, is_alive=alive.get().is_alive, mirror=mirror)

    def run_group(specs: list[TableSpec]) -> dict:
        return run_group_micro_batch(
            env.spark, env.settings, specs, **clients, is_alive=alive.get().is_alive, mirror=mirror
        )

    return run_batch, run_group


def _worker_for(
    context: OpExecutionContext, specs: list[TableSpec], crons: dict, pool: str, env: ChoreEnv, metadata: KafkaMetadata
) -> tuple[Worker, WorkerChores, Callable[[], None]]:
    """The worker loop over ``specs`` inside an op, its chores (maintenance under the spread ``crons``,
    checks) between micro-batches, and the function that reports the commits not yet reported; the caller
    runs the first, closes the second and ``metadata`` (its pooled readers) and calls the third however it ends."""
    tags = dict(context.run.tags)
    tables = {s.identifier: load_table(env.catalog, s.identifier) for s in specs}  # once: state and last maintenance
    states = {i: table_state(t) for i, t in tables.items()}
    committed = {i: state.offsets for i, state in states.items()}  # replaced on each commit, on the main thread
    other_run = at_most_every(POOL_CHECK_S, lambda: successor_on_its_way(context))  # a predecessor or a successor
    chores = WorkerChores(context, specs, rota_for(tables, crons), env, another_run=other_run)
    mirror = GroupMirror(metadata, GROUP_MIRROR_S)
    events, report = _reporter(context, specs)
    alive = Latest(runs_in_progress(context))  # read by micro-batches in pool threads; set here, on the main thread
    refresh = at_most_every(POOL_CHECK_S, lambda: runs_in_progress(context))

    def flush(final: bool) -> None:
        alive.set(refresh())  # the runs in progress now, not when the worker started
        report(events.drain() if final else events.due())
        for identifier, error in mirror.flush(final).items():
            context.log.warning(f"{identifier}: consumer group not updated (the table is the source of truth): {error}")

    def on_commit(spec: TableSpec, result) -> None:
        if result.snapshot_id is not None:
            committed[spec.identifier] = dict(result.offsets)
            report({spec.identifier: done} if (done := events.add(spec.identifier, result)) else {})
            chores.committed(spec, result.snapshots, result.data_files_added)

    def on_failure(spec: TableSpec, error: BaseException) -> None:
        # no Slack post here: the run fails naming the table, and run_failure_alert_sensor posts once per episode
        context.log.error(f"{spec.identifier}: micro-batch failed, set aside for this run: {error}")

    run_batch, run_group = _batch_runner(context.run_id, env, metadata, alive, mirror)
    ports = WorkerPorts(  # run_batch and run_group run in pool threads and do not touch the Dagster instance
        run_batch=metrics.metered_batch(run_batch),
        run_group=metrics.metered_group(run_group),
        watermarks=metrics.metered_watermarks(metadata.watermarks_many, specs, committed, states),
        on_commit=on_commit,
        on_failure=on_failure,
        should_stop=at_most_every(POOL_CHECK_S, lambda: pool_waiting(context, pool)),
        hold=other_run,
        chores=chores,
        paused=chores.paused,
        working=chores.working,
        flush=flush,
    )
    worker = Worker(
        specs,
        ports,
        committed=dict(committed),
        budget_s=_budget_left(context, run_budget_s(tags)),
        idle_s=0.0 if BUDGET_TAG in tags else IDLE_S,
        grace_s=SUCCESSOR_GRACE_S,
        threads=THREADS,
    )
    return worker, chores, lambda: report(events.drain())


def _warm_op(name: str, specs: list[TableSpec], keys: ResourceKeys):
    """The op ``warm_<name>``: starts the Spark session and checks the existing tables
    (:func:`kafka_iceberg.batch.pipeline.warm_up`, no commit) outside the pool, so a successor is warm when it
    takes over."""

    @op(
        name=f"warm_{name}",
        description="Start the Spark session and check the tables, outside the pool.",
        required_resource_keys=keys.required("pyspark", "kafka", "catalog"),
    )
    def _warm(context) -> None:
        pyspark, kafka, catalog = keys.of(context, "pyspark", "kafka", "catalog")
        spark = pyspark.spark_session
        spark.range(1).count()  # one job: the session, its executors and JIT
        lake = connect(spark, settings_for(kafka, catalog), kafka.metadata(), catalog.load())
        done = warm_up(lake, specs)
        context.log.info(f"{name}: warmed {sum(v == 'warm' for v in done.values())} of {len(specs)} tables: {done}")

    return _warm


def _check_op(name: str, specs: list[TableSpec], keys: ResourceKeys):
    """The op ``check_<name>``: the checks the serving op left pending, outside the pool (a successor may serve)."""

    @op(
        name=f"check_{name}",
        description="The checks still pending after serving, outside the pool.",
        required_resource_keys=keys.required("pyspark", "kafka", "catalog", "slack"),
    )
    def _check(context, pending: dict) -> None:
        pyspark, kafka, catalog, slack = keys.of(context, "pyspark", "kafka", "catalog", "slack")
        env = ChoreEnv.of(pyspark.spark_session, kafka, catalog, slack)  # the JVM is then a child of this process
        tags = dict(context.run.tags)
        if pending and run_budget_s(tags) > 0 and BUDGET_TAG not in tags:  # a successor may serve on this host
            changed = lower_cpu_priority(CHECK_NICENESS)
            context.log.info(f"{name}: {changed} threads at nice {CHECK_NICENESS} for the last checks")
        with WorkerChores.resume(context, specs, pending, env) as chores:
            chores.finish()

    return _check


def worker_job(
    index: int,
    specs: list[TableSpec],
    sqlite_catalog: bool,
    crons: dict[str, dict[str, str]],
    keys: ResourceKeys = LAKE_KEYS,
) -> JobDefinition:
    """The job ``lake_worker_<index>``: ``warm`` (the Spark session), ``serve`` (``specs``, their chores), ``check``
    (the checks still pending, outside the pool). The serving op runs their maintenance under
    ``crons`` (identifier -> job kind -> cron, UTC: :func:`kafka_iceberg.schedules.spread.maintenance_crons`
    over every table of the location; a table without crons is never maintained by cron). On a SQLite
    catalog its op holds the one commit pool; otherwise a pool of its own (``lake/worker/<index>``,
    limit 1 by default; another lake's under its key prefix, :func:`worker_pool`)."""
    name = keys.name(worker_job_name(index))
    pool = SQLITE_POOL if sqlite_catalog else worker_pool(index, keys.name(""))

    @op(
        name=f"serve_{name}",
        pool=pool,
        ins={"warm": In(Nothing)},
        description=f"Serve {len(specs)} tables: one micro-batch at a time, most-waiting table first.",
        required_resource_keys=keys.required("pyspark", "kafka", "catalog", "slack"),
    )
    def _serve_op(context) -> dict:  # OpExecutionContext (not annotated: annotations are strings here)
        pyspark, kafka, catalog, slack = keys.of(context, "pyspark", "kafka", "catalog", "slack")
        env = ChoreEnv.of(pyspark.spark_session, kafka, catalog, slack)
        metadata = kafka.metadata(reader_pool=True)  # the range reads keep their consumers while the op serves
        worker, chores, report_rest = _worker_for(context, specs, crons, pool, env, metadata)
        # the metrics endpoint lives while the op serves; the chores' thread and the consumers close however it ends
        with metrics.serve(env.settings.stream.metrics_port) as port, chores, closing(metadata):
            context.log.info(f"{name}: Prometheus metrics on port {port}" if port else f"{name}: no metrics port")
            try:
                served = worker.run()
            finally:
                report_rest()  # a run that crashed still reports what it committed
            commits = {k: sum(r.snapshot_id is not None for r in v.results) for k, v in served.items()}
            context.log.info(f"{name}: commits per table {commits}")
            failed = {k: str(v.error) for k, v in served.items() if v.error is not None}
            if failed:
                chores.finish()
                context.instance.add_run_tags(context.run_id, {FAILED_TABLES_TAG: ",".join(sorted(failed))})
                raise Failure(description=f"{len(failed)} of {len(specs)} tables failed: {failed}", allow_retries=False)
            return chores.pending()

    @job(
        name=name,
        tags={WORKER_TAG: str(index), **NO_RUN_RETRIES, **run_pod_tags()},
        description=f"Worker {index}: serves {', '.join(s.identifier for s in specs)}.",
    )
    def _job():
        _check_op(name, specs, keys)(_serve_op(_warm_op(name, specs, keys)()))

    return _job


__all__ = [
    "BUDGET_S",
    "BUDGET_TAG",
    "CHECK_NICENESS",
    "GROUP_MIRROR_S",
    "IDLE_S",
    "POOL_CHECK_S",
    "REPORT_GAP_S",
    "THREADS",
    "coalesced_metadata",
    "report_every_s",
    "at_most_every",
    "pool_waiting",
    "run_budget_s",
    "worker_job",
]
