"""A consistency group's micro-batch through the real write path (kafka_iceberg/batch/group_batch.py):
Debezium-shaped change events with transaction metadata on the dev broker, two upsert tables, real
Spark and the JDBC catalog. A batch ends at the last transaction whose events were all read, and both
tables are published in one catalog transaction."""

from __future__ import annotations

import json

from devtools.demo.data import create_topic, produce_topics
from kafka_iceberg.batch.group_batch import run_group_batch
from kafka_iceberg.batch.pipeline import connect
from kafka_iceberg.catalog.group_view import read_group
from kafka_iceberg.catalog.tables import metadata_view
from kafka_iceberg.declaration.spec import parse_declarations
from kafka_iceberg.state import group_state

COLUMNS = [{"name": "id", "type": "long", "required": True}, {"name": "qty", "type": "long"}]


def _change(row: dict, txid: str, lsn: int, op: str = "c") -> tuple[bytes, bytes, int]:
    value = {"op": op, "before": None, "after": row, "source": {"lsn": lsn}, "transaction": {"id": txid}}
    return json.dumps({"id": row["id"]}).encode(), json.dumps(value).encode(), 0


def _end(txid: str, schema: str, **counts: int) -> tuple[bytes, bytes, int]:
    collections = [{"data_collection": f"{schema}.{t}", "event_count": n} for t, n in counts.items()]
    return b"", json.dumps({"status": "END", "id": txid, "data_collections": collections}).encode(), 0


def test_a_group_batch_ends_at_a_transaction_boundary_and_publishes_both_tables(
    spark, settings, kafka, kafka_config, catalog, unique
):
    specs, topics = _specs(kafka_config, unique)
    produce_topics(
        kafka_config,
        {
            topics["orders"]: [_change({"id": 1, "qty": 10}, "t1", 1), _change({"id": 2, "qty": 5}, "t2", 4)],
            topics["lines"]: [_change({"id": 1, "qty": 4}, "t1", 2), _change({"id": 2, "qty": 6}, "t1", 3)],
            f"{unique}.transaction": [_end("t1", "public", orders=1, lines=2), _end("t2", "public", orders=1, lines=1)],
        },
    )  # t2's line is not in its topic yet
    lake = connect(spark, settings, kafka, catalog)
    first = run_group_batch(lake, specs, "group-1")
    assert (first.seq, first.cut.transactions, first.cut.waiting_for) == (1, ("t1",), "t2")
    assert _rows(spark, settings, specs) == {"orders": {1: 10}, "lines": {1: 4, 2: 6}}

    produce_topics(kafka_config, {topics["lines"]: [_change({"id": 3, "qty": 5}, "t2", 5)]})
    second = run_group_batch(lake, specs, "group-2")
    assert (second.seq, second.cut.transactions) == (2, ("t2",))
    assert _rows(spark, settings, specs) == {"orders": {1: 10, 2: 5}, "lines": {1: 4, 2: 6, 3: 5}}
    assert run_group_batch(lake, specs, "group-3").seq is None  # nothing new: no commit

    read = read_group(catalog, [s.identifier for s in specs])
    for spec in specs:
        view = metadata_view(catalog.load_table(spec.identifier))
        assert read[spec.identifier][1] == view.main == second.snapshots[spec.identifier]
        record = group_state(view.snapshots, view.main)
        assert record["seq"] == 2 and record["position"]["offsets"] == {"0": 2}
        assert record["tables"] == {
            s.identifier: {"topic": s.topic, "offsets": {"0": 2 if "orders" in s.topic else 3}} for s in specs
        }


def _specs(kafka_config, unique: str) -> tuple[list, dict[str, str]]:
    """The specs of group ``shop`` (tables ``orders`` and ``lines``) and their topics, created with the
    transaction topic (one partition each)."""
    topics = {t: f"{unique}.public.{t}" for t in ("orders", "lines")}
    for topic in [*topics.values(), f"{unique}.transaction"]:
        create_topic(kafka_config, topic, 1, {"retention.ms": "-1"})
    entries = [
        {"name": f"{unique}_{t}", "identifier": f"test.{unique}_{t}", "topic": topic, "schema": COLUMNS,
         "mode": "upsert", "key": ["id"], "cdc": "debezium", "consistency_group": "shop", "partition_by": []}
        for t, topic in topics.items()
    ]  # fmt: skip
    return parse_declarations({"tables": entries}, "tables.yaml"), topics


def _rows(spark, settings, specs) -> dict:
    out = {}
    for spec in specs:
        rows = spark.table(f"{settings.catalog.name}.{spec.identifier}").collect()
        out[spec.identifier.rsplit("_", 1)[1]] = {r["id"]: r["qty"] for r in rows}
    return out
