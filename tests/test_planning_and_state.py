"""Offset planning, the snapshot-summary state contract and table declarations (pure functions)."""

from __future__ import annotations

import json
import os

import pytest

from kafka_iceberg.batch.planning import (
    SMALL_BATCH_OFFSETS,
    OffsetRange,
    Watermarks,
    offset_lag,
    plan_batch,
    split_ranges,
)
from kafka_iceberg.batch.recovery import attempt_branch, parse_attempt
from kafka_iceberg.config.settings import catalog_from_uri, load_settings
from kafka_iceberg.declaration.spec import load_table_specs, parse_duration_s
from kafka_iceberg.errors import ConfigError, DataLossError, OffsetsAheadError
from kafka_iceberg.state import (
    KEY_BATCH,
    SnapshotInfo,
    ingest_summary,
    overlapping_batches,
    state_at,
)
from tests.helpers import make_spec, spec_dict


def plan(committed, watermarks, bound=100, initial=None):
    return plan_batch(
        table="db.t",
        topic="t",
        base_snapshot_id=1,
        committed=committed,
        watermarks={p: Watermarks(*w) for p, w in watermarks.items()},
        initial_offsets=initial or {},
        bound=bound,
    )


def test_plan_is_bounded_per_partition():
    p = plan({0: 10, 1: 0, 2: 5}, {0: (0, 500), 1: (0, 40), 2: (0, 5)}, bound=100)
    assert p.start_offsets == {0: 10, 1: 0, 2: 5}
    assert p.end_offsets == {0: 110, 1: 40, 2: 5}
    assert [(r.partition, r.start, r.end) for r in p.ranges] == [(0, 10, 110), (1, 0, 40)]
    assert p.lag_after == {0: 390, 1: 0, 2: 0}
    assert p.needs_commit


def test_caught_up_table_needs_no_commit_but_a_new_table_records_its_start():
    assert not plan({0: 7}, {0: (0, 7)}).needs_commit
    fresh = plan({}, {0: (3, 3)}, initial={0: 3})
    assert fresh.is_empty and fresh.needs_commit, "the resolved starting offsets are committed once"


def test_new_partitions_start_at_their_initial_offset():
    p = plan({0: 50}, {0: (0, 50), 1: (20, 80)}, initial={1: 20})
    assert p.start_offsets == {0: 50, 1: 20} and p.end_offsets == {0: 50, 1: 80}


def test_committed_offset_below_log_start_is_data_loss():
    with pytest.raises(DataLossError) as info:
        plan({0: 10, 1: 100}, {0: (0, 50), 1: (250, 300)})
    err = info.value
    assert (err.table, err.partition, err.committed, err.log_start) == ("db.t", 1, 100, 250)
    assert "150 offsets were deleted" in str(err)


def test_offsets_ahead_of_the_log_or_vanished_partitions_are_errors():
    with pytest.raises(OffsetsAheadError, match="above its high watermark"):
        plan({0: 60}, {0: (0, 50)})
    with pytest.raises(OffsetsAheadError, match=r"partitions \[1\]"):
        plan({0: 10, 1: 5}, {0: (0, 50)})


def test_offset_lag_counts_uncommitted_partitions_from_their_log_start():
    wm = {0: Watermarks(0, 100), 1: Watermarks(40, 90), 2: Watermarks(0, 5)}
    assert offset_lag(wm, {0: 60, 2: 5}) == {0: 40, 1: 50, 2: 0}


def test_split_ranges_tiles_each_range_exactly():
    pieces = split_ranges([OffsetRange("t", 0, 5, 27), OffsetRange("t", 1, 0, 10)], 10)
    assert [(r.partition, r.start, r.end) for r in pieces] == [(0, 5, 15), (0, 15, 25), (0, 25, 27), (1, 0, 10)]
    with pytest.raises(ValueError):
        split_ranges([], 0)


def test_a_small_batch_is_read_by_one_task_within_the_task_bound():
    small = plan({0: 0, 1: 0}, {0: (0, 600), 1: (0, 400)}, bound=SMALL_BATCH_OFFSETS)
    assert small.offsets_planned == 1000 and small.one_read_task(250_000)
    assert not small.one_read_task(999), "LAKE_MAX_RECORDS_PER_TASK still bounds the one task"
    large = plan({0: 0, 1: 0}, {0: (0, SMALL_BATCH_OFFSETS), 1: (0, 1)}, bound=SMALL_BATCH_OFFSETS)
    assert large.offsets_planned == SMALL_BATCH_OFFSETS + 1 and not large.one_read_task(250_000)


def snap(sid, parent, summary=None, ts=0):
    return SnapshotInfo(sid, parent, ts, summary or {})


def test_a_replay_plan_stops_at_its_end_and_needs_no_readable_start_once_done():
    # the one planner serves replay: it never reads past the stop, even below the high watermark
    p = plan_batch(
        table="db.r",
        topic="t",
        base_snapshot_id=None,
        committed={0: 40},
        initial_offsets={1: 0},
        watermarks={0: Watermarks(0, 500), 1: Watermarks(50, 500)},
        bound=100,
        stop_at={0: 60, 1: 0},
    )
    assert p.start_offsets == {0: 40, 1: 0} and p.end_offsets == {0: 60, 1: 0}
    with pytest.raises(DataLossError):  # partition 1 still has offsets to read below its log start
        plan_batch(
            table="db.r",
            topic="t",
            base_snapshot_id=None,
            committed={},
            initial_offsets={1: 0},
            watermarks={1: Watermarks(50, 500)},
            bound=100,
            stop_at={1: 70},
        )


def test_the_batch_summary_carries_the_base_state_forward():
    from kafka_iceberg.batch.plan import ingest_target
    from kafka_iceberg.batch.types import PartitionStats, ReadBatch, WritePlan
    from kafka_iceberg.batch.write import batch_summary
    from kafka_iceberg.state import (
        KEY_GAPS,
        KEY_MAX_TIMESTAMPS,
        KEY_OFFSETS,
        KEY_QUARANTINED,
        KEY_READ,
        KEY_RECORDS,
        KEY_REPLAY_OF,
        IngestState,
    )

    spec = make_spec("t", "events.t")
    base = IngestState("events.t", {0: 10, 1: 20}, {0: 1000, 1: 5000}, 7, accepted_gaps=({"partition": 1},))
    offsets = plan({0: 10, 1: 20}, {0: (0, 15), 1: (0, 20)})
    stats = (PartitionStats(0, records=4, quarantined=1, max_offset=14, max_timestamp_ms=2000, bytes=40),)
    batch = ReadBatch(None, (), stats, {"malformed": 1})
    write_plan = WritePlan(ingest_target(spec), offsets, base, extra_summary={KEY_REPLAY_OF: "{}", KEY_RECORDS: "x"})
    summary = batch_summary(spec, write_plan, batch, "run-1")
    assert json.loads(summary[KEY_OFFSETS]) == {"0": 15, "1": 20}
    assert json.loads(summary[KEY_MAX_TIMESTAMPS]) == {"0": 2000, "1": 5000}, "partition 1 carries its max forward"
    assert summary[KEY_RECORDS] == "3", "the ingest state keys win over extra properties"
    assert json.loads(summary[KEY_READ]) == {"0": 4} and json.loads(summary[KEY_QUARANTINED]) == {"0": 1}
    assert json.loads(summary[KEY_GAPS]) == [{"partition": 1}] and summary[KEY_REPLAY_OF] == "{}"
    assert batch_summary(spec, write_plan, batch, "run-1") == summary, "pure: same inputs, same summary"


def test_state_is_read_from_the_nearest_ingest_ancestor():
    s1 = ingest_summary(
        topic="t",
        offsets={0: 10, 1: 4},
        batch={0: (0, 10), 1: (0, 4)},
        max_timestamps={0: 1000, 1: 900},
        commit_id="r1",
        records=14,
    )
    snaps = {
        1: snap(1, None, s1, ts=5),
        2: snap(2, 1, {"operation": "replace"}, ts=6),  # e.g. rewrite_data_files
    }
    state = state_at(snaps, 2)
    assert state.offsets == {0: 10, 1: 4} and state.snapshot_id == 1 and state.topic == "t"
    assert state.valid_through_ms == 900, "valid-through is the min over partitions of their max timestamp"
    assert state_at(snaps, None).offsets == {}


def test_overlapping_batches_are_found_even_across_non_adjacent_snapshots():
    def b(sid, ranges):
        return snap(sid, None, {KEY_BATCH: json.dumps({str(p): r for p, r in ranges.items()})})

    clean = [b(1, {0: [0, 10]}), b(2, {0: [10, 20], 1: [0, 5]}), b(3, {0: [20, 20]})]
    assert overlapping_batches(clean) == []
    dirty = [b(1, {0: [0, 100]}), b(2, {0: [10, 20]}), b(3, {0: [50, 60]})]
    pairs = {(o.first[0], o.second[0]) for o in overlapping_batches(dirty)}
    assert pairs == {(1, 2), (1, 3)}


def test_attempt_branch_names_round_trip():
    name = attempt_branch("0c634da6-d684-4040-9b5f-94cccda462b4", 1_795_239_002_673)
    a = parse_attempt(name)
    assert a.started_ms == 1_795_239_002_673 and a.token == "0c634da6_d684_4040_9b5f_94cccda462b4"
    assert parse_attempt("main") is None and parse_attempt("audit") is None


def test_the_shipped_table_declarations_load():
    from kafka_iceberg.lake_assets.component import declared_specs  # the Component of kafka_iceberg/defs/nyc

    specs = declared_specs(load_settings(env={}))
    assert {s.identifier for s in specs} == {"nyc.flights", "nyc.weather", "nyc.plane_days", "nyc.planes"}
    formats = {s.name: (s.format.type, s.format.subject(s.topic), s.columns_from_registry) for s in specs}
    assert formats["weather"] == ("avro", "nycflights13.weather-value", False)
    assert formats["plane_days"] == ("avro", "nycflights13.planes-value", True) and formats["flights"][0] == "json"
    assert (
        next(s for s in specs if s.name == "weather").format.url({"LAKE_SCHEMA_REGISTRY_URL": "http://r:1"})
        == "http://r:1"
    )
    flights = next(s for s in specs if s.name == "flights")
    assert flights.kafka_columns == ("topic", "partition", "offset", "timestamp", "key", "headers")
    assert flights.freshness.max_valid_through_age_s is None
    # the demo's event time is 2013 by design: no valid-through bound on the replayed tables
    assert next(s for s in specs if s.name == "plane_days").freshness.max_valid_through_age_s is None
    planes = next(s for s in specs if s.name == "planes")
    assert planes.upsert is not None and planes.upsert.key == ("tailnum",) and planes.upsert.cdc == "debezium"


@pytest.mark.parametrize(
    "override, message",
    [
        ({"identifier": "flat"}, "namespace.table"),
        ({"format": "xml"}, "is not supported"),
        (
            {
                "format": {"type": "avro"},
                "schema": "from_registry",
                "key_format": {"type": "avro", "subject_strategy": "record_name"},
            },
            "needs key_format.record_name",
        ),
        ({"format": "json", "schema": "from_registry"}, "needs a registry format"),
        ({"schema": [{"name": "x", "type": "uuid"}]}, "unsupported type"),
        ({"partition_by": ["days(nope)"]}, "unknown column 'nope'"),
        ({"max_records_per_partition": 0}, "must be positive"),
        ({"starting_position": "yesterday"}, "starting_position"),
        ({"unknown_fields": "fail"}, "unknown_fields"),
        ({"colour": "blue"}, "unknown keys"),
        ({"schema": [{"name": "x", "type": "int", "nullable": True}]}, "schema entry 'x' has unknown keys"),
        ({"schema": [{"name": "_kafka_offset", "type": "long"}]}, "collide with Kafka metadata"),
        ({"freshness": {"max_age": "1h"}}, "freshness has unknown keys"),
        ({"max_records_per_partition": "lots"}, "whole number"),
        ({"bad_records": {"policy": "skip"}}, "bad_records.policy must be one of"),
        ({"bad_records": {"max_quarantine_rate": 2}}, "max_quarantine_rate <= 1"),
        ({"bad_records": {"dead_letter_table": "flat"}}, "dead_letter_table"),
        ({"bad_records": {"dlq": "x.y"}}, "bad_records has unknown keys"),
    ],
)
def test_invalid_declarations_name_the_problem(override, message):
    with pytest.raises(ConfigError, match=message):
        make_spec("bad", "topic", **override)


def test_bad_record_policy_defaults_and_overrides():
    spec = make_spec("t", "topic")
    assert (spec.unknown_fields, spec.bad_records.policy) == ("reject", "quarantine")
    assert spec.bad_records.dead_letter_identifier == "test.t_dead_letter"
    assert spec.bad_records.max_record_bytes == 1024 * 1024 and spec.bad_records.max_quarantine_rate == 0.01
    other = make_spec(
        "t",
        "topic",
        unknown_fields="evolve",
        bad_records={"policy": "fail", "dead_letter_table": "quarantine.t", "max_record_bytes": 10},
    )
    assert (
        other.unknown_fields,
        other.bad_records.policy,
        other.bad_records.dead_letter_identifier,
        other.bad_records.max_record_bytes,
    ) == ("evolve", "fail", "quarantine.t", 10)


def test_partition_and_offset_columns_are_always_kept():
    spec = make_spec("t", "topic", kafka_columns=["timestamp"])
    assert spec.kafka_columns == ("partition", "offset", "timestamp")


def test_starting_position_timestamp_and_durations():
    spec = make_spec("t", "topic", starting_position="2013-01-01T00:00:00Z")
    assert spec.starting_position.kind == "timestamp" and spec.starting_position.timestamp_ms == 1_356_998_400_000
    assert parse_duration_s("15m", "x") == 900 and parse_duration_s(30, "x") == 30
    with pytest.raises(ConfigError):
        parse_duration_s("soon", "x")


def test_duplicate_table_names_are_rejected(tmp_path):
    import yaml

    path = tmp_path / "tables.yaml"
    path.write_text(yaml.safe_dump({"tables": [spec_dict("a", "t1"), spec_dict("a", "t2")]}))
    with pytest.raises(ConfigError, match="name must be unique"):
        load_table_specs(path)


def test_catalog_uri_spellings():
    sqlite = catalog_from_uri("lake", "sqlite:////data/catalog.db", "file:///w")
    assert sqlite.jdbc_uri == "jdbc:sqlite:/data/catalog.db" and sqlite.is_sqlite
    pg = catalog_from_uri("lake", "postgresql://ice:s3cret@db.internal:5433/lake", "s3://b/w")
    assert pg.jdbc_uri == "jdbc:postgresql://db.internal:5433/lake"
    assert (pg.jdbc_user, pg.jdbc_password) == ("ice", "s3cret")
    assert pg.sqlalchemy_uri.startswith("postgresql+psycopg2://") and not pg.is_sqlite
    with pytest.raises(ConfigError):
        catalog_from_uri("lake", "mysql://x/y", "file:///w")
    with pytest.raises(ConfigError, match="JSON object"):
        load_settings(env={"KAFKA_CLIENT_CONFIG": "[1]"})
    with pytest.raises(ConfigError, match="LAKE_KAFKA_TIMEOUT_S must be a number"):
        load_settings(env={"LAKE_KAFKA_TIMEOUT_S": "soon"})
    assert load_settings(env={"SPARK_MASTER": " "}).spark_master == "local[*]", "empty means unset"


def test_demo_records_carry_event_time_in_ms_since_epoch():
    from devtools.demo.data import load_frame, to_records

    weather = load_frame("weather").head(3)
    records = list(to_records("weather", weather))
    key, value, ts = records[0]
    assert key == b"EWR"
    assert json.loads(value)["time_hour"] == "2013-01-01T06:00:00Z"
    assert ts == 1_357_020_000_000, "2013-01-01T06:00:00Z in ms since epoch"
    flights = load_frame("flights").head(1)
    ((_, value, _),) = to_records("flights", flights)
    assert json.loads(value)["dep_time"] == 517, "nullable integer columns stay integers in JSON"


def test_crash_hooks_name_only_known_points_and_do_nothing_unless_asked():
    from devtools.rehearsal.faults import env_crash_hook, kill_at
    from kafka_iceberg.batch.context import CRASH_POINTS, no_crash

    assert CRASH_POINTS == ("after_branch", "after_read", "after_write", "after_publish")
    with pytest.raises(ValueError, match="unknown crash point"):
        kill_at("after_lunch")
    with pytest.raises(ValueError, match="unknown crash point"):
        env_crash_hook({"LAKE_CRASH_AT": "nowhere"})
    hook = env_crash_hook({})
    for point in CRASH_POINTS:  # returns: this process is still here
        hook(point)
        no_crash(point)
    kill_at("after_publish")("after_write")  # another point than the one asked for


def test_the_driver_parses_on_the_local_masters_cores():
    from kafka_iceberg.batch.read import local_cores

    assert (local_cores("local[2]"), local_cores("local"), local_cores("spark://h:7077")) == (2, 1, 1)
    assert local_cores("local[*]") == (os.cpu_count() or 1)
