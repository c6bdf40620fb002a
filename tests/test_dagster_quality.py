"""The quarantine check and the schema-change alert through Dagster (real Spark, catalog, broker),
with Slack messages recorded by the local server."""

from __future__ import annotations

import json

from dagster import DagsterInstance, materialize

from devtools.demo.data import produce
from kafka_iceberg.lake_assets.quality import quarantine_check
from kafka_iceberg.lake_assets.tables import MICRO_BATCHES, table_asset, table_key, topic_asset
from kafka_iceberg.ops.alerts import pick_measure
from kafka_iceberg.resources import default_resources
from tests.helpers import BASE_TS_MS, event, event_records, make_spec


def _slot(instance, name: str) -> str:
    instance.add_dynamic_partitions(MICRO_BATCHES.name, [name])
    return name


def test_quarantine_check_and_schema_alerts_reach_slack(
    settings, kafka_config, spark, unique, topic_factory, slack, slack_alerts, monkeypatch
):
    monkeypatch.setenv("DAGSTER_UI_URL", "http://ui.test")
    topic = topic_factory(unique, partitions=1)
    produce(kafka_config, topic, event_records(range(20)))
    produce(
        kafka_config,
        topic,
        [
            (b"x", json.dumps({**event(20), "tier": 2}).encode(), BASE_TS_MS),
            (b"y", json.dumps({**event(21), "amount": "lots"}).encode(), BASE_TS_MS),
        ],
    )
    spec = make_spec(unique, topic, unknown_fields="evolve", bad_records={"max_quarantine_rate": 0.5})
    assets = [topic_asset(spec), table_asset(spec), quarantine_check(spec)]
    instance = DagsterInstance.ephemeral()
    result = materialize(
        assets, resources=default_resources(settings), instance=instance, partition_key=_slot(instance, "s1")
    )
    assert result.success
    md = result.get_asset_materialization_events()[0].materialization.metadata
    assert (md["records_read"].value, md["records"].value, md["records_quarantined"].value) == (22, 21, 1)
    assert md["schema_changes"].value == [{"column": "tier", "type": "bigint"}]
    (check,) = result.get_asset_check_evaluations()
    assert check.check_name == "quarantine" and not check.passed
    assert "1 records blocked by the table schema" in check.description
    texts = [m["text"] for m in slack.messages]
    evolved = [t for t in texts if "schema_changes = +tier bigint" in t]
    blocked = [t for t in texts if "(check quarantine)" in t]
    assert len(evolved) == 1 and len(blocked) == 1, texts
    assert spec.identifier in blocked[0] and "blocked_by_schema = 1 records" in blocked[0]
    assert f"http://ui.test/assets/{'/'.join(table_key(spec).path)}" in blocked[0]


def test_pick_measure_for_the_quarantine_check():
    figures = {
        "read": 55,
        "quarantined": 5,
        "quarantine_rate": 0.0909,
        "max_quarantine_rate": 0.05,
        "kinds": {"malformed": 5},
    }
    assert pick_measure("quarantine", figures) == ("quarantine_rate", "9.09% (5 of 55 records; threshold 5.00%)")
    assert pick_measure("quarantine", {**figures, "kinds": {"schema": 2}}) == ("blocked_by_schema", "2 records")
