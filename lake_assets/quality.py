"""The ``quarantine`` asset check of each table: bad records, blocked schema changes, and the
dead-letter accounting (see :func:`kafka_iceberg.ops.checks.quarantine`). A change of its status
alerts Slack through the ``slack`` resource, like the table's other checks."""

from dagster import AssetCheckExecutionContext, AssetCheckResult, AssetCheckSeverity, asset_check

from kafka_iceberg.catalog.tables import load_table, metadata_view
from kafka_iceberg.declaration.spec import TableSpec
from kafka_iceberg.lake_assets.check_alerts import alert_check
from kafka_iceberg.lake_assets.tables import check_result
from kafka_iceberg.lake_assets.vocabulary import table_key
from kafka_iceberg.ops import checks
from kafka_iceberg.resources import LAKE_KEYS, ResourceKeys


def quarantine_check(spec: TableSpec, keys: ResourceKeys = LAKE_KEYS):
    """The non-blocking ``quarantine`` check of ``spec``'s table asset (severity WARN); ``keys``: the lake's resource keys."""

    @asset_check(
        asset=table_key(spec),
        name="quarantine",
        blocking=False,
        description=(
            f"Latest micro-batch: quarantine rate at most {spec.bad_records.max_quarantine_rate:.2%}, "
            f"no record blocked by the table schema, and read = added + quarantined, reconciled "
            f"with {spec.bad_records.dead_letter_identifier}."
        ),
        required_resource_keys=keys.required("pyspark", "catalog", "slack"),
    )
    def _quarantine(context: AssetCheckExecutionContext) -> AssetCheckResult:
        pyspark, catalog, slack = keys.of(context, "pyspark", "catalog", "slack")
        cat = catalog.load()
        table = load_table(cat, spec.identifier)
        if table is None:
            return AssetCheckResult(passed=False, description=f"table {spec.identifier} does not exist yet")
        dlq = load_table(cat, spec.bad_records.dead_letter_identifier)
        outcome = checks.quarantine(
            pyspark.spark_session, cat.name, spec, metadata_view(table), metadata_view(dlq) if dlq is not None else None
        )
        alert_check(context, slack, spec, "quarantine", outcome, "WARN")
        return check_result(outcome, AssetCheckSeverity.WARN)

    _quarantine.__name__ = f"{spec.name}_quarantine"
    return _quarantine


__all__ = ["quarantine_check"]
