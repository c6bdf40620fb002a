"""Upsert throughput: how fast one micro-batch of Debezium change events is applied to a table.

For ``make bench`` (``scripts/bench.py`` calls :func:`upsert_throughput` in the same run as the
append figures) or standalone::

    python -m devtools.bench.cdc --rows 200000

A table of ``rows`` rows is loaded by one micro-batch of snapshot events (op ``r``); then one
micro-batch changes 10% of the keys (op ``u``) and deletes 2% (op ``d`` plus Debezium's
tombstone), in JsonConverter's envelope without schemas. Each batch is timed from the raw
records (a DataFrame in the reader's raw schema, built by Spark, so Kafka is not measured)
through :func:`kafka_iceberg.cdc.changes.parse_changes`, ``reduce_changes`` and :func:`kafka_iceberg.cdc.upsert.merge_changes` on an
attempt branch, to the ``fast_forward`` that publishes it. It prints figures; it never asserts.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import uuid

from kafka_iceberg.cdc import changes as cdc
from kafka_iceberg.cdc import upsert

COLUMNS = [
    cdc.Column("id", "bigint", True),
    cdc.Column("name", "string"),
    cdc.Column("amount", "double"),
    cdc.Column("updated_at", "timestamp"),
]

_AFTER = "named_struct('id', id, 'name', concat('name-', id, '-', {v}), 'amount', id * 1.5 + {v}, 'updated_at', 1700000000000 + id)"


def _raw(spark, rows: int, kind: str):
    """Raw records (kafka_iceberg.kafka.records.RAW_SCHEMA_DDL columns) of ``kind`` ``load`` (op r for every key) or ``change``
    (10% updates, 2% deletes each followed by a tombstone); one partition per 4 keys' hash."""
    envelope = (
        "to_json(named_struct('before', {before}, 'after', {after}, 'op', '{op}', "
        "'source', named_struct('lsn', {lsn})))"
    )
    base = spark.range(rows).selectExpr("id", "pmod(hash(id), 100) AS h", "pmod(hash(id, 7), 4) AS p")
    if kind == "load":
        events = base.selectExpr(
            "id", "p", "0 AS seq", envelope.format(before="null", after=_AFTER.format(v=0), op="r", lsn="id") + " AS v"
        )
    else:
        upd = base.where("h < 10").selectExpr(
            "id",
            "p",
            "0 AS seq",
            envelope.format(before="null", after=_AFTER.format(v=1), op="u", lsn=f"{rows} + id") + " AS v",
        )
        dels = (
            base.where("h >= 10 AND h < 12")
            .selectExpr("id", "p", "explode(array(0, 1)) AS seq")
            .selectExpr(
                "id",
                "p",
                "seq",
                "CASE WHEN seq = 0 THEN "
                + envelope.format(before="named_struct('id', id)", after="null", op="d", lsn=f"{rows} + id")
                + " END AS v",
            )
        )
        events = upd.unionByName(dels)
    return events.selectExpr(
        "'bench' AS topic",
        "CAST(p AS INT) AS partition",
        "id * 2 + seq AS offset",
        "0L AS timestamp_ms",
        "CAST(to_json(named_struct('id', id)) AS BINARY) AS key",
        "CAST(v AS BINARY) AS value",
        "CAST(NULL AS ARRAY<STRUCT<key: STRING, value: BINARY>>) AS headers",
    )


def _apply(spark, table: str, raw) -> tuple[float, dict]:
    """Parse, reduce and merge ``raw`` into an attempt branch and publish it; (seconds, counts)."""
    started = time.perf_counter()
    parsed = cdc.parse_changes(raw, COLUMNS, ["id"], "debezium").cache()
    counts = cdc.change_counts(parsed)
    changes = cdc.reduce_changes(parsed, COLUMNS, ["id"], table)
    branch = f"bench_{uuid.uuid4().hex[:8]}"
    main = upsert.branch_head(spark, table, "main")
    spark.sql(f"ALTER TABLE {table} CREATE BRANCH `{branch}`" + (f" AS OF VERSION {main}" if main else ""))
    upsert.merge_changes(spark, table, branch, changes, ["id"], {"bench.batch": json.dumps(counts)})
    catalog, ident = table.split(".", 1)
    spark.sql(f"CALL {catalog}.system.fast_forward('{ident}', 'main', '{branch}')")
    seconds = time.perf_counter() - started
    spark.sql(f"ALTER TABLE {table} DROP BRANCH `{branch}`")
    parsed.unpersist()
    return seconds, counts


def upsert_throughput(spark, catalog: str, rows: int) -> dict:
    """Load a ``rows``-row upsert table, then apply one 10%-update/2%-delete micro-batch.

    Returns ``{"rows", "load_s", "load_changes_per_s", "change_s", "changes", "changes_per_s",
    "records_read", "delete_files"}`` (seconds; changes = upserts + deletes; records_read also
    counts the skipped tombstones)."""
    table = f"{catalog}.bench.upsert_{uuid.uuid4().hex[:8]}"
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {catalog}.bench")
    cols = ", ".join(f"{c.name} {c.type}{' NOT NULL' if c.required else ''}" for c in COLUMNS)
    spark.sql(f"CREATE TABLE {table} ({cols}) USING iceberg TBLPROPERTIES ('format-version'='2')")
    upsert.prepare_table(spark, table, ["id"])
    load_s, load = _apply(spark, table, _raw(spark, rows, "load"))
    change_s, counts = _apply(spark, table, _raw(spark, rows, "change"))
    changes = counts["upserts"] + counts["deletes"]
    delete_files = spark.sql(f"SELECT count(*) FROM {table}.delete_files").first()[0]
    return {
        "rows": rows,
        "load_s": round(load_s, 2),
        "load_changes_per_s": round(load["upserts"] / load_s),
        "change_s": round(change_s, 2),
        "changes": changes,
        "changes_per_s": round(changes / change_s),
        "records_read": counts["read"],
        "delete_files": int(delete_files),
    }


def main(argv: list[str] | None = None) -> None:
    """``python -m devtools.bench.cdc --rows N``: a private lake under /tmp, figures printed as JSON."""
    from kafka_iceberg.catalog.spark import get_spark
    from kafka_iceberg.config.settings import load_settings

    p = argparse.ArgumentParser(prog="devtools.bench.cdc")
    p.add_argument("--rows", type=int, default=200_000)
    args = p.parse_args(argv)
    home = tempfile.mkdtemp(prefix="bench-cdc-")
    settings = load_settings(
        env={"LAKE_HOME": home, "KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9", "SPARK_MASTER": "local[2]"}
    )
    spark = get_spark(settings)
    try:
        print(json.dumps(upsert_throughput(spark, settings.catalog.name, args.rows)))
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
