"""A downstream Spark asset over the ingested tables: hourly departure delay by origin, with weather.

It shows lineage from the Kafka topics through the Iceberg tables to a derived table. It reads its
tables through the ``lake_reader`` resource (:class:`kafka_iceberg.resources.LakeTableReader`) at
the snapshots their latest materializations recorded, is rebuilt in full from them, records them
(``lake/source_snapshots``), and refreshes itself (:data:`REFRESH`) when a table commits.
"""

from dagster import (
    AssetExecutionContext,
    AssetKey,
    AssetSelection,
    AutomationCondition,
    AutomationConditionSensorDefinition,
    AutomationContext,
    AutomationResult,
    DefaultSensorStatus,
    MaterializeResult,
    MetadataValue,
    asset,
)

from kafka_iceberg.lake_assets.vocabulary import commit_pool
from kafka_iceberg.resources import LakeSparkResource, LakeTableReader, source_snapshots

FLIGHTS = AssetKey(["lake", "nyc", "flights"])
WEATHER = AssetKey(["lake", "nyc", "weather"])
KEY = AssetKey(["lake", "analytics", "hourly_departure_delay"])
TARGET = "analytics.hourly_departure_delay"
SOURCE_TABLES = frozenset({"nyc.flights", "nyc.weather"})
"""Identifiers of the declared tables this asset reads; without both, the code location omits it."""


class TablesCommitted(AutomationCondition):
    """True on the evaluation after a dependency got a materialization, once every dependency has one: of
    any micro-batch slot, or none (a worker run's commits are logged without a slot, and Dagster's own
    ``any_deps_updated`` and ``missing`` see only a partitioned asset's slots). Its cursor: the newest
    materialization's storage id among the dependencies when last evaluated."""

    @property
    def name(self) -> str:
        return "tables_committed"

    def evaluate(self, context: AutomationContext) -> AutomationResult:
        """The downstream asset's candidates when a dependency's newest materialization is newer than the cursor."""
        instance = context.asset_graph_view.instance
        deps = sorted(context.asset_graph.get(context.key).parent_keys)
        records = instance.get_asset_records(deps)
        ids = [r.asset_entry.last_materialization_record for r in records]
        if len(records) < len(deps) or any(i is None for i in ids):
            return AutomationResult(context, context.get_empty_subset(), cursor=context.cursor)
        newest = max(i.storage_id for i in ids)
        fresh = context.cursor is None or newest > int(context.cursor)
        return AutomationResult(
            context, context.candidate_subset if fresh else context.get_empty_subset(), cursor=str(newest)
        )


REFRESH = (
    TablesCommitted().since_last_handled()
    & ~AutomationCondition.any_deps_in_progress()
    & ~AutomationCondition.in_progress()
).with_label("eager over the tables' commits")
"""When the asset refreshes: once every table committed and any commits again (a worker run's commit, a
micro-batch slot's), when no table run is in progress. ``AutomationCondition.eager()`` would wait forever:
it holds back while *any* partition of a dependency is missing, and a table's micro-batch slots are never all
materialized; it and ``any_deps_updated`` do not see the worker runs' commits, logged without a slot."""


def refresh_sensor(keys: list[AssetKey]) -> AutomationConditionSensorDefinition:
    """The sensor that evaluates :data:`REFRESH` of ``keys``, RUNNING by default (Dagster's own
    default automation sensor starts stopped), every 30 s in the code location's server (the sensor daemon
    asks it: :class:`TablesCommitted` is a custom condition)."""
    return AutomationConditionSensorDefinition(
        "lake_downstream_automation",
        target=AssetSelection.assets(*keys),
        default_status=DefaultSensorStatus.RUNNING,
        minimum_interval_seconds=30,
        use_user_code_server=True,  # TablesCommitted is a condition of this code location
        description="Refreshes the downstream assets when their tables commit (their AutomationCondition).",
    )


def hourly_delay_sql(flights: str, weather: str) -> str:
    """Spark SQL for the derived table over the views ``flights`` and ``weather``: one row per
    (origin, hour) with flights, mean and p90 departure delay (minutes), cancellations, and the
    weather observed at that origin and hour."""
    return f"""
    WITH f AS (
      SELECT origin, time_hour, count(*) AS flights,
             sum(CASE WHEN dep_time IS NULL THEN 1 ELSE 0 END) AS cancelled,
             avg(dep_delay) AS mean_dep_delay_min,
             percentile_approx(dep_delay, 0.9) AS p90_dep_delay_min
      FROM {flights} GROUP BY origin, time_hour
    ), w AS (
      SELECT origin, time_hour, max(temp) AS temp_f, max(wind_speed) AS wind_speed_mph,
             max(precip) AS precip_in, min(visib) AS visibility_mi
      FROM {weather} GROUP BY origin, time_hour
    )
    SELECT f.origin, f.time_hour, f.flights, f.cancelled, f.mean_dep_delay_min, f.p90_dep_delay_min,
           w.temp_f, w.wind_speed_mph, w.precip_in, w.visibility_mi
    FROM f LEFT JOIN w ON f.origin = w.origin AND f.time_hour = w.time_hour
    """


def hourly_departure_delay(
    context: AssetExecutionContext, lake_pyspark: LakeSparkResource, lake_reader: LakeTableReader
) -> MaterializeResult:
    """Rebuild ``analytics.hourly_departure_delay`` with ``CREATE OR REPLACE`` (an atomic Iceberg commit)
    from the snapshots of ``nyc.flights`` and ``nyc.weather`` their materializations recorded."""
    spark = lake_pyspark.spark_session
    name = lake_reader.catalog.name
    flights, weather = lake_reader.snapshot(context, FLIGHTS), lake_reader.snapshot(context, WEATHER)
    flights.to_spark(spark).createOrReplaceTempView("hdd_flights")
    weather.to_spark(spark).createOrReplaceTempView("hdd_weather")
    context.log.info(f"reading nyc.flights at {flights.snapshot_id}, nyc.weather at {weather.snapshot_id}")
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {name}.analytics")
    df = spark.sql(hourly_delay_sql("hdd_flights", "hdd_weather"))
    df.writeTo(f"{name}.{TARGET}").using("iceberg").tableProperty("format-version", "2").createOrReplace()
    stats = spark.sql(
        f"SELECT count(*) AS n, round(corr(precip_in, mean_dep_delay_min), 3) AS r_precip, "
        f"round(corr(visibility_mi, mean_dep_delay_min), 3) AS r_visib, "
        f"sum(CASE WHEN temp_f IS NULL THEN 1 ELSE 0 END) AS hours_without_weather FROM {name}.{TARGET}"
    ).collect()[0]
    context.log.info(f"{TARGET}: {stats['n']} rows")
    return MaterializeResult(
        metadata={
            "dagster/row_count": MetadataValue.int(stats["n"]),
            "hours_without_weather": MetadataValue.int(stats["hours_without_weather"] or 0),
            "corr_precip_vs_delay": MetadataValue.float(float(stats["r_precip"] or 0.0)),
            "corr_visibility_vs_delay": MetadataValue.float(float(stats["r_visib"] or 0.0)),
            "iceberg_table": MetadataValue.text(TARGET),
            **source_snapshots(flights, weather),
        }
    )


def hourly_departure_delay_asset(sqlite_catalog: bool = True):
    """The downstream asset ``lake/analytics/hourly_departure_delay``; ``sqlite_catalog`` puts it in
    the tables' shared pool (it commits too, and SQLite admits one committing process at a time)."""
    return asset(
        key=KEY,
        deps=[FLIGHTS, WEATHER],
        group_name="analytics",
        kinds={"iceberg", "spark"},
        pool=commit_pool(sqlite_catalog),
        automation_condition=REFRESH,
        description="Hourly departure delay by origin airport joined with that hour's weather (Spark SQL over the "
        "Iceberg tables at the snapshots their materializations recorded).",
    )(hourly_departure_delay)
