"""The read path of downstream assets (kafka_iceberg.resources.LakeTableReader) against a table
written by the real write path (Dagster table asset, real Spark, real catalog, real broker), and
the downstream asset's refresh through its AutomationCondition."""

import uuid
from pathlib import Path

import pytest
from dagster import (
    AssetExecutionContext,
    AssetKey,
    AssetMaterialization,
    DagsterInstance,
    DefaultSensorStatus,
    Definitions,
    MaterializeResult,
    asset,
    evaluate_automation_conditions,
    materialize,
)

from devtools.demo.data import produce
from kafka_iceberg.batch.pipeline import run_micro_batch
from kafka_iceberg.errors import ConfigError
from kafka_iceberg.lake_assets.analytics import KEY as DEMO_DOWNSTREAM
from kafka_iceberg.lake_assets.analytics import REFRESH, refresh_sensor
from kafka_iceberg.lake_assets.tables import MICRO_BATCHES, table_asset, table_key, topic_asset
from kafka_iceberg.resources import LakeTableReader, default_resources, source_snapshots
from kafka_iceberg.resources.reader import SOURCE_SNAPSHOTS_METADATA, recorded_snapshot_id
from tests.helpers import event_records, make_spec


def _slot(instance, name: str) -> str:
    instance.add_dynamic_partitions(MICRO_BATCHES.name, [name])
    return name


def _downstream(spec, seen: list, spark, snapshot_id: int | None = None, automation_condition=None):
    """A downstream asset that reads ``spec``'s table through the reader as Arrow, DuckDB and Spark."""

    @asset(
        key=AssetKey(["lake", "derived", f"{spec.name}_count"]),
        deps=[table_key(spec)],
        automation_condition=automation_condition,
    )
    def count_rows(context: AssetExecutionContext, lake_reader: LakeTableReader) -> MaterializeResult:
        snap = lake_reader.snapshot(context, table_key(spec), snapshot_id=snapshot_id)
        arrow = snap.to_arrow(columns=("id",))
        duck = snap.to_duckdb().aggregate("count(*) AS n, count(DISTINCT id) AS ids").fetchone()
        spark_rows = snap.to_spark(spark).count()
        seen.append((snap, arrow.num_rows, duck, spark_rows))
        return MaterializeResult(metadata=source_snapshots(snap))

    return count_rows


def test_a_downstream_asset_reads_the_snapshot_its_upstream_recorded(
    settings, kafka_config, kafka, catalog, spark, unique, topic_factory
):
    topic = topic_factory(unique, partitions=1)
    produce(kafka_config, topic, event_records(range(150)))
    spec = make_spec(unique, topic, max_records_per_partition=100)
    seen: list = []
    downstream = _downstream(spec, seen, spark)
    assets = [topic_asset(spec), table_asset(spec), downstream]
    resources = default_resources(settings)
    instance = DagsterInstance.ephemeral()

    first = materialize(
        assets, resources=resources, instance=instance, selection=[table_key(spec)], partition_key=_slot(instance, "s1")
    )
    recorded = recorded_snapshot_id(first.get_asset_materialization_events()[0].materialization.metadata)
    assert recorded is not None

    # a commit outside this Dagster instance: the table's current snapshot moves on, the recorded one does not
    newer = run_micro_batch(spark, settings, spec, commit_id=str(uuid.uuid4()), kafka=kafka, catalog=catalog)
    assert newer.snapshot_id not in (None, recorded)
    assert catalog.load_table(spec.identifier).current_snapshot().snapshot_id == newer.snapshot_id

    run = materialize(assets, resources=resources, instance=instance, selection=[downstream.key])
    snap, arrow_rows, (duck_rows, duck_ids), spark_rows = seen[-1]
    assert (snap.snapshot_id, snap.pinned_by, snap.partition) == (recorded, "materialization", "s1")
    assert snap.run_id == first.run_id
    assert arrow_rows == duck_rows == duck_ids == spark_rows == 100, "the 100 records of the recorded micro-batch"
    md = run.get_asset_materialization_events()[0].materialization.metadata
    assert md[SOURCE_SNAPSHOTS_METADATA].value == {spec.identifier: str(recorded)}

    # the next micro-batch, in another slot, is recorded and read; one that commits nothing is passed over
    produce(kafka_config, topic, event_records(range(150, 180)))
    second = materialize(
        assets, resources=resources, instance=instance, selection=[table_key(spec)], partition_key=_slot(instance, "s2")
    )
    latest = recorded_snapshot_id(second.get_asset_materialization_events()[0].materialization.metadata)
    empty = materialize(assets, resources=resources, instance=instance, selection=[table_key(spec)], partition_key="s1")
    assert recorded_snapshot_id(empty.get_asset_materialization_events()[0].materialization.metadata) is None
    run = materialize(assets, resources=resources, instance=instance, selection=[downstream.key])
    snap, arrow_rows, _, spark_rows = seen[-1]
    assert (snap.snapshot_id, snap.partition, arrow_rows, spark_rows) == (latest, "s2", 180, 180)
    md = run.get_asset_materialization_events()[0].materialization.metadata
    assert md[SOURCE_SNAPSHOTS_METADATA].value == {spec.identifier: str(latest)}

    # an explicit snapshot id wins; an unknown one is an error
    pinned = _downstream(spec, seen, spark, snapshot_id=newer.snapshot_id)
    materialize([pinned], resources=resources, instance=instance)
    assert (seen[-1][0].pinned_by, seen[-1][1]) == ("argument", 150)
    with pytest.raises(ConfigError, match="has no snapshot 42"):
        LakeTableReader(catalog=resources["lake_catalog"]).snapshot(None, spec.identifier, snapshot_id=42)

    # an instance that never materialized the table: the current snapshot, with a warning
    materialize([downstream], resources=resources, instance=DagsterInstance.ephemeral())
    assert (seen[-1][0].pinned_by, seen[-1][0].snapshot_id, seen[-1][1]) == ("current", latest, 180)


def test_the_downstream_asset_refreshes_when_a_table_commits(settings, kafka_config, spark, unique, topic_factory):
    """The demo's AutomationCondition (:data:`REFRESH`) on a downstream asset of a real table asset,
    evaluated as the automation sensor does: nothing before the table exists, one request after
    each micro-batch commit (any slot), none once the downstream caught up."""
    topic = topic_factory(unique, partitions=1)
    produce(kafka_config, topic, event_records(range(30)))
    spec = make_spec(unique, topic)
    seen: list = []
    downstream = _downstream(spec, seen, spark, automation_condition=REFRESH)
    assets = [topic_asset(spec), table_asset(spec), downstream]
    defs = Definitions(assets=assets, resources=default_resources(settings))
    resources = default_resources(settings)
    instance = DagsterInstance.ephemeral()

    def requested(cursor):
        result = evaluate_automation_conditions(defs=defs, instance=instance, cursor=cursor)
        assert result.get_num_requested(table_key(spec)) == 0, "the table assets have no condition"
        return ({downstream.key} if result.get_num_requested(downstream.key) else set()), result.cursor

    keys, cursor = requested(None)
    assert keys == set(), "no table yet: nothing to refresh"
    materialize(
        assets, resources=resources, instance=instance, selection=[table_key(spec)], partition_key=_slot(instance, "s1")
    )
    keys, cursor = requested(cursor)
    assert keys == {downstream.key}
    materialize(assets, resources=resources, instance=instance, selection=[downstream.key])
    keys, cursor = requested(cursor)
    assert keys == set(), "caught up"
    produce(kafka_config, topic, event_records(range(30, 40)))
    materialize(
        assets, resources=resources, instance=instance, selection=[table_key(spec)], partition_key=_slot(instance, "s2")
    )
    keys, cursor = requested(cursor)
    assert keys == {downstream.key}


def test_the_downstream_asset_refreshes_after_worker_commits_without_a_slot():
    """Worker runs log a table's commits as materializations without a micro-batch slot: :data:`REFRESH`
    requests the downstream asset once every table has one (a slot's or not), and again after each commit."""
    tables = [AssetKey(["lake", "ui", name]) for name in ("a", "b")]
    upstream = [asset(key=key, partitions_def=MICRO_BATCHES)(lambda: None) for key in tables]
    down = asset(key=["lake", "ui", "down"], deps=tables, automation_condition=REFRESH)(lambda: None)
    defs = Definitions(assets=[*upstream, down])
    instance = DagsterInstance.ephemeral()
    cursor = None

    def commit(key: AssetKey | None, partition: str | None = None) -> bool:
        nonlocal cursor
        if key is not None:
            instance.report_runless_asset_event(AssetMaterialization(asset_key=key, partition=partition))
        result = evaluate_automation_conditions(defs=defs, instance=instance, cursor=cursor)
        cursor = result.cursor
        return result.get_num_requested(down.key) == 1

    assert not commit(tables[0]), "one table has no commit yet"
    assert commit(tables[1]), "both tables committed (worker runs: no slot)"
    assert not commit(None), "nothing new"
    assert commit(tables[0]), "a worker run's commit"
    assert not commit(None)
    assert commit(tables[1], _slot(instance, "s1")), "a micro-batch slot's commit"


def test_the_code_location_refreshes_the_demo_downstream_asset_by_a_running_sensor(tmp_path):
    import yaml

    from kafka_iceberg.lake_assets.definitions import defs

    sensor = defs.resolve_sensor_def("lake_downstream_automation")
    assert sensor.default_status == DefaultSensorStatus.RUNNING
    assert defs.resolve_assets_def(DEMO_DOWNSTREAM).automation_conditions_by_key[DEMO_DOWNSTREAM] is REFRESH
    assert sensor.asset_selection.resolve(defs.resolve_asset_graph()) == {DEMO_DOWNSTREAM}
    # the instance `make dev` runs (the checkout's dagster.yaml) runs the asset daemon, which evaluates the sensor
    overrides = yaml.safe_load((Path(__file__).resolve().parents[1] / "dagster.yaml").read_text())
    with DagsterInstance.local_temp(str(tmp_path), overrides=overrides) as instance:
        assert "ASSET" in instance.get_required_daemon_types() and instance.auto_materialize_use_sensors
    assert refresh_sensor([DEMO_DOWNSTREAM]).name == "lake_downstream_automation"
