"""The write path against real Spark, a real Iceberg JDBC catalog and a real Kafka-protocol broker."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import pytest

from devtools import duck
from devtools.demo.data import produce
from devtools.rehearsal.run import kill_group
from devtools.services.devbroker import free_port
from kafka_iceberg.batch.pipeline import run_micro_batch
from kafka_iceberg.batch.recovery import BRANCH_PREFIX
from kafka_iceberg.catalog.tables import _columns_of, ensure_dead_letter_table, ensure_table, load_catalog, load_table
from kafka_iceberg.declaration.spec import parse_table_spec
from kafka_iceberg.errors import (
    CommitConflictError,
    ConfigError,
    DataLossError,
    MalformedRecordError,
    TopicNotFoundError,
)
from kafka_iceberg.ops.checks import duplicate_free
from kafka_iceberg.state import KEY_BATCH, KEY_COMMIT_ID, ancestors, batch_ranges
from tests.helpers import (
    current_table,
    current_view,
    data_files_on_disk,
    delete_records,
    event,
    event_records,
    make_spec,
    referenced_data_files,
    spec_dict,
    table_rows,
)


def run(spark, settings, spec, kafka, catalog, **kw):
    return run_micro_batch(
        spark, settings, spec, commit_id=kw.pop("commit_id", str(uuid.uuid4())), kafka=kafka, catalog=catalog, **kw
    )


def assert_exactly(spark, settings, spec, catalog, ids: set[int]):
    """The table holds each of ``ids`` once, under distinct (partition, offset), and nothing else;
    DuckDB, reading the Iceberg metadata on its own, agrees on the count."""
    rows = table_rows(spark, settings, spec)
    got = [r["id"] for r in rows]
    assert len(got) == len(ids), f"{len(got)} rows for {len(ids)} produced records"
    assert set(got) == ids
    coords = {(r["_kafka_partition"], r["_kafka_offset"]) for r in rows}
    assert len(coords) == len(rows)
    for r in rows[:50]:  # values survive the trip
        e = event(r["id"])
        assert r["name"] == e["name"] and r["amount"] == e["amount"]
        assert json.loads(r["_kafka_key"].decode()) == r["id"]
    table = load_table(catalog, spec.identifier)
    assert duck.count_rows(table.metadata_location) == len(ids)


def test_micro_batches_across_partitions_respect_the_bound(
    spark, settings, kafka, kafka_config, catalog, unique, topic_factory
):
    topic = topic_factory(unique, partitions=3)
    produce(kafka_config, topic, event_records(range(900)))
    spec = make_spec(unique, topic, max_records_per_partition=120)
    results = []
    for _ in range(10):
        r = run(spark, settings, spec, kafka, catalog)
        if not r.committed:
            break
        results.append(r)
        assert all(e - s <= 120 for s, e in r.ranges.values()), r.ranges
    assert len(results) >= 3, "the bound must force several micro-batches"
    assert results[-1].total_lag == 0
    assert sum(r.records for r in results) == 900
    assert_exactly(spark, settings, spec, catalog, set(range(900)))

    # the snapshot summaries tile each partition's offsets with no gap and no overlap
    view = current_view(catalog, spec)
    history = list(reversed(ancestors(view.snapshots, view.main)))
    covered: dict[int, int] = {}
    for snap in history:
        for p, (s, e) in batch_ranges(snap).items():
            assert s == covered.get(p, 0), f"partition {p}: batch starts at {s}, previous ended at {covered.get(p, 0)}"
            covered[p] = e
    wm = kafka.watermarks(topic)
    assert covered == {p: w.high for p, w in wm.items() if w.high > 0}
    # the consumer group mirrors the table's committed offsets
    assert kafka.group_offsets(spec.consumer_group, topic) == {p: w.high for p, w in wm.items()}
    assert {s.summary[KEY_COMMIT_ID] for s in history if KEY_BATCH in s.summary} == {r.commit_id for r in results}


def test_a_small_batch_is_read_by_one_task_and_writes_one_data_file_per_table_partition(
    spark, settings, kafka, kafka_config, catalog, unique, topic_factory
):
    """900 records on 3 Kafka partitions, spanning 3 days of a days(event_time) table: one read task and
    an append without a shuffle (fanout writers) must still make one data file per day, as the hash
    distribution would, with every record once."""
    topic = topic_factory(unique, partitions=3)
    produce(kafka_config, topic, event_records(range(900)))
    spec = make_spec(unique, topic, max_records_per_partition=1000)
    result = run(spark, settings, spec, kafka, catalog)
    assert result.records == 900 and len(result.ranges) == 3
    files = load_table(catalog, spec.identifier).inspect.files().to_pylist()
    days = sorted(str(f["partition"]) for f in files)
    assert len(files) == 3 and len(set(days)) == 3, days
    assert sum(f["record_count"] for f in files) == 900
    assert_exactly(spark, settings, spec, catalog, set(range(900)))


def test_rerun_is_idempotent(spark, settings, kafka, kafka_config, catalog, unique, topic_factory):
    topic = topic_factory(unique, partitions=2)
    produce(kafka_config, topic, event_records(range(300)))
    spec = make_spec(unique, topic)
    first = run(spark, settings, spec, kafka, catalog)
    assert first.committed and first.records == 300
    before = current_view(catalog, spec)
    again = run(spark, settings, spec, kafka, catalog)
    assert not again.committed and again.records == 0
    after = current_view(catalog, spec)
    assert after.main == before.main and set(after.snapshots) == set(before.snapshots)
    assert_exactly(spark, settings, spec, catalog, set(range(300)))
    # new records after the rerun are picked up from where the table stopped
    produce(kafka_config, topic, event_records(range(300, 350)))
    third = run(spark, settings, spec, kafka, catalog)
    assert third.records == 50
    assert_exactly(spark, settings, spec, catalog, set(range(350)))


def _run_in_subprocess(settings, raw_spec: dict, crash_at: str | None, commit_id: str, extra_env=None):
    """Run one micro-batch in a fresh Python process (its own Spark), optionally SIGKILLed at a crash point."""
    code = textwrap.dedent(
        f"""
        import json, sys
        from devtools.rehearsal.faults import env_crash_hook
        from kafka_iceberg.catalog.spark import get_spark
        from kafka_iceberg.batch.pipeline import run_micro_batch
        from kafka_iceberg.config.settings import load_settings
        from kafka_iceberg.declaration.spec import parse_table_spec
        settings = load_settings()
        spec = parse_table_spec(json.loads(sys.argv[1]))
        run_micro_batch(get_spark(settings), settings, spec, commit_id={commit_id!r}, crash_hook=env_crash_hook())
        """
    )
    env = {
        **os.environ,
        "LAKE_HOME": str(settings.lake_home),
        "KAFKA_BOOTSTRAP_SERVERS": settings.kafka_bootstrap_servers,
        "SPARK_MASTER": "local[1]",
        "LAKE_SPARK_CONF": json.dumps({"spark.driver.memory": "1g"}),
        **(extra_env or {}),
    }
    if crash_at:
        env["LAKE_CRASH_AT"] = crash_at
    # its own process group, so the whole tree (Python driver, Spark's JVM, Python workers)
    # can be killed at once, as an OOM kill or a lost node would
    return subprocess.Popen(
        [sys.executable, "-c", code, json.dumps(raw_spec)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )


@pytest.mark.parametrize(
    ("crash_at", "declared"),
    [("after_write", {}), ("after_publish", {}), ("after_write", {"unknown_fields": "evolve"})],
    ids=["after_write", "after_publish", "after_write-spark-writer"],
)
def test_killed_attempt_is_recovered_and_commits_exactly_once(
    spark, settings, kafka, kafka_config, catalog, unique, topic_factory, crash_at, declared
):
    """A table parsed by pyarrow leaves data files no snapshot references; one on Spark's path
    (``unknown_fields: evolve``) leaves a snapshot on its attempt branch. Recovery removes either."""
    topic = topic_factory(unique, partitions=2)
    produce(kafka_config, topic, event_records(range(400)))
    raw = spec_dict(unique, topic, **declared)
    spec = parse_table_spec(raw)
    proc = _run_in_subprocess(settings, raw, crash_at, commit_id=f"crashed-{unique}")
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == -signal.SIGKILL, err.decode()[-2000:]
    kill_group(proc)  # the driver killed itself; make sure its JVM is gone too

    view = current_view(catalog, spec)
    leftover = [b for b in view.refs if b.startswith(BRANCH_PREFIX)]
    if crash_at == "after_write":
        assert len(leftover) == 1, "the killed attempt leaves its branch behind"
        assert view.main is None, "nothing was published before the kill"
        assert data_files_on_disk(settings, spec), "the killed attempt wrote data files"
    else:
        assert leftover == [] and view.main is not None, "the publish dropped the branch in the same commit"

    result = run(spark, settings, spec, kafka, catalog, is_alive=lambda attempt: False)
    assert result.recovery.dead_attempts == leftover
    if crash_at == "after_write":
        assert result.committed and result.records == 400
        if not declared:  # pyiceberg's files in the read tasks, not committed: orphans
            assert result.recovery.orphan_files_deleted
        else:
            assert result.recovery.expired_snapshots, "the unpublished snapshot is expired with its files"
    else:
        assert not result.committed, "the killed attempt had already published; nothing is left to do"
    assert_exactly(spark, settings, spec, catalog, set(range(400)))
    view = current_view(catalog, spec)
    assert not [b for b in view.refs if b.startswith(BRANCH_PREFIX)]
    assert data_files_on_disk(settings, spec) == referenced_data_files(spark, settings, spec), "no leftover files"
    # the table is the truth: the group offsets follow it even when the crash skipped them
    assert kafka.group_offsets(spec.consumer_group, topic) == {p: w.high for p, w in kafka.watermarks(topic).items()}


def test_kill_while_writing_leaves_no_orphans(spark, settings, kafka, kafka_config, catalog, unique, topic_factory):
    """SIGKILL the run as soon as its first data file appears, before the branch commit."""
    topic = topic_factory(unique, partitions=2)
    n = 60_000
    produce(kafka_config, topic, event_records(range(n)))
    raw = spec_dict(unique, topic, max_records_per_partition=n)
    spec = parse_table_spec(raw)
    proc = _run_in_subprocess(
        settings, raw, None, commit_id=f"killed-{unique}", extra_env={"LAKE_MAX_RECORDS_PER_TASK": "5000"}
    )
    deadline = time.monotonic() + 240
    while not data_files_on_disk(settings, spec):
        assert proc.poll() is None, "the run finished before it could be killed"
        assert time.monotonic() < deadline
        time.sleep(0.01)
    kill_group(proc)

    result = run(spark, settings, spec, kafka, catalog, is_alive=lambda attempt: False)
    assert result.recovery.dead_attempts, "the killed attempt left its branch"
    assert result.recovery.orphan_files_deleted or result.recovery.expired_snapshots
    assert result.committed and result.records == n
    assert_exactly(spark, settings, spec, catalog, set(range(n)))
    assert data_files_on_disk(settings, spec) == referenced_data_files(spark, settings, spec)


def test_two_runs_planned_on_the_same_base_publish_exactly_once(
    spark, settings, kafka, kafka_config, catalog, unique, topic_factory, writer_factory
):
    topic = topic_factory(unique, partitions=2)
    produce(kafka_config, topic, event_records(range(200)))
    spec = make_spec(unique, topic)
    a, b = writer_factory(spec), writer_factory(spec)
    plan_a, plan_b = a.plan(), b.plan()
    assert plan_a.base_snapshot_id == plan_b.base_snapshot_id
    won = a.execute(plan_a, "run-a")
    assert won.committed
    with pytest.raises(CommitConflictError, match="main moved"):
        b.execute(plan_b, "run-b")
    assert_exactly(spark, settings, spec, catalog, set(range(200)))
    view = current_view(catalog, spec)
    assert not [r for r in view.refs if r.startswith(BRANCH_PREFIX)], "the loser cleaned up its branch"
    assert data_files_on_disk(settings, spec) == referenced_data_files(spark, settings, spec)
    commit_ids = {s.summary.get(KEY_COMMIT_ID) for s in ancestors(view.snapshots, view.main)}
    assert "run-a" in commit_ids and "run-b" not in commit_ids


def test_malformed_record_fails_the_run_under_the_fail_policy(
    spark, settings, kafka, kafka_config, catalog, unique, topic_factory
):
    topic = topic_factory(unique, partitions=1)
    produce(kafka_config, topic, event_records(range(10)))
    produce(kafka_config, topic, [(b"bad", b'{"id": 10, "name": "x", "event_time": ', 1_700_000_000_010)])
    produce(kafka_config, topic, event_records(range(11, 20)))
    spec = make_spec(unique, topic, bad_records={"policy": "fail"})
    with pytest.raises(MalformedRecordError) as info:
        run(spark, settings, spec, kafka, catalog)
    err = info.value
    assert (err.topic, err.partition, err.offset) == (topic, 0, 10)
    assert f"topic {topic} partition 0 offset 10" in str(err)
    view = current_view(catalog, spec)
    assert view.main is None, "nothing was committed"
    assert not [r for r in view.refs if r.startswith(BRANCH_PREFIX)]
    assert not data_files_on_disk(settings, spec)


@pytest.mark.parametrize(
    "value, reason",
    [
        (
            {"id": 1, "name": "x", "event_time": "2023-11-14T00:00:00Z", "color": "red"},
            "fields not in the table schema: color",
        ),
        ({"name": "x", "event_time": "2023-11-14T00:00:00Z"}, "required field id is missing or null"),
        ({"id": "one", "event_time": "2023-11-14T00:00:00Z"}, "does not fit the table schema: id is one, not bigint"),
    ],
)
def test_records_that_do_not_fit_the_schema_fail_clearly(
    spark, settings, kafka, kafka_config, catalog, unique, topic_factory, value, reason
):
    topic = topic_factory(unique, partitions=1)
    produce(kafka_config, topic, [(b"k", json.dumps(value).encode(), 1_700_000_000_000)])
    spec = make_spec(unique, topic, bad_records={"policy": "fail"})
    with pytest.raises(MalformedRecordError, match=reason):
        run(spark, settings, spec, kafka, catalog)
    assert current_view(catalog, spec).main is None


def test_an_existing_table_is_checked_against_its_declaration(spark, settings, unique):
    """An existing table is checked, not created again: a declared column of another type, and a table that
    is not the declared dead-letter table, are clear errors; the matching table passes its check."""
    spec = make_spec(unique, f"events.{unique}")
    ensure_table(spark, settings, spec)
    ensure_table(spark, settings, spec)
    retyped = [{**c, "type": "string"} if c["name"] == "amount" else c for c in spec_dict(unique, "t")["schema"]]
    with pytest.raises(ConfigError, match="column 'amount' is DOUBLE but tables.yaml declares STRING"):
        ensure_table(spark, settings, make_spec(unique, f"events.{unique}", schema=retyped))
    borrowed = make_spec(f"{unique}_b", "t", bad_records={"policy": "quarantine", "dead_letter_table": spec.identifier})
    with pytest.raises(ConfigError, match="is not the dead-letter table of"):
        ensure_dead_letter_table(spark, settings, borrowed)
    ensure_dead_letter_table(spark, settings, make_spec(unique, "t", bad_records={"policy": "quarantine"}))
    ensure_dead_letter_table(spark, settings, make_spec(unique, "t", bad_records={"policy": "quarantine"}))
    # the same checks from the tables as pyiceberg loaded them (a worker's warm-up), without Spark's catalog
    pycatalog = load_catalog(settings.catalog)
    table = pycatalog.load_table(spec.identifier)
    assert _columns_of(None, settings, spec, table) == _columns_of(spark, settings, spec, None)  # no Spark on the first
    ensure_table(spark, settings, spec, table)
    with pytest.raises(ConfigError, match="column 'amount' is DOUBLE but tables.yaml declares STRING"):
        ensure_table(spark, settings, make_spec(unique, f"events.{unique}", schema=retyped), table)
    with pytest.raises(ConfigError, match="is not the dead-letter table of"):
        ensure_dead_letter_table(spark, settings, borrowed, table)
    quarantined = make_spec(unique, "t", bad_records={"policy": "quarantine"})
    dead_letter = pycatalog.load_table(quarantined.bad_records.dead_letter_identifier)
    ensure_dead_letter_table(spark, settings, quarantined, dead_letter)


def test_missing_topic_is_a_clear_error(spark, settings, kafka, catalog, unique):
    spec = make_spec(unique, f"events.{unique}.missing")
    with pytest.raises(TopicNotFoundError, match="does not exist"):
        run(spark, settings, spec, kafka, catalog)


def test_records_deleted_before_ingest_are_reported_as_data_loss(
    spark, settings, kafka, kafka_config, catalog, unique, topic_factory
):
    topic = topic_factory(unique, partitions=1)
    produce(kafka_config, topic, event_records(range(100)))
    spec = make_spec(unique, topic, max_records_per_partition=40)
    run(spark, settings, spec, kafka, catalog)  # commits [0, 40)
    delete_records(kafka_config, topic, 0, 70)
    with pytest.raises(DataLossError) as info:
        run(spark, settings, spec, kafka, catalog)
    assert (info.value.partition, info.value.committed, info.value.log_start) == (0, 40, 70)
    assert f"table test.{unique}" in str(info.value) and "30 offsets were deleted" in str(info.value)


def test_duplicate_free_check_fails_on_an_overlapping_commit(
    spark, settings, kafka, kafka_config, catalog, unique, topic_factory
):
    topic = topic_factory(unique, partitions=2)
    produce(kafka_config, topic, event_records(range(100)))
    spec = make_spec(unique, topic)
    run(spark, settings, spec, kafka, catalog)
    qualified = f"{settings.catalog.name}.{spec.identifier}"
    clean = duplicate_free(spark, qualified, spec, current_table(catalog, spec))
    assert clean.passed, clean.summary

    # seed a second commit that re-adds partition 0's first 10 offsets and claims that range
    rows = spark.table(qualified).where("_kafka_partition = 0 AND _kafka_offset < 10")
    props = {KEY_BATCH: json.dumps({"0": [0, 10]}), KEY_COMMIT_ID: "seeded-overlap"}
    writer = rows.writeTo(qualified)
    for k, v in props.items():
        writer = writer.option(f"snapshot-property.{k}", v)
    writer.append()

    outcome = duplicate_free(spark, qualified, spec, current_table(catalog, spec))
    assert not outcome.passed
    assert outcome.figures["overlapping_snapshot_pairs"] == 1
    assert outcome.figures["duplicate_offsets"] == 10
    assert "overlapping snapshot offset ranges" in outcome.summary


def test_records_deleted_between_plan_and_read_fail_the_run(
    spark, settings, kafka, kafka_config, catalog, unique, topic_factory, writer_factory
):
    topic = topic_factory(unique, partitions=1)
    produce(kafka_config, topic, event_records(range(100)))
    spec = make_spec(unique, topic)
    writer = writer_factory(spec)
    plan = writer.plan()
    assert plan.start_offsets == {0: 0}
    delete_records(kafka_config, topic, 0, 30)
    with pytest.raises(DataLossError, match=f"topic {topic} partition 0 no longer holds offset 0"):
        writer.execute(plan, "reads-deleted-records")
    view = current_view(catalog, spec)
    assert view.main is None and not [r for r in view.refs if r.startswith(BRANCH_PREFIX)]


def test_unreachable_broker_is_a_clear_error(unique):
    from kafka_iceberg.errors import BrokerUnavailableError
    from kafka_iceberg.kafka.admin import KafkaConfig, KafkaMetadata

    dead = KafkaMetadata(KafkaConfig(f"127.0.0.1:{free_port()}", {}, timeout_s=3))
    t0 = time.monotonic()
    with pytest.raises(BrokerUnavailableError, match="127.0.0.1"):
        dead.watermarks(f"events.{unique}")
    assert time.monotonic() - t0 < 30


def test_transaction_markers_and_aborted_records_are_skipped(
    spark, settings, kafka, kafka_config, catalog, unique, topic_factory
):
    """Offsets taken by transaction markers and aborted records leave gaps the reader tolerates;
    the table holds exactly the committed records and its offsets cover the whole log."""
    from confluent_kafka import Producer

    topic = topic_factory(unique, partitions=1)
    producer = Producer(kafka_config.client_conf(**{"transactional.id": f"tx-{unique}"}))
    producer.init_transactions(30)
    for ids, commit in ((range(0, 40), True), (range(1000, 1010), False), (range(40, 60), True)):
        producer.begin_transaction()
        for key, value, ts in event_records(ids):
            producer.produce(topic, key=key, value=value, timestamp=ts)
        producer.flush(30)
        (producer.commit_transaction if commit else producer.abort_transaction)(30)
    spec = make_spec(unique, topic)
    high = kafka.watermarks(topic)[0].high
    assert high > 70, "60 committed + 10 aborted records + 3 markers"
    t0 = time.monotonic()
    result = run(spark, settings, spec, kafka, catalog)
    assert time.monotonic() - t0 < settings.read_timeout_s, "the reader must not wait for offsets that never come"
    assert result.records == 60 and result.offsets == {0: high} and result.total_lag == 0
    assert_exactly(spark, settings, spec, catalog, set(range(60)))


def test_a_micro_batch_loads_table_metadata_at_phase_boundaries_and_an_empty_one_starts_no_spark_job(
    spark, settings, kafka, kafka_config, catalog, unique, topic_factory
):
    from kafka_iceberg.batch.pipeline import connect, prepare, run_batch
    from kafka_iceberg.batch.plan import plan_ingest

    topic = topic_factory(unique, partitions=2)
    produce(kafka_config, topic, event_records(range(100)))
    spec = make_spec(unique, topic)
    dlq = spec.bad_records.dead_letter_identifier
    lake = connect(spark, settings, kafka, catalog)
    _, history = prepare(lake, spec)
    assert run_batch(lake, spec, plan_ingest(lake, spec, history), f"first-{unique}").records == 100

    produce(kafka_config, topic, event_records(range(100, 150)))
    lake.metadata_loads.clear()
    _, history = prepare(lake, spec)
    result = run_batch(lake, spec, plan_ingest(lake, spec, history), f"second-{unique}")
    assert result.records == 50 and result.total_records == 150
    # the table and its dead-letter table once before planning, and no more (a table parsed by pyarrow): the read
    # tasks' writer and the commit start from that load, the commit returns the metadata after it, and
    # the publish (Java API) checks the ref on the table Iceberg reloads
    assert lake.metadata_loads == [spec.identifier, dlq]

    group = f"empty-batch-{unique}"
    tracker = spark.sparkContext.statusTracker()
    spark.sparkContext.setJobGroup(group, "a micro-batch with nothing to read")
    try:
        lake.metadata_loads.clear()
        _, history = prepare(lake, spec)
        result = run_batch(lake, spec, plan_ingest(lake, spec, history), f"third-{unique}")
        assert not result.committed and result.total_lag == 0
        assert lake.metadata_loads == [spec.identifier, dlq]
        assert list(tracker.getJobIdsForGroup(group)) == [], "planned from the catalog and the broker alone"
        spark.range(3).count()
        assert list(tracker.getJobIdsForGroup(group)), "a Spark job in this thread is seen (the check can fail)"
    finally:
        spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
    assert_exactly(spark, settings, spec, catalog, set(range(150)))
