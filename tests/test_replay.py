"""Replay and rebuild (kafka_iceberg.replay) against the real broker, Spark and catalog: a range
into a new table, a timestamp range, a replay that fails midway and resumes, a branch rebuild from
a snapshot, validation that catches a mismatch, and a start below the log start offset."""

from __future__ import annotations

import json
import time
import uuid
from datetime import datetime, timezone

import pytest
import yaml

from devtools.demo.data import produce
from kafka_iceberg.batch.pipeline import run_micro_batch
from kafka_iceberg.batch.recovery import BRANCH_PREFIX
from kafka_iceberg.catalog.tables import load_table
from kafka_iceberg.errors import DataLossError
from kafka_iceberg.replay import (
    KEY_REPLAY_OF,
    ReplayDataLossError,
    ReplayError,
    ReplayMismatchError,
    ReplayRequest,
    TableVersion,
    replay_table_spec,
    run_replay,
    validate_replay,
)
from kafka_iceberg.state import ancestors, batch_ranges, overlapping_batches, state_at
from tests.helpers import (
    BASE_TS_MS,
    current_view,
    data_files_on_disk,
    delete_records,
    event_records,
    make_spec,
    referenced_data_files,
    spec_dict,
)


def ingest_everything(spark, settings, spec, kafka, catalog) -> list[int]:
    """Run micro-batches until the table has no lag; returns the snapshot id of each commit."""
    snapshots = []
    for _ in range(20):
        r = run_micro_batch(spark, settings, spec, commit_id=str(uuid.uuid4()), kafka=kafka, catalog=catalog)
        if not r.committed:
            return snapshots
        snapshots.append(r.snapshot_id)
    raise AssertionError("the table did not catch up")


def replay(spark, settings, spec, kafka, catalog, crash_hook=None, **request):
    hook = {} if crash_hook is None else {"crash_hook": crash_hook}
    return run_replay(
        spark,
        settings,
        spec,
        ReplayRequest(**request),
        kafka=kafka,
        catalog=catalog,
        commit_id=f"replay-{uuid.uuid4()}",
        **hook,
    )


class SimulatedCrash(BaseException):
    """Raised by a crash hook: like a kill, the write path does not clean up after it."""


def rows_by_offset(spark, identifier: str, *, branch: str | None = None, snapshot_id: int | None = None) -> dict:
    """Every row of a table version as ``{(partition, offset): row dict}``; fails on a duplicate."""
    reader = spark.read
    if branch:
        reader = reader.option("branch", branch)
    if snapshot_id:
        reader = reader.option("snapshot-id", str(snapshot_id))
    out = {}
    for row in reader.table(f"lake.{identifier}").collect():
        d = row.asDict(recursive=True)
        key = (d["_kafka_partition"], d["_kafka_offset"])
        assert key not in out, f"{identifier}: {key} twice"
        out[key] = d
    return out


def in_range(rows: dict, ranges: dict) -> dict:
    return {k: v for k, v in rows.items() if k[0] in ranges and ranges[k[0]][0] <= k[1] < ranges[k[0]][1]}


def test_replay_an_offset_range_into_a_new_table(spark, settings, kafka, kafka_config, catalog, unique, topic_factory):
    topic = topic_factory(unique, partitions=3)
    produce(kafka_config, topic, event_records(range(300)))
    produce(kafka_config, topic, [(b"bad", b'{"id": 300, "name": ', BASE_TS_MS + 300)])  # quarantined by both
    spec = make_spec(unique, topic, max_records_per_partition=70)
    ingest_everything(spark, settings, spec, kafka, catalog)
    main_before = current_view(catalog, spec).main
    high = {p: w.high for p, w in kafka.watermarks(topic).items()}
    target = f"test.{unique}_rebuild"

    result = replay(
        spark,
        settings,
        spec,
        kafka,
        catalog,
        start_offsets={0: 10, 1: 0, 2: 5},
        into=target,
        validate=True,
        max_records_per_partition=50,
    )

    expected = {0: (10, high[0]), 1: (0, high[1]), 2: (5, high[2])}
    assert result.range.ranges == expected, "the end defaults to the original's committed offsets"
    assert result.complete and result.batches >= 2 and not result.resumed
    assert result.quarantined == 1
    assert result.records + result.quarantined == sum(e - s for s, e in expected.values())
    report = result.validation
    assert report.valid, report.summary()
    assert report.records_compared == report.replay_records == result.records
    (bad,) = [
        (r["partition"], r["offset"]) for r in spark.table(f"lake.{spec.bad_records.dead_letter_identifier}").collect()
    ]
    assert [(p.partition, p.original_records) for p in report.partitions] == [
        (p, e - s - (bad[0] == p)) for p, (s, e) in expected.items()
    ]
    replay_dead_letters = spark.table(f"lake.{target}_dead_letter").collect()
    assert [(r["partition"], r["offset"]) for r in replay_dead_letters] == [bad], (
        "the replay has its own dead-letter table"
    )

    # independently of validate_replay: the same rows under the same (partition, offset), nothing else
    original_rows = in_range(rows_by_offset(spark, spec.identifier), expected)
    replayed_rows = rows_by_offset(spark, target)
    assert replayed_rows == original_rows
    assert len(replayed_rows) == result.records

    # exactly once: the batches tile the range, each snapshot records the replay
    view = current_view(catalog, replay_table_spec(spec, target))
    history = list(reversed(ancestors(view.snapshots, view.main)))
    assert not overlapping_batches(history)
    covered = {p: s for p, (s, _) in expected.items()}
    for snap in (x for x in history if x.is_ingest):  # (the first is the empty snapshot of the first attempt branch)
        for p, (s, e) in batch_ranges(snap).items():
            assert s == covered[p]
            covered[p] = e
        recorded = json.loads(snap.summary[KEY_REPLAY_OF])
        assert recorded["original"] == spec.identifier and recorded["end"] == {
            str(p): e for p, (_, e) in expected.items()
        }
    assert covered == {p: e for p, (_, e) in expected.items()}
    assert state_at(view.snapshots, view.main).offsets == covered

    assert current_view(catalog, spec).main == main_before, "the original is not touched"
    assert kafka.group_offsets(f"lake-replay.{target}", topic) == {}, "a replay commits no consumer group"

    again = replay(spark, settings, spec, kafka, catalog, start_offsets={0: 10, 1: 0, 2: 5}, into=target, validate=True)
    assert again.resumed and again.complete and again.batches == 0 and again.validation.valid
    assert current_view(catalog, replay_table_spec(spec, target)).main == view.main

    with pytest.raises(ReplayError, match="holds another replay"):
        replay(spark, settings, spec, kafka, catalog, start_offsets={0: 11, 1: 0, 2: 5}, into=target)
    with pytest.raises(ReplayError, match="declared table"):
        replay(spark, settings, spec, kafka, catalog, start_offsets={0: 0}, into=spec.identifier)


def test_replay_a_timestamp_range(spark, settings, kafka, kafka_config, catalog, unique, topic_factory):
    """Event i has record timestamp BASE_TS_MS + i, so [t0 + 50, t0 + 150) holds exactly events 50..149."""
    topic = topic_factory(unique, partitions=2)
    produce(kafka_config, topic, event_records(range(200)))
    spec = make_spec(unique, topic)
    ingest_everything(spark, settings, spec, kafka, catalog)
    start_iso = datetime.fromtimestamp((BASE_TS_MS + 50) / 1000, tz=timezone.utc).isoformat().replace("+00:00", "Z")
    request = ReplayRequest.from_strings(
        from_time=start_iso, to_time=str(BASE_TS_MS + 150), into=f"test.{unique}_window", validate=True
    )
    assert request.start_ms == BASE_TS_MS + 50

    result = run_replay(spark, settings, spec, request, kafka=kafka, catalog=catalog, commit_id="replay-window")

    assert result.complete and result.validation.valid, result.validation.summary()
    assert sorted(result.range.start) == [0, 1]
    ids = sorted(r["id"] for r in rows_by_offset(spark, f"test.{unique}_window").values())
    assert ids == list(range(50, 150))
    assert result.validation.records_compared == 100

    # a time range beyond the original's committed offsets cannot be validated
    produce(kafka_config, topic, event_records(range(200, 220)))
    with pytest.raises(ReplayError, match="holds offsets only below"):
        replay(
            spark,
            settings,
            spec,
            kafka,
            catalog,
            start_ms=BASE_TS_MS + 190,
            end_ms=BASE_TS_MS + 215,
            into=f"test.{unique}_late",
            validate=True,
        )
    assert load_table(catalog, f"test.{unique}_late") is None, "nothing is created for a refused replay"


def test_a_replay_that_fails_midway_resumes_without_duplicates(
    spark, settings, kafka, kafka_config, catalog, unique, topic_factory, monkeypatch
):
    topic = topic_factory(unique, partitions=2)
    produce(kafka_config, topic, event_records(range(300)))
    spec = make_spec(unique, topic)
    ingest_everything(spark, settings, spec, kafka, catalog)
    target = f"test.{unique}_resumed"
    tspec = replay_table_spec(spec, target)
    args = dict(start_earliest=True, into=target, validate=True, max_records_per_partition=40)

    first = replay(spark, settings, spec, kafka, catalog, max_batches=1, **args)
    assert first.batches == 1 and first.records == 80 and not first.complete and first.validation is None
    assert first.offsets == {0: 40, 1: 40}

    # the second batch dies after writing its snapshot to its attempt branch and before publishing,
    # leaving what a SIGKILL leaves: the attempt branch and an unpublished snapshot with its files
    def crash(point):
        if point == "after_write":
            raise SimulatedCrash(point)

    with pytest.raises(SimulatedCrash):
        replay(spark, settings, spec, kafka, catalog, crash_hook=crash, **args)
    view = current_view(catalog, tspec)
    assert [b for b in view.refs if b.startswith(BRANCH_PREFIX)], "the dead attempt left its branch"
    assert state_at(view.snapshots, view.main).offsets == {0: 40, 1: 40}, "nothing of the dead batch is visible"
    # the arrow writer's files of the dead batch are not in any snapshot yet: recovery deletes them as
    # orphans, which spares files younger than the clock-skew window
    time.sleep(settings.orphan_clock_skew_s)

    rerun = run_replay(
        spark,
        settings,
        spec,
        ReplayRequest(**args),
        kafka=kafka,
        catalog=catalog,
        commit_id="replay-rerun",
        is_alive=lambda attempt: False,
    )
    assert rerun.resumed and rerun.complete
    assert rerun.records == 300 - 80, "the rerun continues after the committed batch"
    assert rerun.validation.valid, rerun.validation.summary()
    view = current_view(catalog, tspec)
    assert not [b for b in view.refs if b.startswith(BRANCH_PREFIX)], "recovery dropped the dead attempt"
    assert not overlapping_batches(ancestors(view.snapshots, view.main))
    assert sorted(r["id"] for r in rows_by_offset(spark, target).values()) == list(range(300))
    assert data_files_on_disk(settings, tspec) == referenced_data_files(spark, settings, tspec), "no leftover files"


def test_rebuild_on_a_branch_from_a_snapshot(spark, settings, kafka, kafka_config, catalog, unique, topic_factory):
    topic = topic_factory(unique, partitions=2)
    produce(kafka_config, topic, event_records(range(300)))
    produce(kafka_config, topic, [(b"bad", b"not json", BASE_TS_MS + 300)])  # quarantined by the original
    spec = make_spec(unique, topic, max_records_per_partition=50)
    snapshots = ingest_everything(spark, settings, spec, kafka, catalog)
    assert len(snapshots) >= 3
    s = snapshots[0]
    before = current_view(catalog, spec)
    main_rows = rows_by_offset(spark, spec.identifier)
    dead_letters = spark.table(f"lake.{spec.bad_records.dead_letter_identifier}").count()
    assert dead_letters == 1

    result = replay(
        spark,
        settings,
        spec,
        kafka,
        catalog,
        from_snapshot=s,
        branch="fix",
        validate=True,
        max_records_per_partition=40,
    )

    assert result.branch == "replay_fix" and result.target == spec.identifier
    assert result.range.start == state_at(before.snapshots, s).offsets == {0: 50, 1: 50}
    assert result.range.end == state_at(before.snapshots, before.main).offsets
    assert result.complete and result.records == 300 - 100 and result.quarantined == 1
    assert spark.table(f"lake.{spec.bad_records.dead_letter_identifier}").count() == 1, "no second dead letter"
    assert result.validation.valid and result.validation.records_compared == 200, result.validation.summary()
    after = current_view(catalog, spec)
    assert after.main == before.main and [x.snapshot_id for x in ancestors(after.snapshots, after.main)] == [
        x.snapshot_id for x in ancestors(before.snapshots, before.main)
    ], "main is untouched"
    assert rows_by_offset(spark, spec.identifier) == main_rows
    assert rows_by_offset(spark, spec.identifier, branch="replay_fix") == main_rows, "the branch is the rebuilt table"
    head = after.refs["replay_fix"]
    assert s in [x.snapshot_id for x in ancestors(after.snapshots, head)]
    assert not [b for b in after.refs if b.startswith(BRANCH_PREFIX)], "no attempt branch is left"

    # ingestion's recovery (even with every attempt declared dead) leaves the replay branch alone
    produce(kafka_config, topic, event_records(range(300, 320)))
    r = run_micro_batch(
        spark, settings, spec, commit_id="after-replay", kafka=kafka, catalog=catalog, is_alive=lambda attempt: False
    )
    assert r.records == 20
    assert current_view(catalog, spec).refs["replay_fix"] == head

    # publish as docs/operations.md says: keep old main as a tag, point main at the branch, drop it;
    # the next micro-batch continues from the branch's offsets, so the 20 new records come in once
    for sql in result.publish_sql(settings.catalog.name):
        spark.sql(sql)
    view = current_view(catalog, spec)
    assert view.main == head and "replay_fix" not in view.refs and "before_replay_fix" in view.refs
    r = run_micro_batch(spark, settings, spec, commit_id="after-publish", kafka=kafka, catalog=catalog)
    assert r.records == 20
    assert sorted(row["id"] for row in rows_by_offset(spark, spec.identifier).values()) == list(range(320))

    with pytest.raises(ReplayError, match="not in main's ancestry"):
        replay(spark, settings, spec, kafka, catalog, from_snapshot=12345, branch="nope")


def test_validation_detects_a_mismatch(spark, settings, kafka, kafka_config, catalog, unique, topic_factory):
    topic = topic_factory(unique, partitions=2)
    produce(kafka_config, topic, event_records(range(200)))
    spec = make_spec(unique, topic, max_records_per_partition=60)
    run_micro_batch(spark, settings, spec, commit_id="only-batch", kafka=kafka, catalog=catalog)  # [0, 60) each
    target = f"test.{unique}_tampered"
    result = replay(spark, settings, spec, kafka, catalog, start_offsets={0: 0, 1: 0}, into=target, validate=True)
    assert result.validation.valid and result.validation.records_compared == 120

    qualified_target = f"lake.{target}"
    spark.sql(f"DELETE FROM {qualified_target} WHERE _kafka_partition = 0 AND _kafka_offset = 3")
    spark.sql(f"UPDATE {qualified_target} SET name = 'tampered' WHERE _kafka_partition = 1 AND _kafka_offset = 5")
    spark.sql(
        f"INSERT INTO {qualified_target} SELECT * FROM {qualified_target} "
        "WHERE _kafka_partition = 1 AND _kafka_offset = 7"
    )
    original = TableVersion(spec.identifier, current_view(catalog, spec).main)
    tampered = TableVersion(target, current_view(catalog, replay_table_spec(spec, target)).main)
    report = validate_replay(
        spark, settings, spec, original=original, replay=tampered, ranges=result.range.ranges, check_outside_range=True
    )
    assert not report.valid
    assert (report.missing, report.extra, report.differing) == (1, 0, 2)
    assert report.mismatched_rows == 1 + 2 + 1, "deleted row; updated row both ways; the extra copy"
    assert {(e["partition"], e["offset"], e["kind"]) for e in report.examples} == {
        (0, 3, "missing"),
        (1, 5, "differing"),
        (1, 7, "differing"),
    }
    by_partition = {p.partition: (p.original_records, p.replay_records) for p in report.partitions}
    assert by_partition == {0: (60, 59), 1: (60, 61)}
    with pytest.raises(ReplayMismatchError, match="MISMATCH"):
        validate_replay(
            spark,
            settings,
            spec,
            original=original,
            replay=tampered,
            ranges=result.range.ranges,
            raise_on_mismatch=True,
        )

    # a value in a column only one side has is a difference too
    spark.sql(f"ALTER TABLE {qualified_target} ADD COLUMN note STRING")
    spark.sql(f"UPDATE {qualified_target} SET note = 'x' WHERE _kafka_partition = 0 AND _kafka_offset = 9")
    tampered = TableVersion(target, current_view(catalog, replay_table_spec(spec, target)).main)
    report = validate_replay(spark, settings, spec, original=original, replay=tampered, ranges=result.range.ranges)
    assert report.columns_only_in_replay == ["note"] and report.rows_with_uncompared_values == 1

    # a replay over a wider range than the original holds: the offsets past it are extra
    high = {p: w.high for p, w in kafka.watermarks(topic).items()}
    wide = replay(
        spark, settings, spec, kafka, catalog, start_offsets={0: 0, 1: 0}, end_offsets=high, into=f"test.{unique}_wide"
    )
    assert wide.validation is None and wide.records == 200
    report = validate_replay(
        spark,
        settings,
        spec,
        original=TableVersion(spec.identifier, original.snapshot_id),
        replay=TableVersion(f"test.{unique}_wide", wide.snapshot_id),
        ranges=wide.range.ranges,
    )
    assert not report.valid and (report.missing, report.extra, report.differing) == (0, 200 - 120, 0)


def test_a_start_below_the_log_start_offset_is_a_clear_error(
    spark, settings, kafka, kafka_config, catalog, unique, topic_factory
):
    topic = topic_factory(unique, partitions=1)
    produce(kafka_config, topic, event_records(range(100)))
    spec = make_spec(unique, topic)
    ingest_everything(spark, settings, spec, kafka, catalog)
    delete_records(kafka_config, topic, 0, 30)
    target = f"test.{unique}_gone"
    with pytest.raises(ReplayDataLossError) as info:
        replay(spark, settings, spec, kafka, catalog, start_offsets={0: 0}, into=target)
    err = info.value
    assert isinstance(err, DataLossError)
    assert (err.partition, err.committed, err.log_start) == (0, 0, 30)
    assert f"topic {topic} partition 0" in str(err) and "offsets [0, 30) are gone" in str(err)
    assert load_table(catalog, target) is None, "nothing is created"

    # from the earliest offset Kafka still holds, the replay matches the original over what both hold
    result = replay(spark, settings, spec, kafka, catalog, start_earliest=True, into=target, validate=True)
    assert result.range.ranges == {0: (30, 100)} and result.validation.valid


def test_cli_replay_prints_the_report_and_exits_by_verdict(
    spark, settings, lake_env, kafka, kafka_config, catalog, unique, topic_factory, monkeypatch, tmp_path, capsys
):
    from kafka_iceberg.lake_assets import cli

    topic = topic_factory(unique, partitions=2)
    produce(kafka_config, topic, event_records(range(100)))
    raw = spec_dict(unique, topic)
    spec = make_spec(unique, topic)
    ingest_everything(spark, settings, spec, kafka, catalog)
    tables = tmp_path / "tables.yaml"
    tables.write_text(yaml.safe_dump({"tables": [raw]}))
    for key, value in {**lake_env, "LAKE_TABLES_FILE": str(tables)}.items():
        monkeypatch.setenv(key, value)
    target = f"test.{unique}_cli"
    argv = ["replay", "--table", unique, "--from", "0:0,1:0", "--into", target, "--validate", "--json"]

    assert cli.main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["target"] == target and out["complete"] and out["validation"]["valid"]
    assert out["validation"]["records_compared"] == 100

    spark.sql(f"DELETE FROM lake.{target} WHERE _kafka_partition = 1 AND _kafka_offset = 0")
    assert cli.main(argv) == 1, "a mismatch exits 1"
    out = json.loads(capsys.readouterr().out)
    assert out["validation"]["missing"] == 1 and not out["validation"]["valid"]

    assert cli.main(["replay", "--table", unique, "--from", "7:0", "--into", f"test.{unique}_x"]) == 2
    assert "no partitions [7]" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        cli.main(["replay", "--table", unique, "--from", "0:0", "--from-time", "2023-11-14T00:00:00Z"])
    assert info.value.code == 2


def test_dagster_replay_job_materializes_the_target_and_fails_on_mismatch(
    spark, settings, lake_env, kafka, kafka_config, catalog, unique, topic_factory, monkeypatch, tmp_path
):
    from dagster import AssetKey, DagsterInstance

    from kafka_iceberg.declaration.spec import load_table_specs
    from kafka_iceberg.lake_assets.replay import replay_job
    from kafka_iceberg.resources import default_resources

    topic = topic_factory(unique, partitions=2)
    produce(kafka_config, topic, event_records(range(80)))
    raw = spec_dict(unique, topic)
    ingest_everything(spark, settings, make_spec(unique, topic), kafka, catalog)
    tables = tmp_path / "tables.yaml"
    tables.write_text(yaml.safe_dump({"tables": [raw]}))
    for key, value in {**lake_env, "LAKE_TABLES_FILE": str(tables)}.items():
        monkeypatch.setenv(key, value)
    target = f"test.{unique}_dagster"
    run_config = {
        "ops": {"replay_and_validate": {"config": {"table": unique, "from_offsets": "earliest", "into": target}}}
    }
    job = replay_job(load_table_specs(tables), sqlite_catalog=True)
    instance = DagsterInstance.ephemeral()

    ok = job.execute_in_process(run_config=run_config, resources=default_resources(settings), instance=instance)
    assert ok.success
    (mat,) = ok.get_asset_materialization_events()
    assert mat.asset_key == AssetKey(["lake", "test", f"{unique}_dagster"])
    md = mat.materialization.metadata
    assert md["validation"].value["valid"] and md["records_compared"].value == 80
    assert md["records"].value == 80

    spark.sql(f"UPDATE lake.{target} SET amount = -1 WHERE _kafka_partition = 0 AND _kafka_offset = 2")
    failed = job.execute_in_process(
        run_config=run_config, resources=default_resources(settings), instance=instance, raise_on_error=False
    )
    assert not failed.success
    (mat,) = failed.get_asset_materialization_events()
    assert mat.materialization.metadata["validation"].value["differing"] == 1
    failure = [e for e in failed.all_events if e.event_type_value == "STEP_FAILURE"]
    assert failure and "MISMATCH" in failure[0].event_specific_data.error.message
