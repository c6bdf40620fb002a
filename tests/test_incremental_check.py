"""duplicate_free after a run reads only the rows the run added (kafka_iceberg/ops/incremental_check.py),
and still fails on a duplicate the run introduced. Real Spark, catalog and broker."""

from __future__ import annotations

import json

import numpy as np

from devtools.demo.data import produce
from kafka_iceberg.catalog.tables import metadata_view, qualified
from kafka_iceberg.ops.checks import duplicate_free
from kafka_iceberg.ops.incremental_check import merged_ranges, rows_outside, run_snapshots
from kafka_iceberg.state import KEY_BATCH, KEY_COMMIT_ID, SnapshotInfo
from tests.helpers import event_records, make_spec


def _snap(sid: int, batch: dict) -> SnapshotInfo:
    return SnapshotInfo(sid, None, 0, {KEY_BATCH: json.dumps({str(p): list(r) for p, r in batch.items()})})


def _ingest(kafka_config, writer, spec, offsets: range, commit_id: str) -> None:
    """Produce the event records ``offsets`` to ``spec``'s topic and commit them in one micro-batch as ``commit_id``."""
    produce(kafka_config, spec.topic, event_records(offsets))
    writer.execute(writer.plan(), commit_id)


def _table_after_runs(kafka_config, writer_factory, unique, topic_factory, runs: list[tuple[int, str]]):
    """A table on a new 2-partition topic after one micro-batch per ``(records, commit id)`` of ``runs``."""
    spec = make_spec(unique, topic_factory(unique, partitions=2), max_records_per_partition=1000)
    writer, start = writer_factory(spec), 0
    for count, commit_id in runs:
        _ingest(kafka_config, writer, spec, range(start, start + count), commit_id)
        start += count
    return spec, writer


def test_merged_ranges_joins_contiguous_batches_per_partition():
    snaps = [_snap(1, {0: (0, 5), 1: (0, 2)}), _snap(2, {0: (5, 9)}), _snap(3, {0: (12, 14), 1: (2, 2)})]
    assert merged_ranges(snaps) == {0: [(0, 9), (12, 14)], 1: [(0, 2)]}


def test_rows_outside_counts_offsets_in_no_range_of_their_partition():
    ranges = {0: [(0, 9), (12, 14)], 1: [(5, 6)]}
    partitions = np.array([0, 0, 0, 0, 0, 1, 1, 2])
    offsets = np.array([0, 8, 9, 11, 13, 5, 6, 0])  # outside: 0/9, 0/11, 1/6, 2/0
    assert rows_outside(partitions, offsets, ranges) == 4
    assert rows_outside(np.array([], dtype=np.int64), np.array([], dtype=np.int64), ranges) == 0


def test_a_later_check_of_one_run_reads_only_what_came_after_the_earlier_one(
    spark, settings, catalog, kafka_config, writer_factory, unique, topic_factory
):
    """A worker run checks a table every CHECK_EVERY_S: each check reads the rows after the snapshot the
    previous one covered (``after``), not everything the run added."""
    spec, writer = _table_after_runs(
        kafka_config, writer_factory, unique, topic_factory, [(100, "run-a"), (30, "run-b")]
    )
    first = metadata_view(catalog.load_table(spec.identifier))
    _ingest(kafka_config, writer, spec, range(130, 150), "run-b")
    iceberg = catalog.load_table(spec.identifier)
    view = metadata_view(iceberg)
    table = qualified(settings, spec)
    spark.sparkContext.setJobGroup("incremental-check", "the check reads with pyiceberg")
    try:
        later = duplicate_free(spark, table, spec, iceberg, commit_id="run-b", after=first.main)
    finally:
        spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
    assert spark.sparkContext.statusTracker().getJobIdsForGroup("incremental-check") == [], "no Spark job"
    assert later.passed and later.figures["scope"] == "incremental", later.summary
    assert later.figures["rows_scanned"] == 20 and later.figures["snapshots_scanned"] == 1
    assert later.snapshot_id == view.main
    whole = duplicate_free(spark, table, spec, iceberg, commit_id="run-b")
    assert whole.figures["rows_scanned"] == 50 and whole.figures["snapshots_scanned"] == 2
    assert run_snapshots(view, "run-b", after=view.main) == [], "nothing after the newest snapshot"


def test_after_a_run_only_its_rows_are_read_and_a_duplicate_it_added_fails(
    spark, settings, catalog, kafka_config, writer_factory, unique, topic_factory
):
    spec, writer = _table_after_runs(
        kafka_config, writer_factory, unique, topic_factory, [(300, "run-a"), (40, "run-b")]
    )
    table = qualified(settings, spec)
    iceberg = catalog.load_table(spec.identifier)
    view = metadata_view(iceberg)

    full = duplicate_free(spark, table, spec, iceberg)
    assert full.passed and full.figures["scope"] == "full"
    since_b = duplicate_free(spark, table, spec, iceberg, commit_id="run-b")
    assert since_b.passed, since_b.summary
    assert since_b.figures["scope"] == "incremental"
    assert since_b.figures["rows_scanned"] == 40 and since_b.figures["snapshots_scanned"] == 1
    assert [s.summary[KEY_COMMIT_ID] for s in run_snapshots(view, "run-b")] == ["run-b"]
    # a run that committed nothing (e.g. the check on its own, from a schedule): the full scan
    assert duplicate_free(spark, table, spec, iceberg, commit_id="no-such-run").figures["scope"] == "full"
    # since run-a's first snapshot: run-a's and run-b's rows (or the full scan, when it has no parent)
    since_a = duplicate_free(spark, table, spec, iceberg, commit_id="run-a")
    assert since_a.passed and (since_a.figures["scope"] == "full" or since_a.figures["rows_scanned"] == 340)

    # a run that appends a copy of an already ingested row, outside any range it declares
    spark.table(table).limit(1).writeTo(table).option(f"snapshot-property.{KEY_COMMIT_ID}", "run-c").append()
    bad = duplicate_free(spark, table, spec, catalog.load_table(spec.identifier), commit_id="run-c")
    assert not bad.passed and bad.figures["rows_outside_batch_ranges"] == 1 and bad.figures["rows_scanned"] == 1
    # ... and one that declares the range it re-ingests: the summaries overlap
    row = spark.table(table).orderBy("_kafka_offset").limit(1)
    p, o = row.select("_kafka_partition", "_kafka_offset").collect()[0]
    (
        row.writeTo(table)
        .option(f"snapshot-property.{KEY_COMMIT_ID}", "run-d")
        .option(f"snapshot-property.{KEY_BATCH}", json.dumps({str(p): [o, o + 1]}))
        .append()
    )
    iceberg = catalog.load_table(spec.identifier)
    worse = duplicate_free(spark, table, spec, iceberg, commit_id="run-d")
    assert not worse.passed and worse.figures["overlapping_snapshot_pairs"] >= 1
    assert not duplicate_free(spark, table, spec, iceberg).passed, "the full scan sees both copies"
