"""Leaks after a killed micro-batch (see docs/operations.md, "What a killed micro-batch leaves
behind"): a micro-batch is crashed at each crash point (the injected crash hook raises a
``BaseException``, so nothing is cleaned up, as under SIGKILL), the next micro-batch runs, and the
leak counts of :mod:`devtools.rehearsal.leaks` must be within the bound; then maintenance runs and they are 0.
"""

from __future__ import annotations

import os
import signal
import time
import uuid

import pytest

from devtools.demo.data import produce
from devtools.rehearsal.leaks import count_leaks
from devtools.rehearsal.run import kill_group
from kafka_iceberg.batch.context import CRASH_POINTS
from kafka_iceberg.batch.pipeline import run_micro_batch
from kafka_iceberg.catalog.tables import load_table, metadata_view
from kafka_iceberg.declaration.spec import parse_table_spec
from kafka_iceberg.ops import maintenance
from tests.helpers import data_files_on_disk, event_records, spec_dict


class Killed(BaseException):
    """Raised by the crash hook: like SIGKILL, it skips the write path's own cleanup."""


def _crash_at(point: str):
    def hook(name: str) -> None:
        if name == point:
            raise Killed(point)

    return hook


def _records(ids):
    """Good events, with every 10th record malformed (quarantined in the dead-letter table)."""
    for key, value, ts in event_records(ids):
        yield (key, b'{"id": broken', ts) if int(key) % 10 == 0 else (key, value, ts)


@pytest.mark.parametrize("point", CRASH_POINTS)
def test_leaks_after_a_crash_are_within_the_bound_and_maintenance_leaves_none(
    spark, settings, kafka, kafka_config, catalog, unique, topic_factory, point
):
    topic = topic_factory(unique, partitions=2)
    spec = parse_table_spec(spec_dict(unique, topic, bad_records={"policy": "quarantine", "max_quarantine_rate": 1}))
    dlq = spec.bad_records.dead_letter_identifier
    produce(kafka_config, topic, _records(range(100)))
    first = run_micro_batch(spark, settings, spec, commit_id=f"first-{unique}", kafka=kafka, catalog=catalog)
    assert first.committed and first.quarantined == 10
    assert count_leaks(catalog, spec.identifier, dlq).total == 0, "a clean micro-batch leaves nothing"

    produce(kafka_config, topic, _records(range(100, 200)))
    with pytest.raises(Killed):
        run_micro_batch(
            spark,
            settings,
            spec,
            commit_id=f"killed-{unique}",
            kafka=kafka,
            catalog=catalog,
            crash_hook=_crash_at(point),
        )
    left = count_leaks(catalog, spec.identifier, dlq)
    assert left.stale_branches >= 1, f"the killed attempt left its branch: {left}"
    if point in ("after_write", "after_publish"):
        assert len(left.dead_letters.stale_branches) == 1, "and the dead-letter table's branch"
    if point == "after_write":
        assert left.unpublished_dead_letter_rows == 10, "its quarantined records are not published"

    # inside the window: the attempt still counts as alive, so the next micro-batch leaves it alone
    during = run_micro_batch(
        spark, settings, spec, commit_id=f"during-{unique}", kafka=kafka, catalog=catalog, is_alive=lambda attempt: True
    )
    assert not during.recovery.dead_attempts
    assert count_leaks(catalog, spec.identifier, dlq).stale_branches >= 1

    # the first micro-batch that finds it dead removes everything it left: the bound is 0
    produce(kafka_config, topic, _records(range(200, 220)))
    after = run_micro_batch(
        spark, settings, spec, commit_id=f"after-{unique}", kafka=kafka, catalog=catalog, is_alive=lambda attempt: False
    )
    assert after.recovery.dead_attempts
    leaks = count_leaks(catalog, spec.identifier, dlq)
    assert leaks.beyond_bound(recovered=True) == 0, leaks.describe()

    # exactly once, and the quarantined records once each
    rows = spark.table(f"{settings.catalog.name}.{spec.identifier}").collect()
    dead = spark.table(f"{settings.catalog.name}.{dlq}").collect()
    assert sorted(r["id"] for r in rows) == [i for i in range(220) if i % 10]
    assert len(dead) == 22 and len({(r["partition"], r["offset"]) for r in dead}) == 22

    # maintenance (expiry keeping the ingest state; orphan removal with its 24 h window) leaves none
    for ident in (spec.identifier, dlq):
        maintenance.expire(
            spark,
            settings.catalog.name,
            ident,
            max_snapshot_age_s=0,
            retain_last=1,
            view=metadata_view(load_table(catalog, ident)),
        )
        maintenance.remove_orphans(spark, settings.catalog.name, ident, older_than_s=25 * 3600)
    assert count_leaks(catalog, spec.identifier, dlq).total == 0


def test_a_recovery_killed_between_dropping_a_branch_and_deleting_its_orphans_is_finished_by_the_next(
    spark, settings, kafka, kafka_config, catalog, unique, topic_factory, monkeypatch
):
    """A kill after recovery dropped a dead branch and before it deleted the attempt's orphan data files
    (steps 2 and 3 of kafka_iceberg/batch/recovery.py) leaves the tag ``dead_<branch>``, and the next
    micro-batch's recovery deletes those files and the tag: no leak, no maintenance needed."""
    from kafka_iceberg.batch import recovery

    topic = topic_factory(unique, partitions=2)
    spec = parse_table_spec(spec_dict(unique, topic))
    produce(kafka_config, topic, event_records(range(100)))
    with pytest.raises(Killed):
        run_micro_batch(
            spark,
            settings,
            spec,
            commit_id=f"a-{unique}",
            kafka=kafka,
            catalog=catalog,
            crash_hook=_crash_at("after_write"),
        )
    left = count_leaks(catalog, spec.identifier)
    assert left.orphan_files + left.unreachable_snapshots >= 1, (
        "the killed attempt wrote data files that no published snapshot lists"
    )
    time.sleep(settings.orphan_clock_skew_s + 0.5)  # its files are older than any later cut-off (minus the skew)

    def killed(*_args):
        raise Killed("between dropping the dead branch and deleting its orphan files")

    monkeypatch.setattr(recovery, "delete_orphan_files", killed)
    with pytest.raises(Killed):
        run_micro_batch(
            spark, settings, spec, commit_id=f"b-{unique}", kafka=kafka, catalog=catalog, is_alive=lambda a: False
        )
    refs = metadata_view(load_table(catalog, spec.identifier)).refs
    assert not [r for r in refs if r.startswith("ingest_")] and [r for r in refs if r.startswith("dead_ingest_")], refs
    monkeypatch.undo()

    produce(kafka_config, topic, event_records(range(100, 120)))
    after = run_micro_batch(
        spark, settings, spec, commit_id=f"c-{unique}", kafka=kafka, catalog=catalog, is_alive=lambda a: False
    )
    assert after.committed and after.recovery.dead_attempts
    leaks = count_leaks(catalog, spec.identifier)
    assert leaks.total == 0, leaks.describe()
    rows = spark.table(f"{settings.catalog.name}.{spec.identifier}").collect()
    assert sorted(r["id"] for r in rows) == list(range(120))


def test_count_leaks_sees_an_orphan_file_and_an_unreachable_snapshot(
    spark, settings, kafka, kafka_config, catalog, unique, topic_factory
):
    """The counter is not blind: a file no manifest lists and a snapshot no ref reaches are counted."""
    from pathlib import Path

    topic = topic_factory(unique, partitions=1)
    spec = parse_table_spec(spec_dict(unique, topic))
    produce(kafka_config, topic, event_records(range(20)))
    run_micro_batch(spark, settings, spec, commit_id=f"a-{unique}", kafka=kafka, catalog=catalog)
    table = load_table(catalog, spec.identifier)
    stray = (
        Path(table.metadata.location.removeprefix("file:").removeprefix("//")) / "data" / f"{uuid.uuid4().hex}.parquet"
    )
    stray.write_bytes(b"PAR1")
    name = settings.catalog.name
    spark.sql(f"ALTER TABLE {name}.{spec.identifier} CREATE BRANCH side")
    spark.sql(f"INSERT INTO {name}.{spec.identifier}.branch_side SELECT * FROM {name}.{spec.identifier} LIMIT 1")
    spark.sql(f"ALTER TABLE {name}.{spec.identifier} DROP BRANCH side")
    leaks = count_leaks(catalog, spec.identifier)
    assert leaks.orphan_files == 1 and str(stray) in leaks.table.orphan_files[0]
    assert leaks.unreachable_snapshots == 1 and leaks.stale_branches == 0
    assert leaks.dead_letters is None or leaks.dead_letters.total == 0


def _descendants(pid: int) -> list[int]:
    """Process ids of ``pid``'s descendants (from /proc; Linux)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = open(f"/proc/{entry}/stat").read()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _running(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie waiting to be reaped."""
    try:
        stat = open(f"/proc/{pid}/stat").read()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _is_java(pid: int) -> bool:
    try:
        return b"java" in open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")[0]
    except OSError:
        return False


def test_spark_jvm_of_a_killed_driver_exits_and_the_next_run_recovers(
    spark, settings, kafka, kafka_config, catalog, unique, topic_factory
):
    """SIGKILL only the Python driver of a micro-batch (not its process group) while it writes data
    files: its Spark JVM reads EOF on the stdin pipe pyspark opened to it and exits by itself, and
    so do the Python workers; the next micro-batch then recovers the attempt with no leak."""
    from tests.test_write_path import _run_in_subprocess

    topic = topic_factory(unique, partitions=2)
    n = 60_000
    produce(kafka_config, topic, event_records(range(n)))
    raw = spec_dict(unique, topic, max_records_per_partition=n)
    spec = parse_table_spec(raw)
    proc = _run_in_subprocess(
        settings, raw, None, commit_id=f"zombie-{unique}", extra_env={"LAKE_MAX_RECORDS_PER_TASK": "5000"}
    )
    try:
        deadline = time.monotonic() + 240
        while not data_files_on_disk(settings, spec):
            assert proc.poll() is None, "the run finished before it could be killed"
            assert time.monotonic() < deadline
            time.sleep(0.01)
        tree = _descendants(proc.pid)
        jvms = [p for p in tree if _is_java(p)]
        assert jvms, f"the driver {proc.pid} has a Spark JVM among {tree}"
        os.kill(proc.pid, signal.SIGKILL)  # the Python process only: the JVM is not signalled
        proc.wait(timeout=60)
        killed_at = time.monotonic()
        while any(_running(p) for p in tree) and time.monotonic() - killed_at < 120:
            time.sleep(0.2)
        left = [p for p in tree if _running(p)]
        assert not left, f"processes {left} outlived their killed Python driver by 120 s"
        print(f"the JVM and workers of the killed driver were gone {time.monotonic() - killed_at:.1f} s after the kill")
    finally:
        kill_group(proc)

    result = run_micro_batch(
        spark, settings, spec, commit_id=f"next-{unique}", kafka=kafka, catalog=catalog, is_alive=lambda attempt: False
    )
    assert result.recovery.dead_attempts, "the killed attempt left its branch"
    assert result.committed and result.records == n
    rows = spark.table(f"{settings.catalog.name}.{spec.identifier}").count()
    assert rows == n
    assert count_leaks(catalog, spec.identifier).total == 0


@pytest.mark.parametrize("declared_dead", [False, True], ids=["branch-kept", "branch-dropped"])
def test_a_late_publish_from_a_zombie_attempt_is_refused(
    spark, settings, kafka, kafka_config, catalog, unique, topic_factory, declared_dead
):
    """An attempt that resumes after another run committed (a zombie driver finishing its last Spark
    call) cannot publish: its fast-forward is refused because ``main`` moved (its branch kept: the
    other run saw it alive), or because recovery dropped its branch (the other run saw it dead).
    ``main`` keeps the other run's snapshot, every record is in the table once, and nothing leaks."""
    import threading

    topic = topic_factory(unique, partitions=2)
    spec = parse_table_spec(spec_dict(unique, topic, bad_records={"policy": "quarantine", "max_quarantine_rate": 1}))
    produce(kafka_config, topic, _records(range(50)))
    assert run_micro_batch(spark, settings, spec, commit_id=f"first-{unique}", kafka=kafka, catalog=catalog).committed
    produce(kafka_config, topic, _records(range(50, 150)))
    paused, resume, outcome = threading.Event(), threading.Event(), {}

    def hook(point: str) -> None:
        if point == "after_write":
            paused.set()
            resume.wait(600)

    def zombie():
        try:
            run_micro_batch(spark, settings, spec, commit_id=f"zombie-{unique}", kafka=kafka, crash_hook=hook)
            outcome["published"] = True
        except Exception as exc:  # the refusal
            outcome["error"] = exc

    thread = threading.Thread(target=zombie, daemon=True)
    thread.start()
    assert paused.wait(600), "the zombie attempt reached its write"
    other = run_micro_batch(
        spark,
        settings,
        spec,
        commit_id=f"other-{unique}",
        kafka=kafka,
        catalog=catalog,
        is_alive=lambda attempt: not declared_dead,
    )
    assert other.committed and other.records + other.quarantined == 100
    assert bool(other.recovery.dead_attempts) == declared_dead
    resume.set()
    thread.join(600)
    assert "published" not in outcome, "the zombie's late publish was refused"
    assert outcome["error"] is not None
    if not declared_dead:
        assert "moved" in str(outcome["error"]), outcome["error"]
    view = metadata_view(load_table(catalog, spec.identifier))
    assert view.main == other.snapshot_id
    ids = sorted(r["id"] for r in spark.table(f"{settings.catalog.name}.{spec.identifier}").collect())
    assert ids == [i for i in range(150) if i % 10]
    assert spark.table(f"{settings.catalog.name}.{spec.bad_records.dead_letter_identifier}").count() == 15
    # the refused attempt cleaned up after itself, or the next micro-batch's recovery does
    run_micro_batch(
        spark, settings, spec, commit_id=f"next-{unique}", kafka=kafka, catalog=catalog, is_alive=lambda attempt: False
    )
    assert count_leaks(catalog, spec.identifier, spec.bad_records.dead_letter_identifier).total == 0


def test_count_leaks_lists_an_s3_warehouse(tmp_path, unique):
    """On object storage the data location is listed through the table's FileIO (a moto S3 server):
    a stray object under data/ is an orphan file, a branch is a branch left, data files are not leaks."""
    import pyarrow as pa

    from kafka_iceberg.catalog.config import catalog_config_from_env
    from tests.s3_server import start_s3
    from tests.test_s3_warehouse import catalog_env

    server = start_s3(tmp_path / "moto.log")
    try:
        bucket = f"leaks-{unique.replace('_', '-')}"
        catalog = catalog_config_from_env(catalog_env(server, tmp_path, bucket)).load()
        catalog.create_namespace("db")
        table = catalog.create_table("db.events", schema=pa.schema([("id", pa.int64())]))
        for start in (0, 10):
            table.append(pa.table({"id": pa.array(range(start, start + 10), pa.int64())}))
        assert count_leaks(catalog, "db.events").total == 0
        server.client().put_object(Bucket=bucket, Key="warehouse/db/events/data/stray.parquet", Body=b"PAR1")
        table = catalog.load_table("db.events")
        table.manage_snapshots().create_branch(table.current_snapshot().snapshot_id, "ingest_1_left").commit()
        leaks = count_leaks(catalog, "db.events")
        assert leaks.table.orphan_files == (f"s3://{bucket}/warehouse/db/events/data/stray.parquet",)
        assert leaks.table.stale_branches == ("ingest_1_left",) and leaks.unreachable_snapshots == 0
    finally:
        server.stop()
