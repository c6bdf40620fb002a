"""One Dagster asset, plus two asset checks, per declared table.

Thin by design: the asset calls :func:`kafka_iceberg.batch.pipeline.run_micro_batch` and turns
its result into materialization metadata; the checks call :mod:`kafka_iceberg.ops.checks`.

Every table asset is partitioned by :data:`kafka_iceberg.lake_assets.vocabulary.MICRO_BATCHES`, a dynamic partitions definition
shared by all tables whose keys are a fixed ring of slots (``slot-00`` … ``slot-49``,
:func:`kafka_iceberg.lake_assets.backfill.ring_slot_keys`) that every table reuses, least recently used
first, so partitions stay bounded. A partition key is a micro-batch *slot*, not an offset range: a run of
any slot ingests the table's next bounded micro-batch from its committed offsets (the Kafka
offsets in the Iceberg snapshot summary decide what is read), so slots run in any order
commit consecutive offset ranges, re-running an old slot never re-ingests, and a slot that
finds nothing new commits nothing. The offset ranges a slot committed are in its
materialization metadata (``offset_ranges``). Backfills over several slots run one slot per
run (``BackfillPolicy.multi_run(1)``); see :mod:`kafka_iceberg.lake_assets.backfill`.
"""

import warnings
from datetime import UTC, datetime
from pathlib import Path

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetCheckSeverity,
    AssetExecutionContext,
    AssetSpec,
    BackfillPolicy,
    BetaWarning,
    Failure,
    MaterializeResult,
    MetadataValue,
    RunsFilter,
    asset,
    asset_check,
)

from kafka_iceberg.batch.pipeline import BatchResult, run_micro_batch
from kafka_iceberg.batch.planning import offset_lag
from kafka_iceberg.batch.recovery import commit_token
from kafka_iceberg.catalog.tables import load_table, metadata_view, qualified
from kafka_iceberg.config.settings import Settings, load_settings
from kafka_iceberg.declaration.spec import TableSpec
from kafka_iceberg.lake_assets.asset_metadata import (
    NOT_RETRYABLE,
    RETRY_POLICY,
    column_schema,
    definition_metadata,
    freshness_policy,
)
from kafka_iceberg.lake_assets.check_alerts import alert_check
from kafka_iceberg.lake_assets.vocabulary import (
    IN_PROGRESS,
    MICRO_BATCHES,
    SNAPSHOT_ID_METADATA,
    SQLITE_POOL,
    table_alert,
    table_key,
    table_pool,
    topic_key,
)
from kafka_iceberg.ops import checks
from kafka_iceberg.ops.alerts import AlertSink
from kafka_iceberg.resources import (
    LAKE_KEYS,
    IcebergCatalogResource,
    KafkaResource,
    LakeSlackResource,
    LakeSparkResource,
    ResourceKeys,
    settings_for,
)
from kafka_iceberg.state import state_at


def topic_asset(spec: TableSpec) -> AssetSpec:
    """The Kafka topic as an external asset, so lineage reads topic -> table -> downstream."""
    return AssetSpec(
        key=topic_key(spec),
        description=f"Kafka topic {spec.topic} (produced outside Dagster).",
        group_name="kafka",
        kinds={"kafka"},
        metadata={"topic": spec.topic},
    )


def dagster_liveness(context):
    """Whether an attempt's run is still alive: its commit token belongs to a run in progress. The runs
    are queried at the first call (recovery calls it only for another run's attempt branch), then kept."""
    tokens: set[str] | None = None

    def is_alive(attempt) -> bool:
        nonlocal tokens
        if tokens is None:
            tokens = {
                commit_token(r.run_id) for r in context.instance.get_runs(filters=RunsFilter(statuses=IN_PROGRESS))
            }
        return attempt.token in tokens

    return is_alive


def _ts(ms: int | None):
    return MetadataValue.timestamp(ms / 1000) if ms is not None else MetadataValue.text("none")


NOTHING_NEW = "none (nothing new)"
"""The ``snapshot_id`` metadata of a micro-batch that committed nothing."""


def materialization_metadata(result: BatchResult) -> dict[str, object]:
    """Metadata the UI plots for one micro-batch (see :class:`BatchResult` for units)."""
    md: dict[str, object] = {
        "records": MetadataValue.int(result.records),
        "kafka_bytes": MetadataValue.int(result.kafka_bytes),
        "megabytes_read": MetadataValue.float(round(result.kafka_bytes / 1e6, 3)),
        "data_files_added": MetadataValue.int(result.data_files_added),
        "data_bytes_added": MetadataValue.int(result.data_bytes_added),
        "lag_after_commit": MetadataValue.int(result.total_lag),
        "lag_after_commit_by_partition": MetadataValue.json({str(p): v for p, v in result.lag_after.items()}),
        "offset_ranges": MetadataValue.json({str(p): {"start": s, "end": e} for p, (s, e) in result.ranges.items()}),
        "committed_offsets": MetadataValue.json({str(p): o for p, o in result.offsets.items()}),
        SNAPSHOT_ID_METADATA: MetadataValue.text(str(result.snapshot_id) if result.snapshot_id else NOTHING_NEW),
        "commit_id": MetadataValue.text(result.commit_id),
        "valid_through": _ts(result.valid_through_ms),
        "recovered_dead_attempts": MetadataValue.int(len(result.recovery.dead_attempts)),
        "recovered_orphan_files": MetadataValue.int(len(result.recovery.orphan_files_deleted)),
        "records_read": MetadataValue.int(result.records_read),
        "records_quarantined": MetadataValue.int(result.quarantined),
        "quarantined_by_kind": MetadataValue.json(result.quarantine_kinds),
        "schema_changes": MetadataValue.json(result.schema_changes),
    }
    if result.snapshots is not None:
        md["snapshot_count"] = MetadataValue.int(result.snapshots)
    for phase, seconds in result.phase_seconds.items():
        md[f"phase_{phase}"] = MetadataValue.float(seconds)
    md["seconds_total"] = MetadataValue.float(round(sum(result.phase_seconds.values()), 3))
    if result.group_commit_error:
        md["consumer_group_commit_error"] = MetadataValue.text(result.group_commit_error)
    return md


def _table_asset_decorator(
    spec: TableSpec, sqlite_catalog: bool, tables_file: Path | None, catalog_name: str, keys: ResourceKeys
):
    """The ``@asset`` decorator of :func:`table_asset`, with its policies, metadata and resource ``keys``."""
    if tables_file is None:
        tables_file = load_settings().tables_file

    with warnings.catch_warnings():
        # backfill_policy is marked beta in Dagster 1.13; without this filter every process that
        # loads the code location prints the warning once per table
        warnings.simplefilter("ignore", BetaWarning)
        return asset(
            key=table_key(spec),
            deps=[topic_key(spec)],
            group_name="lake",
            kinds={"iceberg", "spark", "kafka"},
            required_resource_keys=keys.required("pyspark", "kafka", "catalog", "slack"),
            description=spec.description or f"Iceberg table {spec.identifier} ingested from Kafka topic {spec.topic}.",
            metadata={
                "iceberg_table": spec.identifier,
                "topic": spec.topic,
                "consumer_group": spec.consumer_group,
                "max_records_per_partition": spec.max_records_per_partition,
                "partition_by": ", ".join(spec.partition_by) or "unpartitioned",
                **definition_metadata(spec, tables_file, catalog_name),
            },
            owners=list(spec.owners),
            tags=dict(spec.tags),
            freshness_policy=freshness_policy(spec),
            # micro-batches are safe to retry (the snapshot summary decides what is read)
            retry_policy=RETRY_POLICY,
            # one materialization of a table at a time (see dagster.yaml: concurrency.pools)
            pool=table_pool(spec, sqlite_catalog),
            partitions_def=MICRO_BATCHES,
            # a backfill over N slots is N runs, one bounded micro-batch each
            backfill_policy=BackfillPolicy.multi_run(1),
        )


def _one_batch(
    spec: TableSpec,
    context: AssetExecutionContext,
    pyspark: LakeSparkResource,
    kafka: KafkaResource,
    catalog: IcebergCatalogResource,
    slack: LakeSlackResource,
    settings: Settings,
) -> MaterializeResult:
    """One micro-batch of ``spec`` through the write path (:func:`run_micro_batch`, as a worker's), as a
    materialization's metadata. Raises ``Failure`` (not retried) for the errors a retry cannot fix."""
    try:
        result = run_micro_batch(
            pyspark.spark_session,
            settings,
            spec,
            commit_id=context.run_id,
            kafka=kafka.metadata(),
            catalog=catalog.load(),
            is_alive=dagster_liveness(context),
        )
    except NOT_RETRYABLE as exc:  # a retry cannot fix these; broker and catalog errors are retried
        raise Failure(description=str(exc), allow_retries=False) from exc
    if result.recovery.did_anything:
        context.log.warning(f"recovered after dead attempts on {spec.identifier}: {result.recovery}")
    context.log.info(
        f"{spec.identifier} slot {context.partition_key}: {result.records} records, "
        f"snapshot {result.snapshot_id}, lag left {result.total_lag}"
    )
    if result.schema_changes:
        alert_schema_change(spec, result.schema_changes, slack.sink())
    md = materialization_metadata(result)
    if result.total_records is not None:
        md["dagster/row_count"] = MetadataValue.int(result.total_records)
    md["dagster/table_name"] = MetadataValue.text(qualified(settings, spec))
    if spec.unknown_fields == "evolve":  # the live schema, with columns added by evolution
        table = load_table(catalog.load(), spec.identifier)
        if table is not None:
            md["dagster/column_schema"] = column_schema(spec, table.schema().fields)
    return MaterializeResult(metadata=md)


def table_asset(
    spec: TableSpec,
    sqlite_catalog: bool = True,
    tables_file: Path | None = None,
    catalog_name: str = "lake",
    keys: ResourceKeys = LAKE_KEYS,
):
    """The asset that materializes one micro-batch of ``spec`` per run (per :data:`MICRO_BATCHES` slot): the
    UI's Materialize button, ``ingest_all`` and backfills. Streaming is the worker runs' (their commits are
    materializations of this asset too, :mod:`kafka_iceberg.lake_assets.worker`).

    The partition key only names the slot; what is read is decided by the table's committed
    offsets when the run plans. A run must target exactly one slot (a backfill makes one run
    per slot); ``sqlite_catalog`` picks the concurrency pool (:func:`table_pool`). Owners, tags,
    a ``FreshnessPolicy``, a ``RetryPolicy``, the column schema, the table name and code
    references come from the declaration (:mod:`kafka_iceberg.lake_assets.asset_metadata`); ``tables_file``
    (default: the declarations file of the settings) is what the code references point at.
    """
    decorator = _table_asset_decorator(spec, sqlite_catalog, tables_file, catalog_name, keys)

    @decorator
    def _materialize(context: AssetExecutionContext) -> MaterializeResult:
        pyspark, kafka, catalog, slack = keys.of(context, "pyspark", "kafka", "catalog", "slack")
        # one micro-batch per run (by hand, ingest_all, a backfill's run); the worker runs stream
        return _one_batch(spec, context, pyspark, kafka, catalog, slack, settings_for(kafka, catalog))

    _materialize.__name__ = f"ingest_{spec.name}"
    return _materialize


def alert_schema_change(spec: TableSpec, changes: list[dict], sink: AlertSink | None = None) -> bool:
    """Post a WARN alert that schema evolution changed the table, or that a registry schema change
    was blocked and its records quarantined (never a silent schema change)."""
    blocked = [c for c in changes if c.get("change") == "blocked"]
    value = ", ".join(
        f"schema id {c['schema_id']} blocked"
        if c.get("change") == "blocked"
        else f"{'~' if c.get('change') == 'promotion' else '+'}{c['column']} {c['type']}"
        for c in changes
    )
    summary = (
        (
            f"{spec.identifier}: blocked schema change in topic {spec.topic}, records quarantined: "
            + "; ".join(c["reason"] for c in blocked)
        )
        if blocked
        else (
            f"{spec.identifier}: new fields in topic {spec.topic} were added as optional columns (unknown_fields: evolve)"
        )
    )
    return (sink or AlertSink.from_env()).send(
        table_alert(
            spec,
            measure="schema_changes",
            value=value,
            severity="WARN",
            summary=summary,
            source=f"asset {spec.name}",
        )
    )


def check_result(outcome: checks.CheckOutcome, severity: AssetCheckSeverity) -> AssetCheckResult:
    """A check outcome as an ``AssetCheckResult`` whose metadata are the outcome's figures."""
    md = {}
    for k, v in outcome.figures.items():
        if isinstance(v, (list, dict)):
            md[k] = MetadataValue.json(v)
        elif isinstance(v, bool) or v is None:
            md[k] = MetadataValue.text(str(v))
        elif isinstance(v, int):
            md[k] = MetadataValue.int(v)
        elif isinstance(v, float):
            md[k] = MetadataValue.float(v)
        else:
            md[k] = MetadataValue.text(str(v))
    return AssetCheckResult(passed=outcome.passed, severity=severity, description=outcome.summary, metadata=md)


def table_checks(spec: TableSpec, keys: ResourceKeys = LAKE_KEYS) -> list:
    """The ``duplicate_free`` and ``freshness`` asset checks of one table. Each posts to Slack when its
    status changes (:func:`kafka_iceberg.lake_assets.check_alerts.alert_check`)."""
    return [_duplicate_free_check(spec, keys), _freshness_check(spec, keys)]


def _duplicate_free_check(spec: TableSpec, keys: ResourceKeys):
    @asset_check(
        asset=table_key(spec),
        name="duplicate_free",
        blocking=False,
        description="No overlapping snapshot offset ranges, no (partition, offset) twice, no data file twice.",
        required_resource_keys=keys.required("pyspark", "kafka", "catalog", "slack"),
    )
    def _duplicate_free(context: AssetCheckExecutionContext) -> AssetCheckResult:
        pyspark, kafka, catalog, slack = keys.of(context, "pyspark", "kafka", "catalog", "slack")
        settings = settings_for(kafka, catalog)
        table = load_table(catalog.load(), spec.identifier)
        if table is None:
            return AssetCheckResult(passed=False, description=f"table {spec.identifier} does not exist yet")
        # after the run's own commits: only the rows they added; a check run on its own: the full scan
        outcome = checks.duplicate_free(
            pyspark.spark_session, qualified(settings, spec), spec, table, commit_id=context.run.run_id
        )
        alert_check(context, slack, spec, "duplicate_free", outcome, "ERROR")
        return check_result(outcome, AssetCheckSeverity.ERROR)

    _duplicate_free.__name__ = f"{spec.name}_duplicate_free"
    return _duplicate_free


def _freshness_check(spec: TableSpec, keys: ResourceKeys):
    @asset_check(
        asset=table_key(spec),
        name="freshness",
        blocking=False,
        description="Age of the latest snapshot and of its valid-through timestamp against the declared thresholds.",
        required_resource_keys=keys.required("kafka", "catalog", "slack"),
    )
    def _freshness(context: AssetCheckExecutionContext) -> AssetCheckResult:
        kafka, catalog, slack = keys.of(context, "kafka", "catalog", "slack")
        table = load_table(catalog.load(), spec.identifier)
        if table is None:
            return AssetCheckResult(passed=False, description=f"table {spec.identifier} does not exist yet")
        view = metadata_view(table)
        lag = offset_lag(kafka.metadata().watermarks(spec.topic), state_at(view.snapshots, view.main).offsets)
        outcome = checks.freshness(spec, view, lag)
        if "valid_through_ms" in outcome.figures:
            outcome.figures["valid_through"] = datetime.fromtimestamp(
                outcome.figures["valid_through_ms"] / 1000, tz=UTC
            ).isoformat()
        outcome.figures["lag_by_partition"] = {str(p): v for p, v in lag.items()}
        alert_check(context, slack, spec, "freshness", outcome, "WARN")
        return check_result(outcome, AssetCheckSeverity.WARN)

    _freshness.__name__ = f"{spec.name}_freshness"
    return _freshness


# IN_PROGRESS, MICRO_BATCHES, SQLITE_POOL, table_key, table_pool and topic_key live in
# kafka_iceberg.lake_assets.vocabulary; they stay importable from here for existing callers.
__all__ = [
    "IN_PROGRESS",
    "MICRO_BATCHES",
    "SQLITE_POOL",
    "alert_schema_change",
    "check_result",
    "table_asset",
    "table_checks",
    "table_key",
    "table_pool",
    "topic_asset",
    "topic_key",
    "materialization_metadata",
]
