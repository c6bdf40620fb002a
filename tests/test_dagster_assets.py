"""The Dagster layer: a declared table materialized as an asset, with its two checks, in a real
Dagster instance (ephemeral), real Spark, the real catalog and the real broker."""

from __future__ import annotations

import time

from dagster import AssetCheckKey, AssetSelection, DagsterInstance, materialize

from devtools.demo.data import produce
from kafka_iceberg.catalog.tables import load_catalog
from kafka_iceberg.lake_assets.tables import MICRO_BATCHES, table_asset, table_checks, table_key, topic_asset
from kafka_iceberg.resources import default_resources
from tests.helpers import event_records, make_spec


def _checks_by_name(result):
    return {ev.check_name: ev for ev in result.get_asset_check_evaluations()}


def _slot(instance, name: str) -> str:
    """Add the micro-batch slot ``name`` (a partition key of the table assets) and return it."""
    instance.add_dynamic_partitions(MICRO_BATCHES.name, [name])
    return name


def test_table_asset_materializes_micro_batches_with_metadata_and_checks(
    settings, kafka_config, spark, unique, topic_factory
):
    topic = topic_factory(unique, partitions=2)
    produce(kafka_config, topic, event_records(range(250)))
    spec = make_spec(
        unique,
        topic,
        max_records_per_partition=100,
        freshness={"max_snapshot_age": "1s", "max_valid_through_age": "none"},
    )
    assets = [topic_asset(spec), table_asset(spec), *table_checks(spec)]
    resources = default_resources(settings)
    instance = DagsterInstance.ephemeral()

    first = materialize(
        assets, resources=resources, instance=instance, selection=[table_key(spec)], partition_key=_slot(instance, "s1")
    )
    assert first.success
    md = first.get_asset_materialization_events()[0].materialization.metadata
    assert md["records"].value == 200, "bound 100 per partition over 2 partitions"
    assert md["lag_after_commit"].value == 50
    assert set(md["offset_ranges"].value) == {"0", "1"}
    for key in (
        "kafka_bytes",
        "data_files_added",
        "snapshot_id",
        "phase_read_s",
        "phase_write_s",
        "phase_publish_s",
        "valid_through",
        "dagster/row_count",
    ):
        assert key in md, key
    checks = _checks_by_name(first)
    assert checks["duplicate_free"].passed, checks["duplicate_free"].description
    after_first = len(load_catalog(settings.catalog).load_table(spec.identifier).metadata.snapshots)
    second = materialize(assets, resources=resources, instance=instance, partition_key=_slot(instance, "s2"))
    assert second.success
    md2 = second.get_asset_materialization_events()[0].materialization.metadata
    assert md2["records"].value == 50 and md2["lag_after_commit"].value == 0
    assert md2["snapshot_count"].value == after_first > md["snapshot_count"].value, "the snapshots it planned on"
    checks = _checks_by_name(second)
    assert checks["duplicate_free"].passed and checks["freshness"].passed

    # a slot is not an offset range: re-running the first slot ingests what is next (nothing), never its old range
    third = materialize(assets, resources=resources, instance=instance, partition_key="s1")
    md3 = third.get_asset_materialization_events()[0].materialization.metadata
    assert md3["records"].value == 0 and md3["snapshot_id"].value.startswith("none")
    assert _checks_by_name(third)["duplicate_free"].passed
    slots = [e.partition for e in (first, second, third) for e in e.get_asset_materialization_events()]
    assert slots == ["s1", "s2", "s1"]


def test_freshness_check_fails_when_the_table_lags_past_its_threshold(
    settings, kafka_config, spark, unique, topic_factory
):
    topic = topic_factory(unique, partitions=1)
    produce(kafka_config, topic, event_records(range(20)))
    spec = make_spec(unique, topic, freshness={"max_snapshot_age": "1s", "max_valid_through_age": "none"})
    assets = [topic_asset(spec), table_asset(spec), *table_checks(spec)]
    resources = default_resources(settings)
    instance = DagsterInstance.ephemeral()
    assert materialize(
        assets, resources=resources, instance=instance, selection=[table_key(spec)], partition_key=_slot(instance, "s1")
    ).success

    produce(kafka_config, topic, event_records(range(20, 30)))
    time.sleep(1.5)
    freshness_key = AssetCheckKey(table_key(spec), "freshness")
    run = materialize(assets, resources=resources, instance=instance, selection=AssetSelection.checks(freshness_key))
    (evaluation,) = run.get_asset_check_evaluations()
    assert not evaluation.passed
    assert "10 records of lag" in evaluation.description
    assert evaluation.metadata["lag_records"].value == 10


def test_the_code_location_passes_dagster_validation(tmp_path):
    """What `dagster dev` loads: the whole workspace, validated by Dagster itself (every job,
    asset, check, sensor and schedule name resolves without conflicts)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    checkout = Path(__file__).resolve().parents[1]
    out = subprocess.run(
        [str(Path(sys.executable).with_name("dagster")), "definitions", "validate", "-w", "workspace.yaml"],
        cwd=checkout,
        env={**os.environ, "DAGSTER_HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    assert "Validation successful for code location kafka_iceberg.lake_assets.definitions" in out.stdout + out.stderr
