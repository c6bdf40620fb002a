"""Streaming runs (lake_assets/streaming.py): a sensor-launched run commits micro-batch after
micro-batch while lag remains, each commit its own materialization; a backfill run or a run
launched by hand commits one. Real Dagster instance (ephemeral), real Spark, catalog and broker."""

from __future__ import annotations

import pytest
from dagster import DagsterInstance, materialize

from devtools import duck
from devtools.demo.data import produce
from kafka_iceberg.catalog.tables import load_catalog
from kafka_iceberg.config.settings import load_settings
from kafka_iceberg.errors import ConfigError
from kafka_iceberg.lake_assets.streaming import stream_budget_s
from kafka_iceberg.lake_assets.tables import MICRO_BATCHES, table_asset, table_key, topic_asset
from kafka_iceberg.resources import default_resources
from tests.helpers import event_records, make_spec


def test_only_sensor_runs_outside_backfills_stream():
    budget_s = load_settings(env={"LAKE_STREAM_BUDGET_S": "30"}).stream.budget_s
    assert stream_budget_s({"dagster/sensor_name": "flights_lag"}, budget_s) == 30.0
    assert stream_budget_s({"dagster/sensor_name": "flights_lag", "dagster/backfill": "abc"}, budget_s) == 0.0
    assert stream_budget_s({}, budget_s) == 0.0, "a run launched by hand or by a job commits one micro-batch"
    assert (
        stream_budget_s({"dagster/sensor_name": "x"}, load_settings(env={"LAKE_STREAM_BUDGET_S": "0"}).stream.budget_s)
        == 0.0
    )
    with pytest.raises(ConfigError, match="LAKE_STREAM_BUDGET_S"):
        load_settings(env={"LAKE_STREAM_BUDGET_S": "-1"})


def _distinct_rows(settings, spec) -> tuple[int, int]:
    table = load_catalog(settings.catalog).load_table(spec.identifier)
    return (
        duck.connect()
        .execute(
            f"SELECT count(*), count(DISTINCT (_kafka_partition, _kafka_offset)) FROM {duck.scan_sql(table.metadata_location)}"
        )
        .fetchone()
    )


def test_a_sensor_run_commits_until_no_lag_is_left_each_commit_a_materialization(
    settings, kafka_config, spark, unique, topic_factory, monkeypatch
):
    monkeypatch.setenv("LAKE_STREAM_BUDGET_S", "300")  # read by the run's settings (settings_for)
    monkeypatch.setenv("LAKE_STREAM_IDLE_S", "0")
    topic = topic_factory(unique, partitions=2)
    produce(kafka_config, topic, event_records(range(130)))
    spec = make_spec(unique, topic, max_records_per_partition=25)  # at most 50 records per micro-batch
    assets = [topic_asset(spec), table_asset(spec)]
    instance = DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(MICRO_BATCHES.name, ["s1", "s2"])
    resources = default_resources(settings)

    run = materialize(
        assets,
        resources=resources,
        instance=instance,
        selection=[table_key(spec)],
        partition_key="s1",
        tags={"dagster/sensor_name": f"{spec.name}_lag"},
    )
    assert run.success
    events = [e.materialization for e in run.get_asset_materialization_events()]
    records = [m.metadata["records"].value for m in events]
    assert len(records) >= 3 and sum(records) == 130 and max(records) <= 50, (
        f"one materialization per commit: {records}"
    )
    assert [m.metadata["stream_commit"].value for m in events] == list(range(1, len(events) + 1))
    assert {m.partition for m in events} == {"s1"}
    assert len({m.metadata["snapshot_id"].value for m in events}) == len(events)
    assert events[-1].metadata["lag_after_commit"].value == 0
    assert _distinct_rows(settings, spec) == (130, 130)

    # a run not launched by a sensor (by hand, a job, a backfill) still commits exactly one micro-batch
    produce(kafka_config, topic, event_records(range(130, 250)))
    single = materialize(
        assets, resources=resources, instance=instance, selection=[table_key(spec)], partition_key="s2"
    )
    (one,) = [e.materialization.metadata for e in single.get_asset_materialization_events()]
    assert 0 < one["records"].value <= 50 and one["lag_after_commit"].value == 120 - one["records"].value
    assert _distinct_rows(settings, spec) == (130 + one["records"].value,) * 2
