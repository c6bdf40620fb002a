"""Retention headroom: the pure evaluation, and the sensor against the real broker as retention
shrinks and records are deleted under the table's committed offset, with the Slack alerts."""

from __future__ import annotations

import json
import time
import uuid

import pytest
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource
from dagster import DagsterInstance, build_sensor_context

from devtools.demo.data import produce
from kafka_iceberg.batch.pipeline import TableWriter, run_micro_batch
from kafka_iceberg.batch.planning import Watermarks
from kafka_iceberg.errors import DataLossError, LakeError
from kafka_iceberg.ops.retention import RetentionPolicy, evaluate
from kafka_iceberg.resources import default_resources
from kafka_iceberg.sensors.retention import retention_sensor
from kafka_iceberg.state import state_at
from tests.helpers import current_view, delete_records, event_records, make_spec, table_rows

HOUR_MS = 3_600_000


def test_headroom_ratio_and_status():
    now = 10 * HOUR_MS
    policy = RetentionPolicy(warn_headroom_s=3 * 3600, error_headroom_s=3600, warn_ratio=0.5, error_ratio=0.9)
    wm = {0: Watermarks(0, 100), 1: Watermarks(0, 100), 2: Watermarks(50, 100), 3: Watermarks(0, 100)}
    committed = {0: 100, 1: 90, 2: 40, 3: 0}
    oldest = {1: now - 2 * HOUR_MS, 3: now - 1 * HOUR_MS}
    status, parts = evaluate(wm, committed, 4 * HOUR_MS, oldest, now, policy)
    by = {p.partition: p for p in parts}
    assert by[0].status == "OK" and by[0].headroom_s is None and by[0].ratio == 0.0
    assert by[1].headroom_s == 2 * 3600.0 and by[1].ratio == 0.1 and by[1].status == "WARN"
    assert by[2].status == "DATA_LOSS"
    assert by[3].ratio == 1.0 and by[3].status == "ERROR"
    assert status == "DATA_LOSS"
    assert evaluate({0: Watermarks(0, 10)}, {0: 5}, -1, {0: 0}, now, policy)[1][0].headroom_s is None


def _set_retention(kafka_config, topic: str, ms: int) -> None:
    admin = AdminClient(kafka_config.client_conf())
    resource = ConfigResource(
        "topic",
        topic,
        incremental_configs=[ConfigEntry("retention.ms", str(ms), incremental_operation=AlterConfigOpType.SET)],
    )
    for fut in admin.incremental_alter_configs([resource]).values():
        fut.result(timeout=30)


def test_shrinking_retention_and_data_loss_raise_alerts(
    spark, settings, kafka, kafka_config, catalog, unique, topic_factory, slack, slack_alerts
):
    topic = topic_factory(unique, partitions=1)
    two_hours_ago = int(time.time() * 1000) - 2 * HOUR_MS
    produce(kafka_config, topic, event_records(range(100), ts0=two_hours_ago))
    spec = make_spec(
        unique,
        topic,
        max_records_per_partition=20,
        retention={"warn_headroom": "3h", "error_headroom": "1h", "warn_ratio": 0.99, "error_ratio": 1.0},
    )
    run_micro_batch(spark, settings, spec, commit_id=str(uuid.uuid4()), kafka=kafka, catalog=catalog)  # [0, 20)
    resources = {
        k: v for k, v in default_resources(settings).items() if k in ("lake_kafka", "lake_catalog", "lake_slack")
    }
    instance = DagsterInstance.ephemeral()
    sensor_def = retention_sensor(spec)

    def tick(cursor):
        result = sensor_def(build_sensor_context(instance=instance, cursor=cursor, resources=resources))
        md = result.asset_events[0].metadata
        return result.cursor, md["retention_status"].value, md

    cursor, status, md = tick(None)
    assert status == "OK" and md["headroom_s"].value == "unbounded" and slack.messages == []

    _set_retention(kafka_config, topic, 4 * HOUR_MS)  # oldest unread record expires in ~2 h
    cursor, status, md = tick(cursor)
    assert status == "WARN"
    assert 1.9 * 3600 < md["headroom_s"].value <= 2 * 3600
    assert len(slack.messages) == 1
    assert "retention_headroom_s" in slack.messages[-1]["text"] and spec.identifier in slack.messages[-1]["text"]

    _set_retention(kafka_config, topic, int(2.5 * HOUR_MS))  # ~30 min left
    cursor, status, md = tick(cursor)
    assert status == "ERROR" and md["headroom_s"].value < 3600
    assert len(slack.messages) == 2 and "ERROR" in slack.messages[-1]["text"]

    delete_records(kafka_config, topic, 0, 50)
    cursor, status, md = tick(cursor)
    assert status == "DATA_LOSS"
    assert md["partitions"].value["0"]["low"] == 50 and md["partitions"].value["0"]["committed"] == 20
    text = slack.messages[-1]["text"]
    assert (
        len(slack.messages) == 3 and "data_loss" in text and "committed 20 &lt; log start 50" in text
    )  # Slack escapes <
    assert json.loads(cursor)["status"] == "DATA_LOSS"
    tick(cursor)
    assert len(slack.messages) == 3, "no repeat while the status holds"

    with pytest.raises(DataLossError, match="30 offsets were deleted"):
        run_micro_batch(spark, settings, spec, commit_id=str(uuid.uuid4()), kafka=kafka, catalog=catalog)

    # the documented recovery: accept the gap explicitly; it stays in every later snapshot summary
    writer = TableWriter(spark, settings, spec, kafka, catalog)
    with pytest.raises(LakeError, match="needs a reason"):
        writer.accept_gap("op-1", reason=" ")
    accepted = writer.accept_gap("op-1", reason="retention shrunk during the incident")
    assert accepted.committed and accepted.records == 0 and accepted.offsets == {0: 50}
    while run_micro_batch(spark, settings, spec, commit_id=str(uuid.uuid4()), kafka=kafka, catalog=catalog).total_lag:
        pass
    view = current_view(catalog, spec)
    state = state_at(view.snapshots, view.main)
    assert state.offsets == {0: 100} and state.snapshot_id != accepted.snapshot_id
    (gap,) = state.accepted_gaps
    assert (gap["partition"], gap["start"], gap["end"]) == (0, 20, 50)
    assert gap["reason"] == "retention shrunk during the incident"
    ids = sorted(r["id"] for r in table_rows(spark, settings, spec))
    assert ids == list(range(20)) + list(range(50, 100)), "exactly the records that survived, once"
    with pytest.raises(LakeError, match="no gap to accept"):
        writer.accept_gap("op-2", reason="again")
