"""Backfills of micro-batches: a large backlog becomes one Dagster asset backfill of bounded runs.

The end-to-end test runs Dagster's own sensor daemon and backfill daemon iterations in-process
against a one-table code location (tests/backfill_location.py), with runs launched
synchronously in this process (``SyncInMemoryRunLauncher``), on the real broker, real Spark
and the real catalog.
"""

from __future__ import annotations

import json
import logging
import math
import random
import uuid
from pathlib import Path

import pytest
from dagster import (
    DagsterEventType,
    DagsterInstance,
    EventRecordsFilter,
    RunsFilter,
    build_sensor_context,
    instance_for_test,
)
from dagster._core.execution.backfill import BulkActionStatus
from dagster._core.remote_origin import InProcessCodeLocationOrigin
from dagster._core.storage.tags import BACKFILL_ID_TAG
from dagster._core.test_utils import create_test_daemon_workspace_context
from dagster._core.types.loadable_target_origin import LoadableTargetOrigin
from dagster._core.workspace.load_target import InProcessWorkspaceLoadTarget
from dagster._daemon.backfill import execute_backfill_iteration
from dagster._daemon.sensor import execute_sensor_iteration

from devtools.demo.data import produce
from kafka_iceberg.batch.pipeline import run_micro_batch
from kafka_iceberg.batch.planning import offset_lag
from kafka_iceberg.catalog.tables import read_state
from kafka_iceberg.lake_assets.backfill import (
    MAX_BACKFILL_BATCHES,
    RING_SLOTS,
    TABLE_TAG,
    choose_slots,
    new_slot_keys,
    plan_catch_up,
    ring_slot_keys,
)
from kafka_iceberg.lake_assets.tables import MICRO_BATCHES, table_key
from kafka_iceberg.resources import default_resources
from kafka_iceberg.sensors.lag import lag_sensor
from tests.helpers import event_records, make_spec, spec_dict, table_rows

LOCATION = Path(__file__).with_name("backfill_location.py")
SYNC_INSTANCE = {
    # runs start when submitted, and execute in this process before submit_run returns
    "run_coordinator": {"module": "dagster._core.run_coordinator", "class": "DefaultRunCoordinator"},
    "run_launcher": {
        "module": "dagster._core.launcher.sync_in_memory_run_launcher",
        "class": "SyncInMemoryRunLauncher",
    },
}


def test_slots_are_a_ring_reused_least_recently_used_first():
    ring = ring_slot_keys()
    assert len(ring) == RING_SLOTS == MAX_BACKFILL_BATCHES and ring[0] == "slot-00"
    assert new_slot_keys(3, (RING_SLOTS - 1) * 1000) == [ring[-1], ring[0], ring[1]], "wraps around"
    assert choose_slots({}, {}, 2) == ["slot-00", "slot-01"], "never used first, in ring order"
    used = {slot: i for i, slot in enumerate(ring)}  # every slot materialized, slot-00 longest ago
    assert choose_slots(used, {}, 1) == ["slot-00"]
    assert choose_slots(used, {"slot-07": RING_SLOTS + 1}, 2) == ["slot-07", "slot-00"], "a failed slot comes first"
    assert choose_slots({**used, "slot-07": RING_SLOTS + 2}, {"slot-07": RING_SLOTS + 1}, 1) == ["slot-00"]
    with pytest.raises(ValueError):
        choose_slots({}, {}, RING_SLOTS + 1)


def test_partitions_stay_bounded_over_500_micro_batches_of_100_tables():
    """500 micro-batches for each of 100 tables (sensor ticks on a simulated clock, 1 in 20 runs
    failing): the slots every tick requests, as the sensor chooses them, stay within one ring."""
    rng = random.Random(14)
    materialized = {t: {} for t in range(100)}
    failed = {t: {} for t in range(100)}
    partitions: set[str] = set()  # what the ticks' AddDynamicPartitionsRequests add
    seq = 0
    for _tick in range(500):
        for t in range(100):
            (slot,) = choose_slots(materialized[t], failed[t], 1)
            partitions.add(slot)
            seq += 1
            if rng.random() < 0.05:
                failed[t][slot] = seq
                continue
            materialized[t][slot] = seq
            outstanding = [s for s, f in failed[t].items() if f > materialized[t].get(s, -1)]
            assert outstanding == [], "a failed micro-batch is superseded by the next successful one"
    assert len(partitions) == RING_SLOTS == len(set(ring_slot_keys()) | partitions)
    assert all(len(m) == RING_SLOTS for m in materialized.values()), "each table's own ring, all materialized"


def test_next_micro_batch_supersedes_a_failed_one_in_dagster(unique):
    """Real runs on an ephemeral instance: a failed micro-batch's slot is the next one used, and
    Dagster's own partition status (what the UI shows) then has no failed partition."""
    from dagster import asset, materialize
    from dagster._core.storage.partition_status_cache import get_and_update_asset_status_cache_value

    from kafka_iceberg.lake_assets.backfill import next_slots

    spec = make_spec(unique, "t.ring")
    fail = {"now": False}

    @asset(key=table_key(spec), partitions_def=MICRO_BATCHES)
    def _table():
        if fail["now"]:
            raise RuntimeError("simulated broker outage")

    instance = DagsterInstance.ephemeral()

    def run(expect_ok: bool) -> str:
        (slot,) = next_slots(instance, spec, 1)
        instance.add_dynamic_partitions(MICRO_BATCHES.name, [slot])
        result = materialize([_table], instance=instance, partition_key=slot, raise_on_error=False)
        assert result.success is expect_ok
        return slot

    first, second = run(True), run(True)
    fail["now"] = True
    broken = run(False)
    assert (first, second, broken) == ("slot-00", "slot-01", "slot-02")
    status = get_and_update_asset_status_cache_value(instance, table_key(spec), MICRO_BATCHES)
    assert set(status.deserialize_failed_partition_subsets(MICRO_BATCHES).get_partition_keys()) == {"slot-02"}
    fail["now"] = False
    assert run(True) == "slot-02", "the next micro-batch reuses the failed slot"
    status = get_and_update_asset_status_cache_value(instance, table_key(spec), MICRO_BATCHES)
    assert list(status.deserialize_failed_partition_subsets(MICRO_BATCHES).get_partition_keys()) == []
    assert run(True) == "slot-03" and len(instance.get_dynamic_partitions(MICRO_BATCHES.name)) == 4


def test_catch_up_plan_counts_micro_batches_by_the_largest_partition_lag():
    spec = make_spec("plan", "events.plan", max_records_per_partition=100)
    within = plan_catch_up(spec, {0: 100, 1: 40}, has_state=True)
    assert (within.batches, within.needs_backfill, within.max_partition_lag, within.total_lag) == (1, False, 100, 140)
    large = plan_catch_up(spec, {0: 120, 1: 301, 2: 301}, has_state=True)
    assert (large.batches, large.partition, large.needs_backfill, large.capped) == (4, 1, True, False)
    capped = plan_catch_up(spec, {0: 100 * (MAX_BACKFILL_BATCHES + 5)}, has_state=True)
    assert (capped.batches, capped.capped) == (MAX_BACKFILL_BATCHES, True)
    assert plan_catch_up(spec, {0: 0}, has_state=True).partition is None
    # a table that starts at "latest" and never committed: one run resolves its starting offsets first
    latest = make_spec("plan", "events.plan", max_records_per_partition=100, starting_position="latest")
    assert plan_catch_up(latest, {0: 1000}, has_state=False).batches == 1
    assert plan_catch_up(spec, {0: 1000}, has_state=False).batches == 10


def _slot_of(record) -> str:
    return record.event_log_entry.dagster_event.partition


def test_large_backlog_becomes_one_backfill_of_bounded_runs_that_ends_caught_up_exactly_once(
    spark,
    settings,
    lake_env,
    kafka,
    kafka_config,
    catalog,
    unique,
    topic_factory,
    slack,
    slack_alerts,
    monkeypatch,
    caplog,
):
    caplog.set_level(logging.INFO, logger="kafka_iceberg.sensors.lag")
    for k, v in lake_env.items():
        monkeypatch.setenv(k, v)
    topic = topic_factory(unique, partitions=2)
    raw = spec_dict(unique, topic, max_records_per_partition=100, lag={"max_offset_lag": 300, "max_interval": "1h"})
    monkeypatch.setenv("LAKE_TEST_TABLE_JSON", json.dumps(raw))
    spec = make_spec(unique, topic, max_records_per_partition=100, lag={"max_offset_lag": 300, "max_interval": "1h"})
    key = table_key(spec)

    produce(kafka_config, topic, event_records(range(60)))
    run_micro_batch(spark, settings, spec, commit_id=str(uuid.uuid4()), kafka=kafka, catalog=catalog)
    before = read_state(catalog, spec.identifier)
    produce(kafka_config, topic, event_records(range(60, 760)))  # the backlog: 700 records over 2 partitions
    lag = offset_lag(kafka.watermarks(topic), read_state(catalog, spec.identifier).offsets)
    expected_batches = math.ceil(max(lag.values()) / 100)
    assert sum(lag.values()) == 700 and expected_batches >= 4

    origin = InProcessCodeLocationOrigin(
        LoadableTargetOrigin(
            python_file=str(LOCATION), attribute="defs", working_directory=str(LOCATION.parent.parent)
        ),
        location_name="backfill_test",
    )
    logger = logging.getLogger("test_backfill")
    with (
        instance_for_test(overrides=SYNC_INSTANCE) as instance,
        create_test_daemon_workspace_context(InProcessWorkspaceLoadTarget([origin]), instance) as workspace,
    ):
        # 1. one sensor tick through the sensor daemon: one backfill, no single run
        list(execute_sensor_iteration(workspace, logger, None, None))
        (backfill,) = instance.get_backfills()
        assert backfill.status == BulkActionStatus.REQUESTED
        assert backfill.tags[TABLE_TAG] == spec.identifier and "offset lag 700" in backfill.tags["lake/trigger"]
        assert list(backfill.asset_selection) == [key]
        slots = sorted(ap.partition_key for ap in backfill.asset_backfill_data.target_subset.iterate_asset_partitions())
        assert len(slots) == expected_batches
        assert sorted(instance.get_dynamic_partitions(MICRO_BATCHES.name)) == slots
        assert instance.get_runs() == []

        # a routine backfill (the whole backlog in one) is INFO: logged, not posted
        assert slack.messages == []
        (text,) = [r.getMessage() for r in caplog.records if "backlog_records" in r.getMessage()]
        assert spec.identifier in text and "backlog_records" in text
        assert f"backlog_records = {max(lag.values())} records in partition " in text
        assert f"{expected_batches} micro-batches of 100 per partition" in text
        assert f"launched a backfill of {expected_batches} runs" in text
        assert f"/assets/lake/test/{unique}" in text

        # 2. while the backfill is in progress, another tick requests nothing (and posts nothing)
        resources = {
            k: v for k, v in default_resources(settings).items() if k in ("lake_kafka", "lake_catalog", "lake_slack")
        }
        busy_tick = lag_sensor(spec)(build_sensor_context(instance=instance, resources=resources))
        assert busy_tick.run_requests == [] and not busy_tick.dynamic_partitions_requests
        assert slack.messages == []

        # 3. the backfill daemon launches one run per slot; each run is one bounded micro-batch
        for _ in range(10):
            list(execute_backfill_iteration(workspace, logger))
            backfill = instance.get_backfill(backfill.backfill_id)
            if backfill.status != BulkActionStatus.REQUESTED:
                break
        assert backfill.status == BulkActionStatus.COMPLETED_SUCCESS, backfill.status

        runs = instance.get_runs(filters=RunsFilter(tags={BACKFILL_ID_TAG: backfill.backfill_id}))
        assert len(runs) == expected_batches and all(r.is_success for r in runs)
        assert all(r.tags[TABLE_TAG] == spec.identifier for r in runs)
        run_slots = sorted(r.tags["dagster/asset_partition_range_start"] for r in runs)
        assert run_slots == slots and all(
            r.tags["dagster/asset_partition_range_start"] == r.tags["dagster/asset_partition_range_end"] for r in runs
        )
        materializations = instance.fetch_materializations(key, limit=100, ascending=True).records
        assert sorted(_slot_of(m) for m in materializations) == slots, "one materialization per slot"
        assert len({m.run_id for m in materializations}) == expected_batches, "one run per slot"

        # in commit order, each micro-batch starts where the previous one ended, and none reads
        # more than the bound from a partition
        ends = {p: o for p, o in before.offsets.items()}  # where the micro-batch before the backfill ended
        for m in materializations:
            md = m.asset_materialization.metadata
            for p, r in md["offset_ranges"].value.items():
                assert r["end"] - r["start"] <= 100
                assert r["start"] == ends[int(p)], (
                    f"partition {p}: starts at {r['start']}, previous ended at {ends[int(p)]}"
                )
                ends[int(p)] = r["end"]
        assert md["lag_after_commit"].value == 0
        assert sum(m.asset_materialization.metadata["records"].value for m in materializations) == 700

        # caught up, every produced record exactly once
        after = read_state(catalog, spec.identifier)
        assert after.offsets == ends
        assert sum(offset_lag(kafka.watermarks(topic), after.offsets).values()) == 0
        rows = table_rows(spark, settings, spec)
        coords = [(r["_kafka_partition"], r["_kafka_offset"]) for r in rows]
        assert len(rows) == 760 and len(set(coords)) == 760 and sorted(r["id"] for r in rows) == list(range(760))

        checks = instance.get_event_records(EventRecordsFilter(event_type=DagsterEventType.ASSET_CHECK_EVALUATION))
        evaluations = [r.event_log_entry.dagster_event.event_specific_data for r in checks]
        dup = [e for e in evaluations if e.check_name == "duplicate_free"]
        assert len(dup) == expected_batches and all(e.passed for e in dup)

        # 4. caught up: the next tick requests nothing
        done = lag_sensor(spec)(build_sensor_context(instance=instance, resources=resources, cursor=busy_tick.cursor))
        assert done.run_requests == [] and done.asset_events[0].metadata["offset_lag"].value == 0
        assert slack.messages == []


def test_command_line_submits_one_backfill_per_backlog_and_refuses_a_second(
    settings, lake_env, kafka, kafka_config, unique, topic_factory, tmp_path, monkeypatch, capsys
):
    import yaml
    from dagster import DagsterInstance

    from kafka_iceberg.lake_assets.cli import main as lake

    def main(argv):
        return lake(["backfill", *argv])

    topic = topic_factory(unique, partitions=2)
    produce(kafka_config, topic, event_records(range(500)))
    tables = tmp_path / "tables.yaml"
    tables.write_text(yaml.safe_dump({"tables": [spec_dict(unique, topic, max_records_per_partition=100)]}))
    for k, v in lake_env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("LAKE_TABLES_FILE", str(tables))
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster"))
    monkeypatch.setenv("DAGSTER_UI_URL", "http://ui.example:3000")

    assert main(["--table", "no_such_table"]) == 2
    assert main(["--table", unique]) == 0
    out = capsys.readouterr().out
    instance = DagsterInstance.get()
    (backfill,) = instance.get_backfills()
    slots = sorted(ap.partition_key for ap in backfill.asset_backfill_data.target_subset.iterate_asset_partitions())
    # never committed, starts at earliest: the whole topic is the backlog
    expected = math.ceil(max(w.high - w.low for w in kafka.watermarks(topic).values()) / 100)
    assert backfill.tags[TABLE_TAG] == f"test.{unique}" and backfill.tags["lake/launched-by"] == "cli"
    assert list(backfill.asset_selection) == [table_key(make_spec(unique, topic))]
    assert sorted(instance.get_dynamic_partitions(MICRO_BATCHES.name)) == slots
    assert len(slots) == expected >= 3
    assert f"backfill {backfill.backfill_id}: test.{unique}, {len(slots)} micro-batch runs" in out
    assert f"http://ui.example:3000/runs/b/{backfill.backfill_id}" in out

    # the backfill has not run (no daemon here): a second submission is refused, --force submits
    assert main(["--table", unique, "--batches", "2"]) == 2
    assert "backfill " + backfill.backfill_id in capsys.readouterr().err
    assert main(["--table", unique, "--batches", "2", "--force"]) == 0
    assert len(instance.get_backfills()) == 2


def test_command_line_backfill_through_the_webserver_graphql(
    settings, lake_env, kafka, kafka_config, unique, topic_factory, tmp_path, monkeypatch, capsys
):
    """``lake backfill --url``: the same backfill submitted through a real ``dagster-webserver``'s
    GraphQL API (no access to the instance's storage from the command line)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    import yaml
    from dagster import DagsterInstance

    from devtools.services.devbroker import free_port
    from kafka_iceberg.lake_assets.backfill_graphql import DagsterGraphQL
    from kafka_iceberg.lake_assets.cli import main as lake

    topic = topic_factory(unique, partitions=2)
    produce(kafka_config, topic, event_records(range(300)))
    raw = spec_dict(unique, topic, max_records_per_partition=100)
    tables = tmp_path / "tables.yaml"
    tables.write_text(yaml.safe_dump({"tables": [raw]}))
    home = tmp_path / "dagster"
    home.mkdir()
    port = free_port()
    env = {**os.environ, **lake_env, "DAGSTER_HOME": str(home), "LAKE_TEST_TABLE_JSON": json.dumps(raw)}
    log = tmp_path / "webserver.log"
    web = subprocess.Popen(
        [str(Path(sys.executable).with_name("dagster-webserver")), "-f", str(LOCATION), "-h", "127.0.0.1"]
        + ["-p", str(port)],
        env=env,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240
        while True:
            try:
                if DagsterGraphQL(url, 5).query("{ assetNodes { id } }")["assetNodes"]:
                    break
            except Exception:  # noqa: BLE001 - not up yet
                pass
            assert web.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(1)
        for k, v in lake_env.items():
            monkeypatch.setenv(k, v)
        monkeypatch.setenv("LAKE_TABLES_FILE", str(tables))
        monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "elsewhere"))  # the CLI's own instance is not used
        assert lake(["backfill", "--table", unique, "--url", url, "--json"]) == 0
        row = json.loads(capsys.readouterr().out)
        assert row["url"] == f"{url}/runs/b/{row['backfill_id']}" and row["batches"] == len(row["slots"]) >= 2
        instance = DagsterInstance.from_config(str(home))
        (backfill,) = instance.get_backfills()
        assert backfill.backfill_id == row["backfill_id"]
        assert backfill.tags[TABLE_TAG] == f"test.{unique}" and backfill.tags["lake/launched-by"] == "cli"
        assert list(backfill.asset_selection) == [table_key(make_spec(unique, topic))]
        slots = sorted(ap.partition_key for ap in backfill.asset_backfill_data.target_subset.iterate_asset_partitions())
        assert slots == sorted(row["slots"]) == sorted(instance.get_dynamic_partitions(MICRO_BATCHES.name))
        assert not (tmp_path / "elsewhere").exists()
        # no daemon runs it: the webserver reports it in progress, so a second one is refused
        assert lake(["backfill", "--table", unique, "--url", url, "--batches", "1"]) == 2
        assert f"backfill {row['backfill_id']}" in capsys.readouterr().err
    finally:
        os.killpg(web.pid, signal.SIGTERM)
        try:
            web.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(web.pid, signal.SIGKILL)
            web.wait()
    down = lake(["backfill", "--table", unique, "--url", url, "--batches", "1"])
    assert down == 3, "an unreachable webserver is an unreachable component"
