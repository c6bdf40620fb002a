"""The Dagster instance on PostgreSQL storage (dagster-postgres), as the Helm deployment runs it:
run, event-log and schedule storage in the dev PostgreSQL server.

Dagster's own sensor-daemon and backfill-daemon iterations run in-process against the one-table
code location of tests/backfill_location.py, on the real broker, real Spark and the real catalog:
the lag sensor's tick, the backfill it requests, its runs and the pool slots all live in PostgreSQL.
"""

from __future__ import annotations

import json
import logging
import sys
import uuid
from pathlib import Path

import pytest
from dagster import RunsFilter, instance_for_test
from dagster._core.execution.backfill import BulkActionStatus
from dagster._core.remote_origin import InProcessCodeLocationOrigin
from dagster._core.scheduler.instigation import TickStatus
from dagster._core.storage.tags import BACKFILL_ID_TAG
from dagster._core.test_utils import create_test_daemon_workspace_context
from dagster._core.types.loadable_target_origin import LoadableTargetOrigin
from dagster._core.workspace.load_target import InProcessWorkspaceLoadTarget
from dagster._daemon.backfill import execute_backfill_iteration
from dagster._daemon.sensor import execute_sensor_iteration
from dagster_postgres import PostgresEventLogStorage, PostgresRunStorage, PostgresScheduleStorage

from kafka_iceberg.batch.planning import offset_lag
from kafka_iceberg.catalog.tables import read_state
from kafka_iceberg.lake_assets.tables import table_key, table_pool
from tests.helpers import event_records, make_spec, new_database, spec_dict
from tests.spark_cluster import produce

LOCATION = Path(__file__).with_name("backfill_location.py")


@pytest.fixture(scope="module")
def dagster_pg_db(postgres_server):
    """The instance's ``storage.postgres.postgres_db`` config for a database of this module's own on the
    session's private PostgreSQL server, spelled as the Helm chart renders it from ``postgresql.*`` values."""
    db_name = new_database(postgres_server, "dagster").rsplit("/", 1)[1]
    # no "scheme": the chart's default (postgresqlScheme unset) is a bare postgresql://, psycopg2 under SQLAlchemy 2.0
    return {
        "username": "lake",
        "password": "lakepw",
        "hostname": "127.0.0.1",
        "port": postgres_server.port,
        "db_name": db_name,
    }


def test_sensor_backfill_and_pools_on_postgres_storage(
    spark, lake_env, kafka, kafka_config, catalog, unique, topic_factory, dagster_pg_db, monkeypatch
):
    for k, v in lake_env.items():
        monkeypatch.setenv(k, v)
    # tests/backfill_location.py reads its table and resources from the environment at import: load it
    # anew, not the module another test (test_backfill) imported with its own table and Slack token
    for name in [n for n in sys.modules if n.split(".")[-1] == "backfill_location"]:
        monkeypatch.delitem(sys.modules, name)
    topic = topic_factory(unique, partitions=2)
    lag = {"max_offset_lag": 100, "max_interval": "1h"}
    monkeypatch.setenv(
        "LAKE_TEST_TABLE_JSON", json.dumps(spec_dict(unique, topic, max_records_per_partition=100, lag=lag))
    )
    spec = make_spec(unique, topic, max_records_per_partition=100, lag=lag)
    produce(kafka_config, topic, event_records(range(500)))  # ~250 per partition: a backfill of 3 micro-batches
    pool = table_pool(spec, sqlite_catalog=True)
    overrides = {
        "storage": {"postgres": {"postgres_db": dagster_pg_db}},
        "concurrency": {"pools": {"default_limit": 1}},
        "run_coordinator": {"module": "dagster._core.run_coordinator", "class": "DefaultRunCoordinator"},
        "run_launcher": {
            "module": "dagster._core.launcher.sync_in_memory_run_launcher",
            "class": "SyncInMemoryRunLauncher",
        },
    }
    origin = InProcessCodeLocationOrigin(
        LoadableTargetOrigin(
            python_file=str(LOCATION), attribute="defs", working_directory=str(LOCATION.parent.parent)
        ),
        location_name="postgres_test",
    )
    logger = logging.getLogger("test_dagster_postgres")
    with (
        instance_for_test(overrides=overrides) as instance,
        create_test_daemon_workspace_context(InProcessWorkspaceLoadTarget([origin]), instance) as workspace,
    ):
        assert isinstance(instance.run_storage, PostgresRunStorage)
        assert isinstance(instance.event_log_storage, PostgresEventLogStorage)
        assert isinstance(instance.schedule_storage, PostgresScheduleStorage)

        # the lag sensor's tick, through the sensor daemon, is stored in PostgreSQL and requests a backfill
        list(execute_sensor_iteration(workspace, logger, None, None))
        (state,) = [s for s in instance.all_instigator_state() if s.name == f"{spec.name}_lag"]
        (tick,) = instance.get_ticks(state.instigator_origin_id, state.selector_id)
        assert tick.status == TickStatus.SUCCESS
        (backfill,) = instance.get_backfills()
        slots = sorted(ap.partition_key for ap in backfill.asset_backfill_data.target_subset.iterate_asset_partitions())
        assert len(slots) == 3

        # the backfill daemon runs one micro-batch per slot; each run claims the table's pool slot
        for _ in range(10):
            list(execute_backfill_iteration(workspace, logger))
            backfill = instance.get_backfill(backfill.backfill_id)
            if backfill.status != BulkActionStatus.REQUESTED:
                break
        assert backfill.status == BulkActionStatus.COMPLETED_SUCCESS, backfill.status
        runs = instance.get_runs(filters=RunsFilter(tags={BACKFILL_ID_TAG: backfill.backfill_id}))
        assert len(runs) == 3 and all(r.is_success for r in runs)
        assert len(instance.fetch_materializations(table_key(spec), limit=10).records) == 3
        assert sum(offset_lag(kafka.watermarks(topic), read_state(catalog, spec.identifier).offsets).values()) == 0

        # the pool lives in PostgreSQL with limit 1: no slot left claimed, and a second claimant waits
        info = instance.event_log_storage.get_concurrency_info(pool)
        assert info.slot_count == 1 and info.active_slot_count == 0
        first = instance.event_log_storage.claim_concurrency_slot(pool, str(uuid.uuid4()), "step")
        second = instance.event_log_storage.claim_concurrency_slot(pool, str(uuid.uuid4()), "step")
        assert first.is_claimed and not second.is_claimed
