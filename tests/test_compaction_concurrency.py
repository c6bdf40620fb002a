"""Maintenance on a table while it ingests (real Spark, the real JDBC catalog, the dev broker): a
compaction (``rewrite_data_files``, a ``replace`` snapshot) that lands under a written attempt does not
fail its publish, which appends on top of it; compactions and snapshot expiry in a loop while
micro-batches run fail none of them, and every record is in the table once."""

from __future__ import annotations

import threading
import time
import uuid

from devtools.demo.data import produce
from kafka_iceberg.batch.pipeline import connect, run_micro_batch
from kafka_iceberg.batch.publish import publish
from kafka_iceberg.catalog.tables import load_table, metadata_view
from kafka_iceberg.ops import maintenance as maintenance_ops
from tests.helpers import event_records, make_spec, table_rows
from tests.test_publish_hardening import _written_attempt


def _run(spark, settings, spec, kafka, catalog):
    return run_micro_batch(spark, settings, spec, commit_id=str(uuid.uuid4()), kafka=kafka, catalog=catalog)


def _compact(spark, settings, spec) -> None:
    spark.sql(
        f"CALL {settings.catalog.name}.system.rewrite_data_files(table => '{spec.identifier}', "
        "options => map('rewrite-all', 'true'))"
    ).collect()


def _exactly(spark, settings, spec, n: int) -> None:
    rows = table_rows(spark, settings, spec)
    assert sorted(r["id"] for r in rows) == list(range(n))
    assert len({(r["_kafka_partition"], r["_kafka_offset"]) for r in rows}) == n


def test_a_compaction_under_a_written_attempt_is_published_over(
    spark, settings, kafka, kafka_config, catalog, unique, topic_factory
):
    topic = topic_factory(unique, partitions=2)
    spec = make_spec(unique, topic, max_records_per_partition=50)
    produce(kafka_config, topic, event_records(range(300)))
    assert _run(spark, settings, spec, kafka, catalog).records == 100
    assert _run(spark, settings, spec, kafka, catalog).records == 100
    lake = connect(spark, settings, kafka, catalog)
    plan, attempt, batch = _written_attempt(lake, spec, f"rebase-{unique}")
    try:
        _compact(spark, settings, spec)  # main moves under the attempt: a replace snapshot
        view = metadata_view(load_table(catalog, spec.identifier))
        compaction = view.refs["main"]
        assert compaction != plan.base_snapshot_id and view.snapshots[compaction].summary["operation"] == "replace"
        published = publish(lake, plan, attempt)
    finally:
        batch.classified.unpersist()
    view = metadata_view(load_table(catalog, spec.identifier))
    assert view.refs["main"] == published.snapshot_id
    assert view.snapshots[published.snapshot_id].parent_id == compaction, "appended on top of the compaction"
    assert attempt.branch not in view.refs
    summary = view.snapshots[published.snapshot_id].summary
    assert int(summary["total-records"]) == 200 + int(summary["added-records"])
    while _run(spark, settings, spec, kafka, catalog).committed:  # the partitions are not of equal size
        pass
    _exactly(spark, settings, spec, 300)


def test_compaction_and_expiry_in_a_loop_fail_no_micro_batch(
    spark, settings, kafka, kafka_config, catalog, unique, topic_factory
):
    topic = topic_factory(unique, partitions=2)
    spec = make_spec(unique, topic, max_records_per_partition=15)
    produce(kafka_config, topic, event_records(range(360)))
    assert _run(spark, settings, spec, kafka, catalog).committed
    stop, done, refused = threading.Event(), [], []
    name = settings.catalog.name

    def maintenance():
        while not stop.is_set():
            try:
                _compact(spark, settings, spec)
                view = metadata_view(load_table(catalog, spec.identifier))
                maintenance_ops.expire(spark, name, spec.identifier, 0.0, 1, view)  # keeps the state
                done.append(1)
            except Exception as exc:  # noqa: BLE001 - maintenance that loses a race is retried by its schedule
                refused.append(str(exc)[:200])
            time.sleep(0.5)

    thread = threading.Thread(target=maintenance, daemon=True)
    thread.start()
    produced, deadline = 360, time.monotonic() + 600
    try:  # a micro-batch of a few records takes about 0.15 s, a compaction seconds: keep records coming
        results = [_run(spark, settings, spec, kafka, catalog)]  # no micro-batch may fail (it would raise)
        while len(done) < 3 or len(results) < 20:
            assert time.monotonic() < deadline, f"maintenance ran {len(done)} times in 600 s: {refused[:3]}"
            produce(kafka_config, topic, event_records(range(produced, produced + 10)))
            produced += 10
            results.append(_run(spark, settings, spec, kafka, catalog))
            assert results[-1].committed
    finally:
        stop.set()
        thread.join()
    while results[-1].total_lag:
        results.append(_run(spark, settings, spec, kafka, catalog))
    assert len(done) >= 3, f"maintenance ran while micro-batches committed (the test can fail): {refused[:3]}"
    _exactly(spark, settings, spec, produced)
