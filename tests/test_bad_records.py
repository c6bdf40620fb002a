"""Bad records, the dead-letter table, schema evolution and catalog retries, on real components."""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import threading
import time
import uuid

import pytest
from confluent_kafka import Producer

from devtools.demo.data import produce
from kafka_iceberg.batch.pipeline import run_micro_batch
from kafka_iceberg.catalog.tables import load_table, metadata_view
from kafka_iceberg.errors import CatalogUnavailableError
from kafka_iceberg.ops.checks import duplicate_free, quarantine
from kafka_iceberg.state import KEY_QUARANTINED, KEY_READ, KEY_RECORDS, KEY_SCHEMA_CHANGES, dead_letter_ref, int_map
from tests.helpers import (
    BASE_TS_MS,
    current_table,
    current_view,
    event,
    event_records,
    make_spec,
    spec_dict,
    table_rows,
)


def run(spark, settings, spec, kafka, catalog, **kw):
    return run_micro_batch(
        spark, settings, spec, commit_id=kw.pop("commit_id", str(uuid.uuid4())), kafka=kafka, catalog=catalog, **kw
    )


def produce_one(kafka_config, topic: str, key: bytes | None, value: bytes | None, headers=None) -> None:
    producer = Producer(kafka_config.client_conf())
    producer.produce(topic, key=key, value=value, headers=headers, timestamp=BASE_TS_MS)
    assert producer.flush(30) == 0


def dead_letters(spark, settings, spec) -> list:
    return spark.table(f"{settings.catalog.name}.{spec.bad_records.dead_letter_identifier}").orderBy("offset").collect()


BAD = [
    # (value, expected error_kind, expected words in the error)
    (b'{"id": 5, "name": "x", "event_time": ', "malformed", "not a JSON object"),
    (b"[1, 2, 3]", "malformed", "not a JSON object"),
    (json.dumps({"id": "abc", "event_time": "2023-11-14T00:00:00Z"}).encode(), "schema", "id is abc, not bigint"),
    (json.dumps({"id": 1e30, "event_time": "2023-11-14T00:00:00Z"}).encode(), "schema", "not bigint"),  # out of range
    (json.dumps({"name": "no id", "event_time": "2023-11-14T00:00:00Z"}).encode(), "schema", "required field id"),
    (json.dumps({**event(7), "color": "red"}).encode(), "unknown_field", "fields not in the table schema: color"),
    (json.dumps({**event(8), "name": "x" * 3000}).encode(), "oversize", "over the bound of 2000 bytes"),
    (None, "tombstone", "tombstone"),
]


def test_bad_records_are_quarantined_in_the_same_micro_batch(
    spark, settings, kafka, kafka_config, catalog, unique, topic_factory
):
    topic = topic_factory(unique, partitions=1)
    produce(kafka_config, topic, event_records(range(0, 20)))  # offsets 0..19
    for i, (value, _, _) in enumerate(BAD):  # offsets 20..27, the first with headers
        produce_one(kafka_config, topic, f"bad-{i}".encode(), value, headers=[("trace", b"t-1")] if i == 0 else None)
    produce(kafka_config, topic, event_records(range(20, 40)))  # offsets 28..47
    spec = make_spec(unique, topic, bad_records={"max_record_bytes": 2000, "max_quarantine_rate": 0.5})

    result = run(spark, settings, spec, kafka, catalog, commit_id=f"run-{unique}")
    assert (result.records_read, result.records, result.quarantined) == (48, 40, 8)
    assert result.quarantine_kinds == {"malformed": 2, "schema": 3, "unknown_field": 1, "oversize": 1, "tombstone": 1}
    assert sorted(r["id"] for r in table_rows(spark, settings, spec)) == list(range(40))

    rows = dead_letters(spark, settings, spec)
    assert [r["offset"] for r in rows] == list(range(20, 28))
    for row, (value, kind, words) in zip(rows, BAD):
        assert (row["topic"], row["partition"], row["error_kind"]) == (topic, 0, kind)
        assert words in row["error"], row["error"]
        assert (bytes(row["value"]) if row["value"] is not None else None) == value
        assert row["run_id"] == f"run-{unique}"
    assert bytes(rows[0]["key"]) == b"bad-0"
    assert [(h["key"], bytes(h["value"])) for h in rows[0]["headers"]] == [("trace", b"t-1")]

    # the accounting, in main's snapshot: read = added + quarantined, and it points at the
    # published dead-letter snapshot
    view = current_view(catalog, spec)
    snap = view.snapshots[view.main]
    assert int_map(snap, KEY_READ) == {0: 48} and int_map(snap, KEY_QUARANTINED) == {0: 8}
    assert snap.summary[KEY_RECORDS] == "40"
    dview = metadata_view(load_table(catalog, spec.bad_records.dead_letter_identifier))
    assert dead_letter_ref(snap)["snapshot-id"] == dview.main
    assert not [r for r in dview.refs if r != "main"], "the attempt's dead-letter branch was dropped"

    outcome = quarantine(spark, settings.catalog.name, spec, view, dview)
    assert not outcome.passed, "schema-blocked records fail the check (an alert fires)"
    assert "3 records blocked by the table schema" in outcome.summary
    assert outcome.figures["dead_letter_rows_in_batch"] == 8 and outcome.figures["duplicate_dead_letters"] == 0

    # a rerun reads nothing again: no second copy anywhere
    again = run(spark, settings, spec, kafka, catalog)
    assert not again.committed
    assert len(dead_letters(spark, settings, spec)) == 8
    assert duplicate_free(
        spark, f"{settings.catalog.name}.{spec.identifier}", spec, current_table(catalog, spec)
    ).passed

    # a clean batch afterwards passes the check
    produce(kafka_config, topic, event_records(range(40, 60)))
    run(spark, settings, spec, kafka, catalog)
    view = current_view(catalog, spec)
    dview = metadata_view(load_table(catalog, spec.bad_records.dead_letter_identifier))
    ok = quarantine(spark, settings.catalog.name, spec, view, dview)
    assert ok.passed, ok.summary
    assert ok.figures["read"] == 20 and ok.figures["quarantined"] == 0


def test_quarantine_rate_above_the_threshold_fails_the_check(
    spark, settings, kafka, kafka_config, catalog, unique, topic_factory
):
    topic = topic_factory(unique, partitions=2)
    produce(kafka_config, topic, event_records(range(50)))
    produce(kafka_config, topic, [(f"m{i}".encode(), b"not json", BASE_TS_MS) for i in range(5)])
    spec = make_spec(unique, topic, bad_records={"max_quarantine_rate": 0.05})
    result = run(spark, settings, spec, kafka, catalog)
    assert result.quarantined == 5 and result.records == 50
    assert sum(result.quarantined_by_partition.values()) == 5
    view = current_view(catalog, spec)
    dview = metadata_view(load_table(catalog, spec.bad_records.dead_letter_identifier))
    outcome = quarantine(spark, settings.catalog.name, spec, view, dview)
    assert not outcome.passed
    assert "quarantine rate 9.09% is above 5.00% (5 of 55 records)" in outcome.summary
    assert outcome.figures["dead_letter_rows_in_batch"] == 5


def test_crash_between_the_two_publishes_rolls_the_dead_letter_table_forward(
    spark, settings, kafka, kafka_config, catalog, unique, topic_factory
):
    from tests.test_write_path import _run_in_subprocess

    topic = topic_factory(unique, partitions=1)
    produce(kafka_config, topic, event_records(range(30)))
    produce(kafka_config, topic, [(b"m", b"{broken", BASE_TS_MS)])
    raw = spec_dict(unique, topic, bad_records={"max_quarantine_rate": 0.5})
    spec = make_spec(unique, topic, bad_records={"max_quarantine_rate": 0.5})
    proc = _run_in_subprocess(settings, raw, "after_publish", commit_id=f"crashed-{unique}")
    proc.wait(timeout=300)
    assert proc.returncode == -9, proc.stderr.read().decode()[-2000:]
    view = current_view(catalog, spec)
    ref = dead_letter_ref(view.snapshots[view.main])
    dview = metadata_view(load_table(catalog, spec.bad_records.dead_letter_identifier))
    assert ref is not None and dview.main != ref["snapshot-id"], "main is published, the dead-letter table is not yet"
    assert not quarantine(spark, settings.catalog.name, spec, view, dview).passed

    result = run(spark, settings, spec, kafka, catalog, is_alive=lambda attempt: False)  # the crashed run is gone
    assert result.recovery.rolled_forward == [ref["snapshot-id"]]
    assert not result.committed, "nothing new to read"
    rows = dead_letters(spark, settings, spec)
    assert [(r["offset"], r["error_kind"]) for r in rows] == [(30, "malformed")]
    assert len(table_rows(spark, settings, spec)) == 30
    dview = metadata_view(load_table(catalog, spec.bad_records.dead_letter_identifier))
    assert list(dview.refs) == ["main"]
    assert quarantine(spark, settings.catalog.name, spec, current_view(catalog, spec), dview).passed


def test_new_fields_evolve_the_schema_and_type_changes_are_blocked(
    spark, settings, kafka, kafka_config, catalog, unique, topic_factory
):
    topic = topic_factory(unique, partitions=1)
    produce(kafka_config, topic, event_records(range(10)))
    spec = make_spec(unique, topic, unknown_fields="evolve", bad_records={"max_quarantine_rate": 1})
    run(spark, settings, spec, kafka, catalog)
    extra = [
        {**event(10), "color": "red", "score": 3, "ratio": 0.5, "vip": True},
        {**event(11), "color": "blue", "score": 4, "ratio": 1, "vip": False},
        {**event(12), "meta": {"nested": 1}},  # cannot become a column automatically
    ]
    produce(kafka_config, topic, [(str(e["id"]).encode(), json.dumps(e).encode(), BASE_TS_MS) for e in extra])
    result = run(spark, settings, spec, kafka, catalog)
    assert {(c["column"], c["type"]) for c in result.schema_changes} == {
        ("color", "string"),
        ("score", "bigint"),
        ("ratio", "double"),
        ("vip", "boolean"),
    }
    fields = {
        f.name: (f.dataType.simpleString(), f.nullable)
        for f in spark.table(f"{settings.catalog.name}.{spec.identifier}").schema.fields
    }
    assert fields["score"] == ("bigint", True) and fields["ratio"] == ("double", True)
    assert "meta" not in fields
    rows = {r["id"]: r for r in table_rows(spark, settings, spec)}
    assert sorted(rows) == list(range(12))
    assert (rows[10]["color"], rows[10]["score"], rows[10]["ratio"], rows[10]["vip"]) == ("red", 3, 0.5, True)
    assert rows[11]["ratio"] == 1.0 and rows[0]["color"] is None
    assert result.quarantine_kinds == {"unknown_field": 1}
    view = current_view(catalog, spec)
    assert json.loads(view.snapshots[view.main].summary[KEY_SCHEMA_CHANGES])

    # a producer changes a type: blocked, quarantined with the reason, the schema unchanged
    changed = {**event(13), "score": "high"}
    produce(kafka_config, topic, [(b"13", json.dumps(changed).encode(), BASE_TS_MS)])
    result = run(spark, settings, spec, kafka, catalog)
    assert result.quarantined == 1 and result.schema_changes == []
    row = dead_letters(spark, settings, spec)[-1]
    assert row["error_kind"] == "schema" and "score is high, not bigint" in row["error"]
    assert spark.table(f"{settings.catalog.name}.{spec.identifier}").schema["score"].dataType.simpleString() == "bigint"
    dview = metadata_view(load_table(catalog, spec.bad_records.dead_letter_identifier))
    outcome = quarantine(spark, settings.catalog.name, spec, current_view(catalog, spec), dview)
    assert not outcome.passed and "blocked by the table schema" in outcome.summary


def test_unknown_fields_ignore_keeps_the_record(spark, settings, kafka, kafka_config, catalog, unique, topic_factory):
    topic = topic_factory(unique, partitions=1)
    produce(kafka_config, topic, [(b"1", json.dumps({**event(1), "color": "red"}).encode(), BASE_TS_MS)])
    spec = make_spec(unique, topic, unknown_fields="ignore")
    result = run(spark, settings, spec, kafka, catalog)
    assert (result.records, result.quarantined) == (1, 0)
    assert "color" not in spark.table(f"{settings.catalog.name}.{spec.identifier}").columns


def _hold_catalog_lock(path: str, seconds: float, locked: threading.Event) -> None:
    conn = sqlite3.connect(path, timeout=60, isolation_level=None)
    conn.execute("BEGIN EXCLUSIVE")
    locked.set()
    time.sleep(seconds)
    conn.execute("COMMIT")
    conn.close()


@pytest.mark.parametrize("hold_s, budget_s, succeeds", [(12, 60, True), (20, 4, False)])
def test_a_locked_sqlite_catalog_is_retried_with_backoff_then_fails_clearly(
    spark, settings, kafka, kafka_config, catalog, unique, topic_factory, hold_s, budget_s, succeeds
):
    topic = topic_factory(unique, partitions=2)
    produce(kafka_config, topic, event_records(range(40)))
    spec = make_spec(unique, topic)
    run(spark, settings, spec, kafka, catalog)  # the table exists; now lock the catalog mid-life
    produce(kafka_config, topic, event_records(range(40, 80)))
    patient = dataclasses.replace(settings, catalog_retry_s=budget_s)
    locked = threading.Event()
    holder = threading.Thread(
        target=_hold_catalog_lock,
        args=(settings.catalog.sqlalchemy_uri[len("sqlite:///") :], hold_s, locked),
        daemon=True,
    )
    holder.start()
    assert locked.wait(10)
    t0 = time.monotonic()
    if succeeds:
        result = run(spark, patient, spec, kafka, catalog)
        assert result.committed and result.records == 40
        assert time.monotonic() - t0 >= hold_s - 1, "it waited for the lock instead of failing"
    else:
        with pytest.raises(CatalogUnavailableError, match="stayed unavailable"):
            run(spark, patient, spec, kafka, catalog)
        holder.join(60)
        result = run(spark, settings, spec, kafka, catalog)  # the next run catches up
        assert result.records == 40
    holder.join(60)
    assert sorted(r["id"] for r in table_rows(spark, settings, spec)) == list(range(80))
    view = current_view(catalog, spec)
    assert [r for r in view.refs if r != "main"] == []


def test_a_retry_inside_a_retry_does_not_wait_a_second_budget():
    from kafka_iceberg.catalog.tables import with_catalog_retry

    calls = []

    def locked():
        calls.append(time.monotonic())
        raise RuntimeError("[SQLITE_BUSY] The database file is locked (database is locked)")

    t0 = time.monotonic()
    with pytest.raises(CatalogUnavailableError, match="inner: the Iceberg catalog stayed unavailable for 2 s"):
        with_catalog_retry("outer", lambda: with_catalog_retry("inner", locked, 2.0), 2.0)
    assert time.monotonic() - t0 < 3.0, "the outer retry gave up with the inner one"
    assert len(calls) == 3  # 0 s, +0.5 s, +1.0 s: the next wait would pass the inner budget
