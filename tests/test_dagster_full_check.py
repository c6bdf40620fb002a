"""The scheduled full-scan duplicate_free check (schedules/checks.py): the schedule is defined from
the declaration, and its job runs the table's duplicate_free asset check over every row, so it
finds a duplicate that no run's incremental check would read. Real Spark, catalog and broker."""

from __future__ import annotations

from dagster import DagsterInstance, DefaultScheduleStatus, Definitions

from devtools.demo.data import produce
from kafka_iceberg.catalog.tables import qualified
from kafka_iceberg.lake_assets.tables import table_asset, table_checks, topic_asset
from kafka_iceberg.ops.spread import spread_cron, spread_slots
from kafka_iceberg.resources import default_resources
from kafka_iceberg.schedules import all_schedules
from tests.helpers import event_records, make_spec


def _definitions(settings, spec) -> Definitions:
    return Definitions(
        assets=[topic_asset(spec), table_asset(spec)],
        asset_checks=table_checks(spec),
        schedules=all_schedules([spec], sqlite_catalog=True),
        resources=default_resources(settings),
    )


def _run_full_check(defs: Definitions, spec):
    result = defs.resolve_job_def(f"duplicate_free_full_{spec.name}").execute_in_process(
        instance=DagsterInstance.ephemeral()
    )
    assert result.success
    (evaluation,) = result.get_asset_check_evaluations()
    assert evaluation.check_name == "duplicate_free"
    return evaluation


def test_the_full_check_schedule_is_declared_and_configurable(unique):
    spec = make_spec(unique, "t")
    (default,) = [s for s in all_schedules([spec]) if s.name == f"duplicate_free_full_{spec.name}_schedule"]
    spread = spread_cron("0 5 * * *", spread_slots([spec.identifier])[spec.identifier])  # the default, spread
    assert default.cron_schedule == spread and default.execution_timezone == "UTC"
    assert default.default_status == DefaultScheduleStatus.RUNNING
    assert default.job_name == f"duplicate_free_full_{spec.name}"
    hourly = make_spec(unique, "t", maintenance={"full_check": "15 * * * *"})
    assert [s.cron_schedule for s in all_schedules([hourly]) if s.name.startswith("duplicate_free_full_")] == [
        "15 * * * *"
    ]


def test_the_scheduled_job_scans_the_whole_table(spark, settings, kafka_config, writer_factory, unique, topic_factory):
    topic = topic_factory(unique, partitions=2)
    spec = make_spec(unique, topic, max_records_per_partition=1000)
    writer = writer_factory(spec)
    produce(kafka_config, topic, event_records(range(200)))
    writer.execute(writer.plan(), "run-a")
    defs = _definitions(settings, spec)

    clean = _run_full_check(defs, spec)
    assert clean.passed, clean.description
    assert clean.metadata["scope"].value == "full" and clean.metadata["duplicate_offsets"].value == 0

    # a copy of an old row appended outside the write path (no commit id, no offset range): only the
    # full scan sees it
    table = qualified(settings, spec)
    spark.table(table).orderBy("_kafka_offset").limit(1).writeTo(table).append()
    dirty = _run_full_check(defs, spec)
    assert not dirty.passed
    assert dirty.metadata["scope"].value == "full" and dirty.metadata["duplicate_offsets"].value == 1
