"""A one-table Dagster code location for the backfill tests, loaded by Dagster's own workspace
machinery (so the sensor daemon and the backfill daemon can run against it in-process).

The table declaration comes from ``LAKE_TEST_TABLE_JSON`` (a tables.yaml entry as JSON, see
:func:`tests.helpers.spec_dict`); the resources from the environment (the test sets the
variables of the ``lake_env`` fixture). Holds the topic asset, the table asset, its two checks
and its lag sensor; the executor is the code location's (in-process, with run liveness). Also
loaded by ``dagster asset materialize`` in tests/test_liveness.py.
"""

import json
import os

from dagster import Definitions, in_process_executor

from kafka_iceberg.config.settings import load_settings
from kafka_iceberg.declaration.spec import parse_table_spec
from kafka_iceberg.lake_assets.liveness import liveness_executor
from kafka_iceberg.lake_assets.tables import table_asset, table_checks, topic_asset
from kafka_iceberg.resources import default_resources
from kafka_iceberg.sensors.lag import lag_sensor

settings = load_settings()
spec = parse_table_spec(json.loads(os.environ["LAKE_TEST_TABLE_JSON"]))

defs = Definitions(
    assets=[topic_asset(spec), table_asset(spec, sqlite_catalog=settings.catalog.is_sqlite)],
    asset_checks=table_checks(spec),
    sensors=[lag_sensor(spec)],
    resources=default_resources(settings),
    executor=liveness_executor(in_process_executor),
)
