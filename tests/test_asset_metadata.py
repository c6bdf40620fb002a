"""Dagster-native health and catalog metadata of the table and topic assets: FreshnessPolicy,
column schema with docs (declared, then live after schema evolution), table name, owners, tags,
code references, RetryPolicy; the topic asset's watermark and retention observations."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import yaml
from dagster import Backoff, DagsterInstance, build_sensor_context, materialize

from devtools.demo.data import produce
from kafka_iceberg.declaration.spec import load_table_specs
from kafka_iceberg.lake_assets.asset_metadata import KAFKA_COLUMN_DOCS, RETRY_POLICY, declaration_line
from kafka_iceberg.lake_assets.tables import MICRO_BATCHES, table_asset, table_key, topic_asset, topic_key
from kafka_iceberg.resources import default_resources
from kafka_iceberg.sensors.retention import retention_sensor
from tests.helpers import event_records, spec_dict


def _spec(tmp_path: Path, name: str, topic: str, **overrides):
    path = tmp_path / "tables.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "defaults": {"owners": ["team:platform"], "tags": {"domain": "test"}},
                "tables": [spec_dict("other", "t.other"), spec_dict(name, topic, **overrides)],
            }
        )
    )
    return load_table_specs(path)[1], path


def test_table_asset_definition_carries_policies_schema_owners_tags_and_code_references(tmp_path):
    spec, path = _spec(
        tmp_path,
        "meta",
        "t.meta",
        tags={"tier": "gold"},
        owners=["ana@example.com"],
        freshness={"max_snapshot_age": "2h", "max_valid_through_age": "none"},
    )
    asset_def = table_asset(spec, tables_file=path, catalog_name="lake")
    key = table_key(spec)
    (asset_spec,) = asset_def.specs
    assert asset_spec.owners == ["ana@example.com"]
    assert {k: v for k, v in asset_spec.tags.items() if not k.startswith("dagster/kind/")} == {
        "domain": "test",
        "tier": "gold",
    }
    policy = asset_spec.freshness_policy
    assert policy.fail_window.to_timedelta() == timedelta(hours=2) and policy.warn_window.to_timedelta() == timedelta(
        hours=1
    )
    md = asset_def.metadata_by_key[key]
    assert md["dagster/table_name"] == "lake.test.meta"
    columns = {c.name: c for c in md["dagster/column_schema"].schema.columns}
    assert columns["id"].type == "bigint" and not columns["id"].constraints.nullable
    assert columns["_kafka_offset"].description == KAFKA_COLUMN_DOCS["offset"]
    assert columns["amount"].constraints.nullable
    (decl, code) = md["dagster/code_references"].code_references
    assert decl.file_path == str(path.resolve()) and decl.line_number == declaration_line(path, spec)
    assert path.read_text().splitlines()[decl.line_number - 1].strip().lstrip("- ") == "name: meta"
    assert code.file_path.endswith("lake_assets/tables.py")
    retry = asset_def.op.retry_policy
    assert retry == RETRY_POLICY and retry.max_retries == 3 and retry.backoff == Backoff.EXPONENTIAL


def test_materialization_updates_the_column_schema_after_evolution_and_topic_is_observed(
    settings, kafka_config, spark, unique, topic_factory, tmp_path
):
    import json

    topic = topic_factory(unique, partitions=1)
    produce(kafka_config, topic, event_records(range(20)))
    spec, path = _spec(
        tmp_path,
        unique,
        topic,
        unknown_fields="evolve",
        schema=[
            {"name": "id", "type": "long", "required": True, "doc": "event id"},
            {"name": "event_time", "type": "timestamp", "required": True},
        ],
    )
    resources = default_resources(settings)
    instance = DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(MICRO_BATCHES.name, ["slot-00"])
    result = materialize(
        [topic_asset(spec), table_asset(spec, tables_file=path)],
        resources=resources,
        instance=instance,
        selection=[table_key(spec)],
        partition_key="slot-00",
    )
    assert result.success
    md = result.get_asset_materialization_events()[0].materialization.metadata
    columns = {c.name: c for c in md["dagster/column_schema"].schema.columns}
    assert {"name", "amount"} <= set(columns), "columns added by evolution are in the schema"
    assert columns["id"].description == "event id" and columns["name"].constraints.nullable
    assert md["dagster/table_name"].value == f"{settings.catalog.name}.test.{unique}"

    observed = retention_sensor(spec)(
        build_sensor_context(
            instance=instance,
            resources={k: v for k, v in resources.items() if k in ("lake_kafka", "lake_catalog", "lake_slack")},
        )
    )
    (topic_obs,) = [e for e in observed.asset_events if e.asset_key == topic_key(spec)]
    assert topic_obs.metadata["high_watermarks"].value == {"0": 20}
    assert topic_obs.metadata["retention_ms"].value == json.loads(json.dumps(topic_obs.metadata["retention_ms"].value))
    assert topic_obs.metadata["partitions"].value == 1
