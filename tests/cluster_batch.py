"""The write path as a Spark driver against a standalone cluster, run in its own process
(one SparkContext per process; the test session already holds a local[2] one).

Usage: ``python -m tests.cluster_batch SPEC_JSON COMMIT_ID`` with the lake's settings in the
environment (``SPARK_MASTER=spark://...``). Runs one micro-batch (recover, plan, read on the
executors, write, publish), then the duplicate-free check, full and of its rows, and prints one JSON line:
``{"master", "committed", "records", "check_passed", "check_scope", "executor_tasks": {executor id: tasks}}``.
"""

from __future__ import annotations

import json
import sys

from kafka_iceberg.batch.pipeline import run_micro_batch
from kafka_iceberg.catalog.spark import get_spark
from kafka_iceberg.catalog.tables import load_catalog, load_table, qualified
from kafka_iceberg.config.settings import load_settings
from kafka_iceberg.declaration.spec import parse_table_spec
from kafka_iceberg.kafka.admin import KafkaConfig, KafkaMetadata
from kafka_iceberg.ops.checks import duplicate_free


def executor_tasks(spark) -> dict[str, int]:
    """Completed tasks per executor id, from the driver's application status store (what the UI and
    its REST API show), ``driver`` excluded."""
    executors = spark.sparkContext._jsc.sc().statusStore().executorList(False)
    summaries = [executors.apply(i) for i in range(executors.size())]
    return {str(e.id()): int(e.completedTasks()) for e in summaries if str(e.id()) != "driver"}


def main(raw_spec: str, commit_id: str) -> None:
    settings = load_settings()
    spec = parse_table_spec(json.loads(raw_spec))
    spark = get_spark(settings)
    catalog = load_catalog(settings.catalog)
    kafka = KafkaMetadata(KafkaConfig.from_settings(settings))
    result = run_micro_batch(spark, settings, spec, commit_id=commit_id, kafka=kafka, catalog=catalog)
    table = load_table(catalog, spec.identifier)
    check = duplicate_free(spark, qualified(settings, spec), spec, table)  # the full scan: a Spark job
    since = duplicate_free(spark, qualified(settings, spec), spec, table, commit_id=commit_id)  # pyiceberg
    print(
        json.dumps(
            {
                "master": spark.sparkContext.master,
                "committed": result.committed,
                "records": result.records,
                "check_passed": check.passed and since.passed,
                "check_scope": since.figures["scope"],
                "executor_tasks": executor_tasks(spark),
            }
        )
    )
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
