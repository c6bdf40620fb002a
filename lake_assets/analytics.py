"""A downstream Spark asset over the ingested tables: hourly departure delay by origin, with weather.

It shows lineage from the Kafka topics through the Iceberg tables to a derived table,
and it is rebuilt in full from the tables' current snapshots on every materialization.
"""

from dagster import AssetExecutionContext, AssetKey, MaterializeResult, MetadataValue, asset
from dagster_pyspark import PySparkResource

from kafka_iceberg.lake_assets.vocabulary import commit_pool
from kafka_iceberg.resources import IcebergCatalogResource

FLIGHTS = AssetKey(["lake", "nyc", "flights"])
WEATHER = AssetKey(["lake", "nyc", "weather"])
TARGET = "analytics.hourly_departure_delay"
SOURCE_TABLES = frozenset({"nyc.flights", "nyc.weather"})
"""Identifiers of the declared tables this asset reads; without both, the code location omits it."""


def hourly_delay_sql(catalog: str) -> str:
    """Spark SQL for the derived table: one row per (origin, hour) with flights, mean and p90
    departure delay (minutes), cancellations, and the weather observed at that origin and hour."""
    return f"""
    WITH f AS (
      SELECT origin, time_hour, count(*) AS flights,
             sum(CASE WHEN dep_time IS NULL THEN 1 ELSE 0 END) AS cancelled,
             avg(dep_delay) AS mean_dep_delay_min,
             percentile_approx(dep_delay, 0.9) AS p90_dep_delay_min
      FROM {catalog}.nyc.flights GROUP BY origin, time_hour
    ), w AS (
      SELECT origin, time_hour, max(temp) AS temp_f, max(wind_speed) AS wind_speed_mph,
             max(precip) AS precip_in, min(visib) AS visibility_mi
      FROM {catalog}.nyc.weather GROUP BY origin, time_hour
    )
    SELECT f.origin, f.time_hour, f.flights, f.cancelled, f.mean_dep_delay_min, f.p90_dep_delay_min,
           w.temp_f, w.wind_speed_mph, w.precip_in, w.visibility_mi
    FROM f LEFT JOIN w ON f.origin = w.origin AND f.time_hour = w.time_hour
    """


def hourly_departure_delay(
    context: AssetExecutionContext, pyspark: PySparkResource, catalog: IcebergCatalogResource
) -> MaterializeResult:
    """Rebuild ``analytics.hourly_departure_delay`` with ``CREATE OR REPLACE`` (an atomic Iceberg commit)."""
    spark = pyspark.spark_session
    name = catalog.name
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {name}.analytics")
    df = spark.sql(hourly_delay_sql(name))
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
        }
    )


def hourly_departure_delay_asset(sqlite_catalog: bool = True):
    """The downstream asset ``lake/analytics/hourly_departure_delay``; ``sqlite_catalog`` puts it in
    the tables' shared pool (it commits too, and SQLite admits one committing process at a time)."""
    return asset(
        key=AssetKey(["lake", "analytics", "hourly_departure_delay"]),
        deps=[FLIGHTS, WEATHER],
        group_name="analytics",
        kinds={"iceberg", "spark"},
        pool=commit_pool(sqlite_catalog),
        description="Hourly departure delay by origin airport joined with that hour's weather (Spark SQL over the "
        "Iceberg tables).",
    )(hourly_departure_delay)
