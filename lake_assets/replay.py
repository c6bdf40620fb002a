"""The Dagster job ``replay``: replay a declared table's Kafka offset range into a new table or a
branch of the table, and validate it against the original. Launched from the UI's Launchpad
(Jobs -> replay) with a typed config; thin by design, the work is
:func:`kafka_iceberg.replay.run_replay`.
"""

from dagster import (
    AssetKey,
    AssetMaterialization,
    AssetObservation,
    Config,
    Failure,
    MetadataValue,
    OpExecutionContext,
    RunsFilter,
    job,
    op,
)
from pydantic import Field

from kafka_iceberg.batch.recovery import commit_token
from kafka_iceberg.catalog.tables import load_table
from kafka_iceberg.declaration.spec import TableSpec, find_table
from kafka_iceberg.errors import ConfigError
from kafka_iceberg.lake_assets.vocabulary import IN_PROGRESS, commit_pool
from kafka_iceberg.replay import ReplayRequest, ReplayResult, run_replay
from kafka_iceberg.resources import LAKE_KEYS, ResourceKeys, settings_for


class ReplayConfig(Config):
    """What to replay (the Launchpad form). Give one start (``from_offsets``, ``from_time`` or
    ``from_snapshot``), at most one end, and at most one target; see docs/operations.md."""

    table: str = Field(description="declared table: its name (flights) or identifier (nyc.flights)")
    from_offsets: str | None = Field(
        default=None, description='start offsets per partition, "0:100,1:250" (only these partitions), or "earliest"'
    )
    from_time: str | None = Field(
        default=None,
        description="start time, ISO-8601 (2013-01-01T05:00:00Z) or ms since epoch: per partition the "
        "first offset whose record timestamp is at or after it",
    )
    from_snapshot: str | None = Field(
        default=None,
        description="snapshot id of the table's main ancestry whose committed offsets are the start "
        "(a string: snapshot ids exceed JavaScript's integer precision); needed for branch",
    )
    to_offsets: str | None = Field(
        default=None, description='exclusive end offsets "0:500,1:900"; default: the original\'s committed offsets'
    )
    to_time: str | None = Field(default=None, description="exclusive end time, ISO-8601 or ms since epoch")
    into: str | None = Field(
        default=None, description="new table namespace.table (default <namespace>.<table>_replay_<digest>)"
    )
    branch: str | None = Field(
        default=None, description="rebuild on branch replay_<branch> of the table itself, from from_snapshot"
    )
    validate_against_original: bool = Field(
        default=True,
        description="compare the replay with the original over the same offsets (the end may then not "
        "exceed the original's committed offsets); a mismatch fails the run",
    )
    max_records_per_partition: int | None = Field(
        default=None, description="offsets per partition per micro-batch (default: the table's)"
    )


def _liveness(context: OpExecutionContext):
    runs = context.instance.get_runs(filters=RunsFilter(statuses=IN_PROGRESS))
    tokens = {commit_token(r.run_id) for r in runs}
    return lambda attempt: attempt.token in tokens


def replay_metadata(result: ReplayResult, catalog_name: str) -> dict[str, object]:
    """Metadata of the replay target's materialization (offsets as Kafka offsets, counts in records)."""
    md: dict[str, object] = {
        "original_table": MetadataValue.text(result.original),
        "target_table": MetadataValue.text(result.target),
        "branch": MetadataValue.text(result.branch or "none (new table)"),
        "offset_ranges": MetadataValue.json(
            {str(p): {"start": s, "end": e} for p, (s, e) in result.range.ranges.items()}
        ),
        "committed_offsets": MetadataValue.json({str(p): o for p, o in sorted(result.offsets.items())}),
        "records": MetadataValue.int(result.records),
        "batches": MetadataValue.int(result.batches),
        "complete": MetadataValue.bool(result.complete),
        "resumed": MetadataValue.bool(result.resumed),
        "snapshot_id": MetadataValue.text(str(result.snapshot_id)),
        "seconds_total": MetadataValue.float(result.seconds),
    }
    report = result.validation
    if report is None:
        md["validation"] = MetadataValue.text("not run" if result.complete else "not run: the replay is incomplete")
    else:
        md["validation"] = MetadataValue.json(report.to_dict())
        md["valid"] = MetadataValue.bool(report.valid)
        for key in ("records_compared", "missing", "extra", "differing"):
            md[key] = MetadataValue.int(getattr(report, key))
    if result.branch:
        md["publish_sql"] = MetadataValue.md("\n".join(f"    {s};" for s in result.publish_sql(catalog_name)))
    return md


def _request(config: ReplayConfig) -> ReplayRequest:
    """The :class:`ReplayRequest` of the job's Launchpad config (raises ``ReplayError`` on bad input)."""
    return ReplayRequest.from_strings(
        from_offsets=config.from_offsets,
        from_time=config.from_time,
        from_snapshot=config.from_snapshot,
        to_offsets=config.to_offsets,
        to_time=config.to_time,
        into=config.into,
        branch=config.branch,
        validate=config.validate_against_original,
        max_records_per_partition=config.max_records_per_partition,
    )


def _target_event(result, catalog_name: str, pycatalog):
    """The replay target's event: a materialization of a new table, or an observation of a rebuilt branch."""
    md = replay_metadata(result, catalog_name)
    key = AssetKey(["lake", *result.target.split(".")])
    if result.branch is not None:
        return AssetObservation(
            asset_key=key, description=f"rebuilt on branch {result.branch}; main unchanged", metadata=md
        )
    table = load_table(pycatalog, result.target)
    if table is not None and table.current_snapshot() is not None:
        md["dagster/row_count"] = MetadataValue.int(int(table.current_snapshot().summary["total-records"]))
    return AssetMaterialization(asset_key=key, description=f"replay of {result.original}", metadata=md)


def replay_job(specs: list[TableSpec], sqlite_catalog: bool = True, keys: ResourceKeys = LAKE_KEYS):
    """The ``replay`` job of the lake of ``specs`` (its declared tables; named by ``keys``,
    :meth:`ResourceKeys.name`): one op that replays one of them, validates, and records the target table.

    A new target table gets an ``AssetMaterialization`` (asset key ``lake/<namespace>/<table>``);
    a branch rebuild, which leaves ``main`` as it is, an ``AssetObservation`` of the table. Both
    carry the validation report; a mismatch then fails the run (``Failure``). On a SQLite
    catalog the op runs in the catalog's single pool, like every committing step.
    """

    @op(
        name=keys.name("replay_and_validate"),
        pool=commit_pool(sqlite_catalog),
        out={},
        description="Replay a table's Kafka offset range into a new table or a replay_ branch, then validate it.",
        required_resource_keys=keys.required("pyspark", "kafka", "catalog"),
    )
    def _replay(context: OpExecutionContext, config: ReplayConfig):
        pyspark, kafka, catalog = keys.of(context, "pyspark", "kafka", "catalog")
        # a generator, so the target's event is recorded even when the run then fails on a mismatch
        settings = settings_for(kafka, catalog)
        try:
            spec = find_table(specs, config.table)
        except ConfigError as exc:
            raise Failure(str(exc)) from None
        request = _request(config)
        pycatalog = catalog.load()
        result = run_replay(
            pyspark.spark_session,
            settings,
            spec,
            request,
            kafka=kafka.metadata(),
            catalog=pycatalog,
            commit_id=context.run_id,
            is_alive=_liveness(context),
            declared=[s.identifier for s in specs],
            progress=context.log.info,
        )
        yield _target_event(result, settings.catalog.name, pycatalog)
        report = result.validation
        if report is not None and not report.valid:
            raise Failure(description=report.summary(), metadata={"validation": MetadataValue.json(report.to_dict())})
        context.log.info(report.summary() if report else f"replay {'complete' if result.complete else 'incomplete'}")

    @job(
        name=keys.name("replay"),
        description="Replay a declared table's Kafka offset range into a new table or a branch "
        "(replay_<name>), validated against the original. Configure in the Launchpad.",
    )
    def _job():
        _replay()

    return _job


__all__ = ["ReplayConfig", "replay_job", "replay_metadata"]
