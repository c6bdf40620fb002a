"""Maintenance jobs (rewrite_data_files, expire_snapshots, remove_orphan_files) on a real table:
they shrink what they should and the ingest state and exactly-once guarantees survive them."""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import pytest

from devtools.demo.data import produce
from kafka_iceberg.batch.pipeline import run_micro_batch
from kafka_iceberg.catalog.tables import metadata_view
from kafka_iceberg.errors import LakeError
from kafka_iceberg.ops.checks import duplicate_free
from kafka_iceberg.ops.rota import run_job
from kafka_iceberg.schedules.spread import maintenance_crons
from kafka_iceberg.state import state_at
from tests.helpers import (
    current_table,
    current_view,
    data_files_on_disk,
    event_records,
    live_delete_files,
    make_spec,
    table_rows,
)


def _ingest_in_batches(spark, settings, spec, kafka, catalog):
    while True:
        r = run_micro_batch(spark, settings, spec, commit_id=str(uuid.uuid4()), kafka=kafka, catalog=catalog)
        if r.total_lag == 0:
            return


def _run_job(spark, settings, catalog, spec, kind):
    """Run the maintenance job ``kind`` (:func:`~kafka_iceberg.ops.rota.run_job`, keeping no snapshot for a
    pending check); returns its observation's metadata (``MaintenanceResult.as_metadata``)."""
    view = lambda: metadata_view(catalog.load_table(spec.identifier))  # noqa: E731
    return run_job(spark, settings.catalog.name, spec, kind, view).as_metadata()


def test_maintenance_keeps_offsets_and_exactly_once(
    spark, settings, kafka, kafka_config, catalog, unique, topic_factory
):
    topic = topic_factory(unique, partitions=2)
    produce(kafka_config, topic, event_records(range(600)))
    spec = make_spec(
        unique,
        topic,
        max_records_per_partition=60,
        partition_by=[],
        maintenance={"retain_last": 1, "max_snapshot_age": "0s", "orphan_older_than": "3d"},
    )
    _ingest_in_batches(spark, settings, spec, kafka, catalog)

    compacted = _run_job(spark, settings, catalog, spec, "compact")
    assert compacted["data_files_before"] >= 5 and compacted["data_files_after"] < compacted["data_files_before"]
    assert compacted["bytes_after"] < compacted["bytes_before"]

    # expiring right after compaction must keep the ingest snapshot below the replace snapshot
    kept = _run_job(spark, settings, catalog, spec, "expire_snapshots")
    assert kept["procedure_output"]["retain_last"] > 1
    view = current_view(catalog, spec)
    assert state_at(view.snapshots, view.main).offsets == {p: w.high for p, w in kafka.watermarks(topic).items()}

    # after the next micro-batch, the pre-compaction snapshots can go
    produce(kafka_config, topic, event_records(range(600, 700)))
    _ingest_in_batches(spark, settings, spec, kafka, catalog)
    on_disk, before = data_files_on_disk(settings, spec), current_view(catalog, spec)
    expired = _run_job(spark, settings, catalog, spec, "expire_snapshots")
    view = current_view(catalog, spec)
    assert len(view.snapshots) < 10
    assert expired["procedure_output"]["expired_snapshots"] == len(before.snapshots) - len(view.snapshots) > 0
    assert state_at(view.snapshots, view.main).offsets == {p: w.high for p, w in kafka.watermarks(topic).items()}

    # exactly-once continues across maintenance; once the compaction's replace snapshot is expired too, the
    # small data files it replaced are deleted (Iceberg's ExpireSnapshots deletes a file with the snapshot
    # that removed it)
    produce(kafka_config, topic, event_records(range(700, 750)))
    _ingest_in_batches(spark, settings, spec, kafka, catalog)
    assert _run_job(spark, settings, catalog, spec, "expire_snapshots")["procedure_output"]["expired_snapshots"] >= 1
    assert len(on_disk - data_files_on_disk(settings, spec)) >= compacted["data_files_before"]
    ids = [r["id"] for r in table_rows(spark, settings, spec)]
    assert sorted(ids) == list(range(750))
    outcome = duplicate_free(spark, f"{settings.catalog.name}.{spec.identifier}", spec, current_table(catalog, spec))
    assert outcome.passed, outcome.summary


def test_a_table_whose_ingest_state_was_expired_refuses_to_reingest(
    spark, settings, kafka, kafka_config, catalog, unique, topic_factory
):
    topic = topic_factory(unique, partitions=1)
    produce(kafka_config, topic, event_records(range(100)))
    spec = make_spec(unique, topic, max_records_per_partition=20, partition_by=[])
    _ingest_in_batches(spark, settings, spec, kafka, catalog)
    _run_job(spark, settings, catalog, spec, "compact")
    # an operator expiring by hand with retain_last => 1 drops every ingest snapshot
    spark.sql(
        f"CALL {settings.catalog.name}.system.expire_snapshots(table => '{spec.identifier}', "
        "older_than => TIMESTAMP '2999-01-01 00:00:00', retain_last => 1)"
    )
    with pytest.raises(LakeError, match="holds 100 records but no snapshot in main's ancestry carries kafka.offsets"):
        run_micro_batch(spark, settings, spec, commit_id=str(uuid.uuid4()), kafka=kafka, catalog=catalog)
    assert len(table_rows(spark, settings, spec)) == 100


def test_remove_orphan_files_respects_its_safety_window(
    spark, settings, kafka, kafka_config, catalog, unique, topic_factory
):
    topic = topic_factory(unique, partitions=1)
    produce(kafka_config, topic, event_records(range(50)))
    spec = make_spec(unique, topic, partition_by=[], maintenance={"orphan_older_than": "2d"})
    _ingest_in_batches(spark, settings, spec, kafka, catalog)
    live = data_files_on_disk(settings, spec)
    data_dir = Path(next(iter(live))).parent
    old, fresh = data_dir / "stale-leftover.parquet", data_dir / "in-flight-write.parquet"
    for f in (old, fresh):
        f.write_bytes(b"PAR1 not really")
    three_days_ago = time.time() - 3 * 86400
    os.utime(old, (three_days_ago, three_days_ago))

    result = _run_job(spark, settings, catalog, spec, "remove_orphan_files")
    assert result["procedure_output"]["orphan_files_deleted"] == 1
    assert not old.exists(), "an unreferenced file older than the window is removed"
    assert fresh.exists(), "a recent unreferenced file (a write in flight) is kept"
    assert live <= data_files_on_disk(settings, spec), "referenced files are never touched"


def _produce_changes(kafka_config, topic: str, changes: dict[int, float | None]) -> None:
    """Plain keyed upserts (``cdc: none``): key -> amount, None = tombstone (delete)."""
    import json

    from confluent_kafka import Producer

    producer = Producer(kafka_config.client_conf())
    for i, amount in changes.items():
        value = (
            None
            if amount is None
            else json.dumps({"id": i, "name": f"n{i}", "amount": amount, "event_time": "2023-11-14T10:00:00Z"}).encode()
        )
        producer.produce(topic, key=str(i).encode(), value=value)
    assert producer.flush(30) == 0


def _duck_rows(catalog, spec) -> dict:
    from devtools import duck
    from kafka_iceberg.catalog.tables import load_table

    scan = duck.scan_sql(load_table(catalog, spec.identifier).metadata_location)
    return dict(duck.connect().execute(f"SELECT id, amount FROM {scan}").fetchall())


def test_upsert_table_maintenance_rewrites_delete_files_and_keeps_state(
    spark, settings, kafka, kafka_config, catalog, unique, topic_factory
):
    from kafka_iceberg.ops import maintenance

    topic = topic_factory(unique, partitions=1)
    spec = make_spec(
        unique,
        topic,
        mode="upsert",
        key=["id"],
        cdc="none",
        partition_by=[],
        kafka_columns=["partition", "offset"],  # no headers list: see has_collection_columns
        maintenance={"retain_last": 1, "max_snapshot_age": "0s"},
    )
    fqn = f"{settings.catalog.name}.{spec.identifier}"
    expected: dict[int, float] = {}

    def batch(changes: dict[int, float | None]) -> None:
        _produce_changes(kafka_config, topic, changes)
        expected.update({i: a for i, a in changes.items() if a is not None})
        for i in [i for i, a in changes.items() if a is None]:
            expected.pop(i, None)
        _ingest_in_batches(spark, settings, spec, kafka, catalog)

    batch({i: float(i) for i in range(200)})
    for r in range(6):  # updates and deletes: each MERGE writes position delete files
        batch(
            {**{i: i + 0.25 * (r + 1) for i in range(r * 30, r * 30 + 40)}, **{150 + r * 5 + k: None for k in range(3)}}
        )
    watermarks = {p: w.high for p, w in kafka.watermarks(topic).items()}
    deletes = live_delete_files(spark, fqn)
    assert deletes >= 6
    assert {r[0] for r in spark.sql(f"SELECT content FROM {fqn}.delete_files").collect()} == {1}
    assert _duck_rows(catalog, spec) == expected

    assert not maintenance.has_collection_columns(spark.table(fqn).schema)
    combined = maintenance.rewrite_deletes(spark, settings.catalog.name, spec.identifier)
    # file-scoped deletes (one data file each): rewritten, nothing to combine, none dangling yet
    assert combined.output["rewritten_delete_files_count"] == deletes
    assert combined.delete_files_before == deletes and combined.delete_files_after <= deletes
    assert combined.files_after == combined.files_before  # data files untouched
    assert _duck_rows(catalog, spec) == expected

    compacted = _run_job(spark, settings, catalog, spec, "compact")  # rewrite_data_files applies the deletes
    assert compacted["delete_files_before"] == combined.delete_files_after
    assert compacted["delete_files_after"] == 0 == live_delete_files(spark, fqn)
    assert compacted["data_files_after"] < compacted["data_files_before"]
    assert _duck_rows(catalog, spec) == expected
    assert {r["id"]: r["amount"] for r in table_rows(spark, settings, spec)} == expected

    # the ingest state is read through the replace snapshots; expiry keeps it
    view = current_view(catalog, spec)
    ops = [s.summary.get("operation") for s in ancestors_of(view)][:2]
    assert ops == ["replace", "replace"]
    assert state_at(view.snapshots, view.main).offsets == watermarks
    expired = _run_job(spark, settings, catalog, spec, "expire_snapshots")["procedure_output"]
    assert expired["retain_last"] >= 3
    # the tombstone table (one row per deleted key, docs/cdc.md) is compacted and expired with the table
    assert compacted["procedure_output"]["tombstones_rewritten_data_files_count"] > 0
    assert expired["tombstones_kept"] == 18 and expired["tombstones_expired_snapshots"] > 0
    view = current_view(catalog, spec)
    assert state_at(view.snapshots, view.main).offsets == watermarks

    # exactly-once continues: more changes after maintenance, each applied once
    batch({1: 99.0, 2: None, 500: 5.0})
    assert _duck_rows(catalog, spec) == expected
    outcome = duplicate_free(spark, fqn, spec, current_table(catalog, spec))
    assert outcome.passed, outcome.summary


def ancestors_of(view):
    from kafka_iceberg.state import ancestors

    return ancestors(view.snapshots, view.main)


def test_tables_with_list_or_map_columns_are_recognised():
    from pyspark.sql.types import ArrayType, BinaryType, LongType, MapType, StringType, StructField, StructType

    from kafka_iceberg.ops import maintenance

    headers = ArrayType(StructType([StructField("key", StringType()), StructField("value", BinaryType())]))
    flat = StructType([StructField("id", LongType()), StructField("name", StringType())])
    assert not maintenance.has_collection_columns(flat)
    assert maintenance.has_collection_columns(StructType([*flat.fields, StructField("_kafka_headers", headers)]))
    deep = StructType([StructField("s", StructType([StructField("m", MapType(StringType(), LongType()))]))])
    assert maintenance.has_collection_columns(deep)


# --- schedules spread over time, runs bounded -------------------------------------------------------


def _specs(n: int, **overrides) -> list:
    from kafka_iceberg.declaration.spec import parse_table_spec
    from tests.helpers import spec_dict

    return [parse_table_spec(spec_dict(f"tbl_{i:03d}", f"events.tbl_{i:03d}", **overrides)) for i in range(n)]


def _crons(specs, kind: str) -> list[str]:
    return [crons[kind] for crons in maintenance_crons(specs).values()]


SPREAD_IN_A_NEW_PROCESS = """
import json
from tests.helpers import spec_dict
from kafka_iceberg.declaration.spec import parse_table_spec
from kafka_iceberg.schedules.spread import maintenance_crons
specs = [parse_table_spec(spec_dict(f"tbl_{i:03d}", f"events.tbl_{i:03d}")) for i in range(100)]
print(json.dumps(maintenance_crons(specs)))
"""


def test_a_hundred_tables_compact_spread_over_the_hour_stably_across_loads():
    import collections
    import json
    import subprocess
    import sys

    from croniter import croniter

    from kafka_iceberg.config.settings import CHECKOUT

    specs = _specs(100)
    compact = _crons(specs, "compact")
    assert len(compact) == 100
    minutes = collections.Counter(int(c.split()[0]) for c in compact)
    assert max(minutes.values()) <= 3, minutes  # ceil(100 / 60) + 1
    assert len(minutes) >= 50
    times = collections.Counter(tuple(c.split()[:2]) for c in compact)
    assert max(times.values()) == 1, "tables sharing a minute get distinct hours"
    for kind, declared in [
        ("compact", "0 2 * * *"),
        ("remove_orphan_files", "0 4 * * 0"),
        ("full_check", "0 5 * * *"),
    ]:
        for cron in _crons(specs, kind):  # the declared period is kept: daily stays daily, weekly weekly
            assert cron.split()[2:] == declared.split()[2:] and croniter.is_valid(cron)
            assert len(cron.split()[0].split(",")) == 1 and len(cron.split()[1].split(",")) == 1

    # one table keeps its declared order and gaps: compact, then expire an hour later
    by_table = maintenance_crons(specs)
    for crons in by_table.values():
        c_min, c_hour = map(int, crons["compact"].split()[:2])
        e_min, e_hour = map(int, crons["expire_snapshots"].split()[:2])
        assert (c_min, (c_hour + 1) % 24) == (e_min, e_hour)

    # the same crons in another process (another PYTHONHASHSEED), and with the tables in another order
    out = subprocess.run(
        [sys.executable, "-c", SPREAD_IN_A_NEW_PROCESS],
        cwd=CHECKOUT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONHASHSEED": "12345"},
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == by_table
    assert maintenance_crons(list(reversed(specs))) == by_table


def test_adding_a_table_moves_few_others_and_hourly_crons_spread_within_the_hour():
    from kafka_iceberg.schedules.spread import spread_cron

    specs = _specs(100)
    before = maintenance_crons(specs[:99])
    after = maintenance_crons(specs)
    moved = [i for i in before if before[i] != after[i]]
    assert len(moved) <= 5, moved
    assert spread_cron("*/15 * * * *", (11, 7)) == "11,26,41,56 * * * *"
    assert spread_cron("0 */6 * * 1-5", (41, 3)) == "41 3,9,15,21 * * 1-5"
    assert spread_cron("0 23 * * 0", (30, 2)) == "30 1 * * 0"  # past midnight: stays on the declared day
    assert spread_cron("* * * * *", (30, 2)) == "* * * * *"


def test_a_cron_the_table_declares_itself_is_pinned_and_defaults_are_spread(tmp_path):
    import yaml

    from kafka_iceberg.declaration.spec import load_table_specs
    from tests.helpers import spec_dict

    pinned = spec_dict("pinned_t", "events.pinned_t", maintenance={"compact": "0 2 * * *"})
    other = spec_dict("other_t", "events.other_t")
    path = tmp_path / "tables.yaml"
    path.write_text(yaml.safe_dump({"defaults": {"maintenance": {"expire": "30 1 * * *"}}, "tables": [pinned, other]}))
    specs = load_table_specs(path)
    crons = {s.name: c for s, c in zip(specs, maintenance_crons(specs).values(), strict=True)}
    assert crons["pinned_t"]["compact"] == "0 2 * * *"
    assert crons["pinned_t"]["expire_snapshots"] != "0 3 * * *"  # the table did not declare it: spread
    assert crons["other_t"]["expire_snapshots"] != "30 1 * * *"  # a cron of defaults: is the period, spread
    assert crons["other_t"]["expire_snapshots"].split()[2:] == ["*", "*", "*"]
