"""Change data capture (``mode: upsert``): change events applied to Iceberg tables by key.

The fast tests feed hand-built change events (Debezium's JsonConverter shapes, with and
without schemas, and plain keyed upserts) through real Spark into real Iceberg tables. The
``cdc``-marked tests run real Debezium 3.6.3 capturing a real PostgreSQL 15 into the real
broker and check that the Iceberg table equals the PostgreSQL table (EXCEPT ALL both ways,
in DuckDB reading the Iceberg metadata directly).
"""

from __future__ import annotations

import json
import time

import pytest
from confluent_kafka import Consumer, TopicPartition

from devtools import duck
from kafka_iceberg.catalog.tables import load_table
from kafka_iceberg.cdc import changes as cdc
from kafka_iceberg.cdc import tombstones, upsert
from kafka_iceberg.cdc.changes import DELETE, POSITION, PROBLEM, Column
from kafka_iceberg.kafka.records import RAW_SCHEMA_DDL

COLUMNS = [
    Column("tailnum", "string", True),
    Column("year", "int"),
    Column("manufacturer", "string"),
    Column("seats", "int"),
    Column("speed", "double"),
]
KEY = ["tailnum"]
OFFSETS_KEY = "kafka.offsets"


# ---------------------------------------------------------------- helpers


def envelope(op: str, before: dict | None, after: dict | None, lsn: int | None, schemas: bool = False) -> bytes:
    """A Debezium change event as JsonConverter writes it (``schemas``: wrapped in schema/payload)."""
    payload = {
        "before": before,
        "after": after,
        "op": op,
        "ts_ms": 1,
        "source": {"connector": "postgresql", "schema": "public", "table": "planes", "lsn": lsn},
    }
    if schemas:
        payload = {"schema": {"type": "struct", "name": "lake_cdc.public.planes.Envelope"}, "payload": payload}
    return json.dumps(payload).encode()


def plane(tailnum: str, seats: int, year: int = 2000, speed: float | None = None, **extra) -> dict:
    return {"tailnum": tailnum, "year": year, "manufacturer": "BOEING", "seats": seats, "speed": speed, **extra}


def raw_df(spark, records):
    """records: (partition, offset, key bytes|None, value bytes|None) -> a raw micro-batch DataFrame."""
    rows = [("cdc", p, o, 1_700_000_000_000 + o, k, v, []) for p, o, k, v in records]
    return spark.createDataFrame(rows, RAW_SCHEMA_DDL)


def make_table(spark, settings, name: str) -> str:
    fqn = f"{settings.catalog.name}.cdc.{name}"
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {settings.catalog.name}.cdc")
    cols = ", ".join(f"`{c.name}` {c.type}{' NOT NULL' if c.required else ''}" for c in COLUMNS)
    spark.sql(f"CREATE TABLE {fqn} ({cols}) USING iceberg TBLPROPERTIES ('format-version'='2')")
    upsert.prepare_table(spark, fqn, KEY)
    return fqn


def apply_batch(spark, fqn: str, raw, cdc_mode: str = "debezium", name: str = "b") -> tuple[int, dict]:
    """One micro-batch as the write path does it: parse, reduce, merge into an attempt branch
    carrying the offsets, fast-forward main to it, drop the branch."""
    parsed = cdc.parse_changes(raw, COLUMNS, KEY, cdc_mode).cache()
    counts = cdc.change_counts(parsed)
    ends = {
        r["partition"]: r["end"]
        for r in parsed.groupBy("partition").agg({"offset": "max"}).withColumnRenamed("max(offset)", "end").collect()
    }
    changes = cdc.reduce_changes(parsed, COLUMNS, KEY, fqn).cache()
    main = upsert.branch_head(spark, fqn, "main")
    as_of = f" AS OF VERSION {main}" if main is not None else ""
    spark.sql(f"ALTER TABLE {fqn} CREATE BRANCH `{name}`{as_of}")
    summary = {OFFSETS_KEY: json.dumps({str(p): e + 1 for p, e in sorted(ends.items())})}
    sid = upsert.merge_changes(spark, fqn, name, changes, KEY, summary)  # reconciles the changes it applied
    changes.unpersist()
    ident = fqn.split(".", 1)[1]
    spark.sql(f"CALL {fqn.split('.')[0]}.system.fast_forward('{ident}', 'main', '{name}')")
    spark.sql(f"ALTER TABLE {fqn} DROP BRANCH `{name}`")
    parsed.unpersist()
    return sid, counts


def rows(spark, fqn: str) -> dict:
    return {r["tailnum"]: (r["year"], r["seats"], r["speed"]) for r in spark.table(fqn).collect()}


def snapshot_summary(spark, fqn: str, sid: int) -> dict:
    return spark.sql(f"SELECT summary FROM {fqn}.snapshots WHERE snapshot_id = {sid}").first()[0]


# ---------------------------------------------------------------- fast tests


@pytest.mark.parametrize("schemas", [False, True])
def test_debezium_changes_insert_update_delete_and_bad_envelopes(spark, settings, unique, schemas):
    fqn = make_table(spark, settings, f"planes_{unique}")
    k = lambda t: json.dumps({"tailnum": t}).encode()  # noqa: E731
    batch = [
        (0, 0, k("N1"), envelope("r", None, plane("N1", 100), 10, schemas)),
        (0, 1, k("N2"), envelope("c", None, plane("N2", 50), 20, schemas)),
        (0, 2, k("N1"), envelope("u", None, plane("N1", 101), 30, schemas)),
        (0, 3, k("N2"), envelope("d", {"tailnum": "N2", "year": None}, None, 40, schemas)),
        (0, 4, k("N2"), None),  # Debezium's tombstone after the delete
        (0, 5, k("N3"), envelope("c", None, plane("N3", 7, speed=1.5), 50, schemas)),
        (0, 6, k("N4"), envelope("x", None, plane("N4", 1), 60, schemas)),
        (0, 7, None, envelope("c", None, {"year": 1999}, 70, schemas)),
        (0, 8, k("N5"), envelope("u", None, plane("N5", "many"), 80, schemas)),
        (0, 9, k("N6"), b"not json at all"),
        (0, 10, k("N7"), envelope("c", None, plane("N7", 3, wingspan=30), 90, schemas)),
        (0, 11, k("N8"), envelope("c", None, {**plane("N8", 3), "year": None, "tailnum": None}, 95, schemas)),
    ]
    raw = raw_df(spark, batch)
    problems = {
        r["offset"]: r[PROBLEM]["kind"]
        for r in cdc.parse_changes(raw, COLUMNS, KEY, "debezium").collect()
        if r[PROBLEM] is not None
    }
    assert problems == {
        6: "unknown_op",
        7: "missing_key",
        8: "schema",
        9: "malformed",
        10: "unknown_field",
        11: "missing_key",
    }
    sid, counts = apply_batch(spark, fqn, raw)
    assert counts == {"read": 12, "upserts": 4, "deletes": 1, "skipped": 1, "bad": 6}
    assert rows(spark, fqn) == {"N1": (2000, 101, None), "N3": (2000, 7, 1.5)}
    assert json.loads(snapshot_summary(spark, fqn, sid)[OFFSETS_KEY]) == {"0": 12}


def test_schema_problem_names_the_misfit_column(spark, settings, unique):
    raw = raw_df(spark, [(0, 0, b'{"tailnum":"N5"}', envelope("u", None, plane("N5", "many"), 1))])
    reason = cdc.parse_changes(raw, COLUMNS, KEY, "debezium").first()[PROBLEM]["reason"]
    assert "seats is many, not int" in reason


def test_many_changes_per_key_within_and_across_batches_and_delete_then_reinsert(spark, settings, unique):
    fqn = make_table(spark, settings, f"planes_{unique}")
    k = lambda t: json.dumps({"tailnum": t}).encode()  # noqa: E731
    first = [(0, i, k("N1"), envelope("c" if i == 0 else "u", None, plane("N1", i), 100 + i)) for i in range(20)]
    first += [
        (1, 0, k("N2"), envelope("c", None, plane("N2", 1), 90)),
        (1, 1, k("N2"), envelope("d", {"tailnum": "N2"}, None, 130)),
        (1, 2, k("N2"), None),
        (1, 3, k("N2"), envelope("c", None, plane("N2", 2), 140)),
    ]  # delete then re-insert
    apply_batch(spark, fqn, raw_df(spark, first), name="b1")
    assert rows(spark, fqn) == {"N1": (2000, 19, None), "N2": (2000, 2, None)}
    second = [(0, 20 + i, k("N1"), envelope("u", None, plane("N1", 1000 + i), 200 + i)) for i in range(5)]
    second += [(1, 4, k("N2"), envelope("d", {"tailnum": "N2"}, None, 300)), (1, 5, k("N2"), None)]
    sid, counts = apply_batch(spark, fqn, raw_df(spark, second), name="b2")
    assert counts["skipped"] == 1 and counts["deletes"] == 1
    assert rows(spark, fqn) == {"N1": (2000, 1004, None)}
    # updates and deletes wrote position deletes, never equality deletes
    contents = {r[0] for r in spark.sql(f"SELECT content FROM {fqn}.delete_files").collect()}
    assert contents == {1}
    summary = snapshot_summary(spark, fqn, sid)
    assert "added-position-delete-files" in summary and "added-equality-delete-files" not in summary
    assert json.loads(summary[OFFSETS_KEY]) == {"0": 25, "1": 6}
    # pyiceberg (which cannot read equality deletes) and DuckDB read the same table
    table = load_table(cdc_catalog(settings), fqn.split(".", 1)[1])
    assert table.scan().to_arrow().to_pylist() == [
        {
            "tailnum": "N1",
            "year": 2000,
            "manufacturer": "BOEING",
            "seats": 1004,
            "speed": None,
            POSITION: {"lsn": 204, "partition": 0, "offset": 24},
        }
    ]
    assert duck.count_rows(table.metadata_location) == 1
    assert table.current_snapshot().summary.additional_properties[OFFSETS_KEY] == summary[OFFSETS_KEY]


def cdc_catalog(settings):
    from kafka_iceberg.catalog.tables import load_catalog

    return load_catalog(settings.catalog)


def test_source_position_orders_a_key_across_partitions(spark, settings, unique):
    fqn = make_table(spark, settings, f"planes_{unique}")
    key = b'{"tailnum":"N1"}'
    # the newest change (lsn 300) sits at a lower partition and offset than an older one (lsn 200)
    batch = [
        (0, 0, key, envelope("c", None, plane("N1", 1), 100)),
        (0, 1, key, envelope("u", None, plane("N1", 3), 300)),
        (1, 5, key, envelope("u", None, plane("N1", 2), 200)),
    ]
    apply_batch(spark, fqn, raw_df(spark, batch))
    assert rows(spark, fqn) == {"N1": (2000, 3, None)}


def positions(spark, fqn: str) -> dict:
    return {r["tailnum"]: r[POSITION] and r[POSITION]["lsn"] for r in spark.table(fqn).collect()}


def test_changes_reordered_across_partitions_and_batches_apply_by_source_position(spark, settings, unique):
    """One key's changes split over two partitions and two micro-batches, older changes re-sent
    after newer ones, and an older delete re-sent after a newer insert: the table ends in the
    state of the newest change per key (by source.lsn), whatever order the batches bring them in."""
    fqn = make_table(spark, settings, f"planes_{unique}")
    k = lambda t: json.dumps({"tailnum": t}).encode()  # noqa: E731
    first = [
        (0, 0, k("N1"), envelope("c", None, plane("N1", 1), 100)),
        (0, 1, k("N1"), envelope("u", None, plane("N1", 3), 300)),
        (0, 2, k("N3"), envelope("c", None, plane("N3", 30), 120)),
        (0, 3, k("N4"), envelope("c", None, plane("N4", 40), 130)),
        (0, 4, k("N4"), envelope("u", None, plane("N4", 41), 700)),
        (1, 0, k("N2"), envelope("c", None, plane("N2", 20), 110)),
        (1, 1, k("N2"), envelope("u", None, plane("N2", 21), 400)),
    ]
    apply_batch(spark, fqn, raw_df(spark, first), name="b1")
    assert rows(spark, fqn) == {
        "N1": (2000, 3, None),
        "N2": (2000, 21, None),
        "N3": (2000, 30, None),
        "N4": (2000, 41, None),
    }
    second = [
        (1, 2, k("N1"), envelope("u", None, plane("N1", 2), 200)),  # older, from the other partition, later
        (0, 5, k("N2"), envelope("u", None, plane("N2", 99), 350)),  # older than N2's row (lsn 400)
        (0, 6, k("N3"), envelope("d", {"tailnum": "N3"}, None, 500)),  # newer: deletes
        (0, 7, k("N3"), None),
        (0, 8, k("N4"), envelope("d", {"tailnum": "N4"}, None, 140)),  # an older delete re-sent: N4 stays
        (0, 9, k("N1"), envelope("c", None, plane("N1", 1), 100)),  # re-sent after its newer version
        (1, 3, k("N5"), envelope("c", None, plane("N5", 50), 800)),
    ]
    sid, counts = apply_batch(spark, fqn, raw_df(spark, second), name="b2")
    assert counts == {"read": 7, "upserts": 4, "deletes": 2, "skipped": 1, "bad": 0}
    expected = {"N1": (2000, 3, None), "N2": (2000, 21, None), "N4": (2000, 41, None), "N5": (2000, 50, None)}
    assert rows(spark, fqn) == expected
    assert positions(spark, fqn) == {"N1": 300, "N2": 400, "N4": 700, "N5": 800}
    summary = snapshot_summary(spark, fqn, sid)
    assert summary["added-records"] == "1" and json.loads(summary[OFFSETS_KEY]) == {"0": 10, "1": 4}
    # Debezium restarted and re-sent everything, in its order: nothing changes, and the merge adds no row
    resent = [(p, 10 + i, key, value) for i, (p, _, key, value) in enumerate(first + second)]
    sid, _ = apply_batch(spark, fqn, raw_df(spark, resent), name="b3")
    assert rows(spark, fqn) == expected and snapshot_summary(spark, fqn, sid).get("added-records", "0") == "0"
    # a newer change from either partition still applies, a delete included
    third = [
        (1, 40, k("N1"), envelope("u", None, plane("N1", 9), 900)),
        (0, 40, k("N5"), envelope("d", {"tailnum": "N5"}, None, 901)),
    ]
    apply_batch(spark, fqn, raw_df(spark, third), name="b4")
    assert rows(spark, fqn) == {"N1": (2000, 9, None), "N2": (2000, 21, None), "N4": (2000, 41, None)}


def test_a_table_without_the_position_column_gets_it_and_keeps_working(spark, settings, unique):
    fqn = make_table(spark, settings, f"planes_{unique}")
    spark.sql(f"ALTER TABLE {fqn} DROP COLUMN {POSITION}")  # as an upsert table made before positions were kept
    spark.sql(f"INSERT INTO {fqn} VALUES ('N1', 1990, 'BOEING', 1, NULL), ('N2', 1990, 'BOEING', 2, NULL)")
    k = lambda t: json.dumps({"tailnum": t}).encode()  # noqa: E731
    batch = [
        (0, 0, k("N1"), envelope("u", None, plane("N1", 10), 5)),
        (0, 1, k("N3"), envelope("c", None, plane("N3", 30), 6)),
    ]
    apply_batch(spark, fqn, raw_df(spark, batch))
    field = next(f for f in spark.table(fqn).schema.fields if f.name == POSITION)
    assert field.nullable and field.dataType.simpleString() == "struct<lsn:bigint,partition:int,offset:bigint>"
    assert rows(spark, fqn) == {"N1": (2000, 10, None), "N2": (1990, 2, None), "N3": (2000, 30, None)}
    assert positions(spark, fqn) == {"N1": 5, "N2": None, "N3": 6}
    apply_batch(spark, fqn, raw_df(spark, [(0, 2, k("N1"), envelope("u", None, plane("N1", 4), 4))]), name="b2")
    assert rows(spark, fqn)["N1"] == (2000, 10, None)  # older than the row now


def test_plain_upserts_keyed_by_kafka_key_with_tombstone_deletes(spark, settings, unique):
    fqn = make_table(spark, settings, f"planes_{unique}")
    value = lambda seats: json.dumps({"year": 1990, "manufacturer": "AIRBUS", "seats": seats, "speed": 2.5}).encode()  # noqa: E731
    batch = [
        (0, 0, b"N1", value(1)),
        (0, 1, b'{"tailnum":"N2"}', value(2)),
        (0, 2, b"N1", value(3)),
        (0, 3, b"N2", None),
        (0, 4, b"N3", value(4)),
        (0, 5, b"N3", None),
        (0, 6, b"N3", value(5)),
        (0, 7, None, value(6)),
    ]
    raw = raw_df(spark, batch)
    sid, counts = apply_batch(spark, fqn, raw, cdc_mode="none")
    assert counts == {"read": 8, "upserts": 5, "deletes": 2, "skipped": 0, "bad": 1}
    assert rows(spark, fqn) == {"N1": (1990, 3, 2.5), "N3": (1990, 5, 2.5)}
    # without a source position, a key's changes in two partitions cannot be ordered: a clear error
    crossed = raw_df(spark, [(0, 8, b"N1", value(7)), (1, 0, b"N1", value(8))])
    with pytest.raises(cdc.CrossPartitionKeyError, match="tailnum='N1'.*span several Kafka partitions"):
        apply_batch(spark, fqn, crossed, cdc_mode="none", name="b2")
    assert rows(spark, fqn) == {"N1": (1990, 3, 2.5), "N3": (1990, 5, 2.5)}
    # nor across batches: N1's row came from partition 0, this change from partition 1
    moved = raw_df(spark, [(1, 0, b"N1", value(8)), (0, 8, b"N3", value(9))])
    with pytest.raises(
        cdc.CrossPartitionKeyError,
        match=r"tailnum='N1' \(change at partition 1 offset 0, row at partition 0 offset 2\)",
    ):
        apply_batch(spark, fqn, moved, cdc_mode="none", name="b3")
    assert rows(spark, fqn) == {"N1": (1990, 3, 2.5), "N3": (1990, 5, 2.5)}
    # within one partition the offset orders: a re-read older offset is not applied
    apply_batch(spark, fqn, raw_df(spark, [(0, 1, b"N1", value(42))]), cdc_mode="none", name="b4")
    assert rows(spark, fqn)["N1"] == (1990, 3, 2.5)
    # the documented way out: once the old partition's changes are applied, clear the row's position
    spark.sql(f"UPDATE {fqn} SET {POSITION} = NULL WHERE tailnum = 'N1'")
    apply_batch(spark, fqn, moved, cdc_mode="none", name="b5")
    assert rows(spark, fqn) == {"N1": (1990, 8, 2.5), "N3": (1990, 9, 2.5)}


def test_batch_of_only_tombstones_still_records_offsets(spark, settings, unique):
    fqn = make_table(spark, settings, f"planes_{unique}")
    apply_batch(
        spark, fqn, raw_df(spark, [(0, 0, b'{"tailnum":"N1"}', envelope("c", None, plane("N1", 1), 1))]), name="b1"
    )
    sid, counts = apply_batch(spark, fqn, raw_df(spark, [(0, 1, b'{"tailnum":"N9"}', None)]), name="b2")
    assert counts == {"read": 1, "upserts": 0, "deletes": 0, "skipped": 1, "bad": 0}
    assert json.loads(snapshot_summary(spark, fqn, sid)[OFFSETS_KEY]) == {"0": 2}
    assert upsert.branch_head(spark, fqn, "main") == sid
    assert rows(spark, fqn) == {"N1": (2000, 1, None)}


def test_merge_into_branch_leaves_main_alone_and_a_rerun_converges(spark, settings, unique):
    fqn = make_table(spark, settings, f"planes_{unique}")
    apply_batch(
        spark, fqn, raw_df(spark, [(0, 0, b'{"tailnum":"N1"}', envelope("c", None, plane("N1", 1), 1))]), name="b1"
    )
    main = upsert.branch_head(spark, fqn, "main")
    spark.sql(f"ALTER TABLE {fqn} CREATE BRANCH `b2` AS OF VERSION {main}")
    raw = raw_df(spark, [(0, 1, b'{"tailnum":"N1"}', envelope("u", None, plane("N1", 2), 2))])
    changes = cdc.reduce_changes(cdc.parse_changes(raw, COLUMNS, KEY, "debezium"), COLUMNS, KEY)
    assert set(changes.columns) == {c.name for c in COLUMNS} | {POSITION, DELETE}
    sid = upsert.merge_changes(spark, fqn, "b2", changes, KEY, {OFFSETS_KEY: '{"0":2}'})
    assert upsert.branch_head(spark, fqn, "main") == main and sid != main
    assert rows(spark, fqn) == {"N1": (2000, 1, None)}
    assert spark.sql(f"SELECT seats FROM {fqn}.branch_b2").first()[0] == 2
    # the change is on the branch already: a second merge applies nothing, so it must add 0 rows
    with pytest.raises(upsert.LakeError, match="does not reconcile: snapshot .* added 0 rows but 2 keys"):
        upsert.merge_changes(spark, fqn, "b2", changes, KEY, {OFFSETS_KEY: '{"0":2}'}, expected_rows=2)
    # a retried merge (its first outcome unknown) on the same branch gives the same rows
    again = upsert.merge_changes(spark, fqn, "b2", changes, KEY, {OFFSETS_KEY: '{"0":2}'})
    assert again != sid and json.loads(snapshot_summary(spark, fqn, again)[OFFSETS_KEY]) == {"0": 2}
    assert [tuple(r) for r in spark.sql(f"SELECT tailnum, seats FROM {fqn}.branch_b2").collect()] == [("N1", 2)]
    # a crash before the fast-forward: the branch is dropped unpublished, the rerun converges
    spark.sql(f"ALTER TABLE {fqn} DROP BRANCH `b2`")
    assert upsert.branch_head(spark, fqn, "main") == main and rows(spark, fqn) == {"N1": (2000, 1, None)}
    apply_batch(spark, fqn, raw, name="b3")
    assert rows(spark, fqn) == {"N1": (2000, 2, None)}


def tombstones_of(spark, fqn: str) -> dict:
    name = tombstones.tombstone_table(fqn)
    return {r["tailnum"]: r[POSITION]["lsn"] for r in spark.table(name).collect()}


def test_a_deleted_key_stays_deleted_when_an_older_change_comes_later(spark, settings, unique):
    """A delete keeps its key's position as a tombstone: an older upsert read in a later micro-batch (re-sent
    through another partition, or re-read by a replay) does not bring the key back; a newer one does. A
    tombstone recorded by an attempt that crashed before its publish does not stop the rerun's delete."""
    fqn = make_table(spark, settings, f"planes_{unique}")
    k = lambda t: json.dumps({"tailnum": t}).encode()  # noqa: E731
    first = [
        (0, 0, k("N1"), envelope("c", None, plane("N1", 1), 100)),
        (0, 1, k("N2"), envelope("c", None, plane("N2", 2), 110)),
        (0, 2, k("N3"), envelope("c", None, plane("N3", 3), 120)),
    ]
    apply_batch(spark, fqn, raw_df(spark, first), name="b1")
    assert not tombstones.exists(spark, fqn)  # made at the first delete only
    second = [
        (0, 3, k("N1"), envelope("d", {"tailnum": "N1"}, None, 500)),
        (0, 4, k("N1"), None),
        (0, 5, k("N2"), envelope("d", {"tailnum": "N2"}, None, 510)),
    ]
    apply_batch(spark, fqn, raw_df(spark, second), name="b2")
    assert set(rows(spark, fqn)) == {"N3"} and tombstones_of(spark, fqn) == {"N1": 500, "N2": 510}
    third = [
        (1, 0, k("N1"), envelope("u", None, plane("N1", 9), 300)),  # older than the delete, another partition
        (0, 6, k("N2"), envelope("c", None, plane("N2", 20), 600)),  # newer: N2 comes back
        (0, 7, k("N2"), envelope("d", {"tailnum": "N2"}, None, 400)),  # an older delete re-sent: no effect
    ]
    sid, _ = apply_batch(spark, fqn, raw_df(spark, third), name="b3")
    assert rows(spark, fqn) == {"N2": (2000, 20, None), "N3": (2000, 3, None)}
    assert snapshot_summary(spark, fqn, sid)["added-records"] == "1"
    assert tombstones_of(spark, fqn) == {"N1": 500, "N2": 510}  # positions only grow
    # an attempt records N3's delete, then crashes before its publish: the rerun still deletes N3
    fourth = raw_df(spark, [(0, 8, k("N3"), envelope("d", {"tailnum": "N3"}, None, 700))])
    main = upsert.branch_head(spark, fqn, "main")
    spark.sql(f"ALTER TABLE {fqn} CREATE BRANCH `b4` AS OF VERSION {main}")
    changes = cdc.reduce_changes(cdc.parse_changes(fourth, COLUMNS, KEY, "debezium"), COLUMNS, KEY)
    upsert.merge_changes(spark, fqn, "b4", changes, KEY, {OFFSETS_KEY: '{"0":9}'})
    spark.sql(f"ALTER TABLE {fqn} DROP BRANCH `b4`")
    assert set(rows(spark, fqn)) == {"N2", "N3"} and tombstones_of(spark, fqn)["N3"] == 700
    apply_batch(spark, fqn, fourth, name="b5")
    assert set(rows(spark, fqn)) == {"N2"}
    # pruning keeps tombstones younger than the retention and drops the older ones
    assert tombstones.prune(spark, fqn) == 3
    assert tombstones.prune(spark, fqn, older_than_s=0) == 0


def test_prepare_table_refuses_a_nullable_key(spark, settings, unique):
    fqn = f"{settings.catalog.name}.cdc.nokey_{unique}"
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {settings.catalog.name}.cdc")
    spark.sql(f"CREATE TABLE {fqn} (tailnum string, seats int) USING iceberg")
    with pytest.raises(upsert.ConfigError, match="must exist and be NOT NULL"):
        upsert.prepare_table(spark, fqn, ["tailnum"])


# ---------------------------------------------------------------- real Debezium + real PostgreSQL

PLANE_COLUMNS = [
    Column("tailnum", "string", True),
    Column("year", "int"),
    Column("manufacturer", "string"),
    Column("model", "string"),
    Column("engines", "int"),
    Column("seats", "int"),
    Column("speed", "double"),
    Column("updated_at", "timestamp", True),
    Column("registered", "date"),
]


@pytest.fixture(scope="module")
def source_db():
    from devtools.services import cdc_source

    db = cdc_source.start_database()
    yield db
    db.stop()


def read_topic(bootstrap: str, topic: str, start: dict[int, int] | None = None) -> list[tuple]:
    """Every record of ``topic`` from ``start`` (partition -> offset) to the high watermarks,
    as (partition, offset, key, value)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "cdc-test-reader", "enable.auto.commit": False})
    try:
        parts = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in parts}
        begin = {p: (start or {}).get(p, 0) for p in parts}
        consumer.assign([TopicPartition(topic, p, begin[p]) for p in parts if ends[p] > begin[p]])
        out, want = [], sum(ends[p] - begin[p] for p in parts)
        deadline = time.monotonic() + 30
        while len(out) < want and time.monotonic() < deadline:
            m = consumer.poll(1.0)
            if m is not None and not m.error() and m.offset() < ends[m.partition()]:
                out.append((m.partition(), m.offset(), m.key(), m.value()))
        assert len(out) == want, f"read {len(out)} of {want} records of {topic}"
        return out
    finally:
        consumer.close()


def wait_for_key(bootstrap: str, topic: str, key: str, timeout_s: float = 120) -> list[tuple]:
    """Wait until the create event of ``key`` is in ``topic`` (Debezium sends changes in commit
    order, so every earlier change is there too); returns all records."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        records = read_topic(bootstrap, topic)
        if any(k and json.loads(k).get("payload", json.loads(k)).get("tailnum") == key for _, _, k, _ in records):
            # the rest of Debezium's batch goes to the other partition and may land later (seconds on a
            # loaded machine, the fresh-clone run of 2026-11-26): wait until the topic stays unchanged for 3 s
            quiet_until = time.monotonic() + 3.0
            while time.monotonic() < quiet_until and time.monotonic() < deadline + 60:
                time.sleep(0.5)
                if len(now := read_topic(bootstrap, topic)) != len(records):
                    records, quiet_until = now, time.monotonic() + 3.0
            return records
        time.sleep(0.5)
    raise AssertionError(f"Debezium did not deliver {key} to {topic} within {timeout_s} s")


def compare_with_postgres(settings, db, fqn: str) -> tuple[int, int, int]:
    """(rows in PostgreSQL, rows only in Iceberg, rows only in PostgreSQL), EXCEPT ALL both ways in DuckDB."""
    import pandas as pd

    from devtools.services import cdc_source

    names = [c.name for c in PLANE_COLUMNS]
    pg = pd.DataFrame(cdc_source.table_rows(db, "planes", names), columns=names, dtype=object)
    con = duck.connect()
    con.register("pg_text", pg)
    duck_type = {"string": "VARCHAR", "int": "INTEGER", "double": "DOUBLE", "timestamp": "TIMESTAMP", "date": "DATE"}
    typed = ", ".join(f"CAST({c.name} AS {duck_type[c.type]}) AS {c.name}" for c in PLANE_COLUMNS)
    con.execute(f"CREATE TABLE pg AS SELECT {typed} FROM pg_text")
    # the timestamp as an instant: PostgreSQL's wall clock is UTC to Debezium; Iceberg's is timestamptz
    con.execute("CREATE OR REPLACE TABLE pg AS SELECT * REPLACE (epoch_ms(updated_at) AS updated_at) FROM pg")
    table = load_table(cdc_catalog(settings), fqn.split(".", 1)[1])
    ice = (
        f"(SELECT * REPLACE (epoch_ms(updated_at) AS updated_at) FROM "
        f"(SELECT {', '.join(names)} FROM {duck.scan_sql(table.metadata_location)}))"
    )
    only_ice = con.execute(f"SELECT count(*) FROM ({ice} EXCEPT ALL SELECT * FROM pg)").fetchone()[0]
    only_pg = con.execute(f"SELECT count(*) FROM (SELECT * FROM pg EXCEPT ALL {ice})").fetchone()[0]
    return len(pg), only_ice, only_pg


def drain(writer, run: str) -> list:
    """Run micro-batches through the real write path until nothing is left to read."""
    results, n = [], 0
    while True:
        plan = writer.plan()
        if plan.offsets.is_empty:
            return results
        n += 1
        result = writer.execute(plan, f"{run}-{n}")
        assert result.committed
        results.append(result)


@pytest.mark.cdc
@pytest.mark.parametrize("schemas", [False, True])
def test_debezium_capturing_postgres_equals_iceberg(
    spark, settings, broker, kafka_config, tmp_path, source_db, unique, writer_factory, schemas
):
    from devtools.demo.data import create_topic
    from devtools.services import cdc_source

    db, topic, slot = source_db, f"cdc.{unique}", f"slot_{unique}"
    cdc_source.run_sql(db, "DROP TABLE IF EXISTS planes")
    keys = cdc_source.load_planes(db, 300)  # captured by Debezium's initial snapshot (op r)
    create_topic(kafka_config, topic, 2)
    spec = _planes_spec(unique, topic)  # several micro-batches: a key's changes span them
    writer = writer_factory(spec)
    fqn = f"{settings.catalog.name}.{spec.identifier}"
    capture = cdc_source.start_capture(
        db, broker, topic, ["public.planes"], tmp_path / "dbz", slot=slot, schemas=schemas
    )
    try:
        cdc_source.planes_workload(db, keys, rounds=2, seed=1)
        cdc_source.run_sql(db, "INSERT INTO planes (tailnum, seats) VALUES ('END1', 1)")
        wait_for_key(broker, topic, "END1")
        results = drain(writer, "cdc")
        assert len(results) > 1 and sum(r.quarantined for r in results) == 0
        assert compare_with_postgres(settings, db, fqn)[1:] == (0, 0)
        # Debezium killed mid-workload and restarted: it re-sends from its last flushed offset
        cdc_source.planes_workload(db, keys, rounds=1, seed=2)
        capture.stop(kill=True)
        cdc_source.planes_workload(db, keys, rounds=1, seed=3)
        capture = cdc_source.start_capture(
            db, broker, topic, ["public.planes"], tmp_path / "dbz", slot=slot, schemas=schemas
        )
        cdc_source.run_sql(db, "INSERT INTO planes (tailnum, seats) VALUES ('END2', 2)")
        wait_for_key(broker, topic, "END2")
        assert compare_with_postgres(settings, db, fqn)[1:] != (0, 0)  # the comparison sees unapplied changes
        drain(writer, "cdc2")
    finally:
        capture.stop()
        cdc_source.run_sql(db, f"SELECT pg_drop_replication_slot('{slot}')")
    total, only_iceberg, only_postgres = compare_with_postgres(settings, db, fqn)
    assert total > 250 and (only_iceberg, only_postgres) == (0, 0)
    table = load_table(cdc_catalog(settings), spec.identifier)
    assert table.scan().to_arrow().num_rows == total  # pyiceberg reads it: no equality deletes
    assert {r[0] for r in spark.sql(f"SELECT content FROM {fqn}.delete_files").collect()} == {1}


def _planes_spec(unique: str, topic: str):
    from tests.helpers import make_spec

    schema = [{"name": c.name, "type": c.type, "required": c.required} for c in PLANE_COLUMNS]
    return make_spec(
        f"planes_{unique}",
        topic,
        schema=schema,
        partition_by=[],
        mode="upsert",
        key=KEY,
        cdc="debezium",
        max_records_per_partition=150,
    )


def _send(kafka_config, topic: str, records: list[tuple[int, bytes, bytes | None]]) -> None:
    """Produce (partition, key, value) in list order; a None value is a tombstone."""
    from confluent_kafka import Producer

    producer = Producer(kafka_config.client_conf(**{"enable.idempotence": True}))
    for partition, key, value in records:
        producer.produce(topic, key=key, value=value, partition=partition)
    assert producer.flush(30) == 0


@pytest.mark.cdc
def test_real_debezium_changes_reordered_across_partitions_and_batches_equal_postgres(
    spark, settings, broker, kafka_config, tmp_path, source_db, unique, writer_factory
):
    """Real Debezium changes of a PostgreSQL workload, produced again out of order: for each live key with
    several changes the newest goes first (its own partition, micro-batch 1) and the older ones follow
    through the other partition (micro-batch 2); then each such key's first change is sent once more.
    Every other key's changes keep their order. Last, the older upserts of every deleted key are sent again
    through the other partition (the key's tombstone keeps it deleted, docs/cdc.md). The table equals
    PostgreSQL (EXCEPT ALL both ways)."""
    from devtools.demo.data import create_topic
    from devtools.services import cdc_source

    db, source, topic, slot = source_db, f"cdcsrc.{unique}", f"cdc.{unique}", f"slot_{unique}"
    cdc_source.run_sql(db, "DROP TABLE IF EXISTS planes")
    keys = cdc_source.load_planes(db, 200)
    create_topic(kafka_config, source, 2)
    create_topic(kafka_config, topic, 2)
    capture = cdc_source.start_capture(db, broker, source, ["public.planes"], tmp_path / "dbz", slot=slot)
    try:
        cdc_source.planes_workload(db, keys, rounds=3, seed=4)
        cdc_source.run_sql(db, "INSERT INTO planes (tailnum, seats) VALUES ('END1', 1)")
        records = wait_for_key(broker, source, "END1")
    finally:
        capture.stop()
        cdc_source.run_sql(db, f"SELECT pg_drop_replication_slot('{slot}')")
    by_key: dict[bytes, list[tuple[int, bytes | None]]] = {}
    for partition, _offset, key, value in sorted(records, key=lambda r: (r[0], r[1])):
        by_key.setdefault(key, []).append((partition, value))
    live = {
        k for k, changes in by_key.items() if changes[-1][1] is not None and json.loads(changes[-1][1])["op"] != "d"
    }
    moved = {k for k in live if len(by_key[k]) >= 2}
    assert len(moved) >= 10, "the workload updates enough keys to reorder"
    first, later = [], []
    for key, changes in by_key.items():
        if key in moved:
            *older, (partition, newest) = changes
            first.append((partition, key, newest))
            later += [(1 - p, key, v) for p, v in older]
        else:
            first += [(p, key, v) for p, v in changes]
    writer = writer_factory(_planes_spec(unique, topic))
    fqn = f"{settings.catalog.name}.{writer.spec.identifier}"

    def upsert_of(value):
        return value is not None and json.loads(value)["op"] != "d"

    deleted = [(1 - p, k, v) for k in set(by_key) - live for p, v in by_key[k] if upsert_of(v)]
    assert len({k for _, k, _ in deleted}) >= 5, "the workload deletes enough keys"
    resent = [(p, k, by_key[k][0][1]) for k in moved for p in (0, 1)]
    for n, batch in enumerate([first, later, resent, deleted]):
        _send(kafka_config, topic, batch)
        results = drain(writer, f"reorder{n}")
        assert results and sum(r.quarantined for r in results) == 0
    total, only_iceberg, only_postgres = compare_with_postgres(settings, db, fqn)
    assert total > 150 and (only_iceberg, only_postgres) == (0, 0)


def test_upsert_declaration_is_validated():
    assert cdc.upsert_spec("table t", "append", None, None, COLUMNS) is None
    assert cdc.upsert_spec("table t", "upsert", ["tailnum"], "debezium", COLUMNS) == cdc.UpsertSpec(
        ("tailnum",), "debezium"
    )
    for mode, key, kind, match in [
        ("merge", None, None, "not append or upsert"),
        ("append", ["tailnum"], None, "need mode: upsert"),
        ("upsert", ["tailnum"], "maxwell", "needs cdc"),
        ("upsert", [], "none", "needs 'key'"),
        ("upsert", ["seats"], "none", r"not: \['seats'\]"),
    ]:
        with pytest.raises(upsert.ConfigError, match=match):
            cdc.upsert_spec("table t", mode, key, kind, COLUMNS)


def test_temporal_columns_from_debezium_connect_precision(spark):
    columns = [Column("tailnum", "string", True), Column("seen", "timestamp"), Column("built", "date")]
    rows_in = [
        {"tailnum": "N1", "seen": 1_700_000_000_123, "built": 19_000},  # ms / days since epoch
        {"tailnum": "N2", "seen": "2023-11-14T22:13:20.123Z", "built": "2022-01-08"},  # ISO text
        {"tailnum": "N3", "seen": "yesterday", "built": 1},
    ]
    raw = raw_df(spark, [(0, i, None, envelope("c", None, r, i)) for i, r in enumerate(rows_in)])
    out = cdc.parse_changes(raw, columns, KEY, "debezium").select("_r.*", PROBLEM).orderBy("tailnum").collect()
    assert [(r["seen"].timestamp(), str(r["built"])) for r in out[:2]] == [(1_700_000_000.123, "2022-01-08")] * 2
    assert out[2][PROBLEM]["kind"] == "schema" and "seen is yesterday, not timestamp" in out[2][PROBLEM]["reason"]
