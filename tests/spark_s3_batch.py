"""Spark on a warehouse in S3, in its own process (one SparkContext per process).

Usage: ``python -m tests.spark_s3_batch`` with the catalog in ``LAKE_CATALOG_PROPERTIES`` and
``PYICEBERG_CATALOG__LAKE__*`` and the jars in ``spark.jars`` of ``LAKE_SPARK_CONF``. Creates ``lake.db.events``, appends
1,000 rows with a snapshot property, uploads ``ORPHAN_KEY`` (written by no snapshot) with boto3, then runs
Iceberg's orphan-file action as recovery runs it (:func:`kafka_iceberg.batch.recovery.delete_orphan_files`, which
lists an object-storage table by prefix). Prints one JSON line: ``{"spark_count", "metadata_location",
"recovery_error", "recovery_deleted"}``.
"""

from __future__ import annotations

import json
import os
import sys
import time

import boto3
from pyspark.sql import SparkSession

from kafka_iceberg.batch.recovery import delete_orphan_files
from kafka_iceberg.catalog.spark import iceberg_runtime_jar
from kafka_iceberg.config.settings import load_settings


def main() -> None:
    settings = load_settings()
    cfg = settings.catalog.config
    cfg.load()  # creates the JDBC catalog tables (pyiceberg), as prepare_spark_environment does
    builder = (
        SparkSession.builder.master("local[1]")
        .appName("s3-test")
        .config(
            "spark.jars",
            ",".join([iceberg_runtime_jar(), settings.catalog.jdbc_driver_jar, *settings.spark_extra_jars]),
        )
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.extensions", "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions")
    )
    for key, value in cfg.spark_properties().items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    spark.sql("CREATE NAMESPACE IF NOT EXISTS lake.db")
    spark.sql("CREATE TABLE lake.db.events (id BIGINT, name STRING) USING iceberg")
    rows = spark.range(1000).selectExpr("id", "concat('n', id) AS name")
    rows.writeTo("lake.db.events").option("snapshot-property.kafka.commit-id", "spark-s3").append()
    count = spark.table("lake.db.events").count()

    props = cfg.pyiceberg_properties()
    bucket = cfg.warehouse[len("s3://") :].split("/", 1)[0]
    s3 = boto3.client(
        "s3",
        endpoint_url=props["s3.endpoint"],
        aws_access_key_id=props["s3.access-key-id"],
        aws_secret_access_key=props["s3.secret-access-key"],
        region_name=props["s3.region"],
    )
    orphan_key = "warehouse/db/events/data/orphan-from-a-killed-attempt.parquet"
    s3.put_object(Bucket=bucket, Key=orphan_key, Body=b"not referenced by any snapshot")
    cutoff = int(time.time() * 1000) + 60_000
    try:
        deleted = delete_orphan_files(spark, "lake.db.events", cutoff)  # as recovery runs it
        recovery_error = None
    except Exception as exc:  # noqa: BLE001 - reported to the test
        lines = str(exc).strip().splitlines()
        deleted, recovery_error = (
            [],
            next((ln.strip() for ln in lines if "Exception:" in ln), lines[0] if lines else repr(exc))[:300],
        )
    jvm = spark._jvm
    table = jvm.org.apache.iceberg.spark.Spark3Util.loadIcebergTable(spark._jsparkSession, "lake.db.events")
    print(
        json.dumps(
            {
                "spark_count": count,
                "metadata_location": str(table.operations().current().metadataFileLocation()),
                "recovery_error": recovery_error,
                "recovery_deleted": deleted,
            }
        )
    )
    spark.stop()


if __name__ == "__main__":
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    sys.exit(main())
