"""The code location loads while the catalog and the broker are unreachable, shows no secret, and
its sensors report the outage.

Both endpoints are loopback ports nobody listens on: a PostgreSQL catalog URI (with a password) and
a SASL broker (with a password in ``KAFKA_CLIENT_CONFIG``). ``catalog_retry_s`` (``LAKE_DEV_HOOKS``) is 600 s, so
a load that opened the catalog with its retry would hang far past the subprocess timeout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from dagster import build_sensor_context
from dagster._core.remote_representation.external_data import RepositorySnap
from dagster._serdes import serialize_value

from devtools.services.devbroker import free_port
from kafka_iceberg.config.settings import CHECKOUT, load_settings
from kafka_iceberg.errors import CatalogUnavailableError
from tests.helpers import make_spec

KAFKA_SECRET = "kafka-s3cret-pw"
DB_SECRET = "db-s3cret-pw"


@pytest.fixture
def unreachable_env(tmp_path, monkeypatch) -> dict[str, str]:
    """The environment of a code location whose catalog and broker are both down."""
    env = {
        "LAKE_HOME": str(tmp_path / "lake"),
        "DAGSTER_HOME": str(tmp_path / "dagster"),
        "KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{free_port()}",
        "KAFKA_CLIENT_CONFIG": json.dumps(
            {
                "security.protocol": "SASL_PLAINTEXT",
                "sasl.mechanism": "PLAIN",
                "sasl.username": "lake",
                "sasl.password": KAFKA_SECRET,
            }
        ),
        "LAKE_CATALOG_URI": f"postgresql://lake:{DB_SECRET}@127.0.0.1:{free_port()}/lake",
        "LAKE_DEV_HOOKS": "catalog_retry_s=600",
        "LAKE_KAFKA_TIMEOUT_S": "2",
    }
    (tmp_path / "dagster").mkdir()
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return env


def test_code_location_loads_with_catalog_and_broker_down(unreachable_env):
    out = subprocess.run(
        [str(Path(sys.executable).with_name("dagster")), "definitions", "validate", "-w", "workspace.yaml"],
        cwd=CHECKOUT,
        env={**os.environ, **unreachable_env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Validation successful for code location kafka_iceberg.lake_assets.definitions" in out.stdout + out.stderr


def test_the_ui_snapshot_holds_no_secret(unreachable_env):
    from kafka_iceberg.lake_assets.component import declared_specs
    from kafka_iceberg.lake_assets.definitions import build_definitions

    settings = load_settings()
    defs = build_definitions(settings, declared_specs(settings))
    snapshot = serialize_value(RepositorySnap.from_def(defs.get_repository_def()))
    assert "KAFKA_CLIENT_CONFIG" in snapshot and "LAKE_CATALOG_URI" in snapshot  # shown by name
    assert KAFKA_SECRET not in snapshot
    assert DB_SECRET not in snapshot


def test_lag_sensor_reports_the_catalog_outage(unreachable_env):
    from kafka_iceberg.resources import default_resources
    from kafka_iceberg.sensors.lag import lag_sensor

    resources = {
        k: v for k, v in default_resources(load_settings()).items() if k in ("lake_kafka", "lake_catalog", "lake_slack")
    }
    sensor = lag_sensor(make_spec("outage", "outage.topic"))
    with pytest.raises(CatalogUnavailableError, match="cannot open Iceberg catalog lake"):
        sensor(build_sensor_context(resources=resources))


S3_SECRET = "s3-s3cret-key"


def test_catalog_properties_reach_runs_and_their_credentials_stay_hidden(tmp_path, monkeypatch):
    """A catalog from ``LAKE_CATALOG_PROPERTIES`` plus credentials in ``PYICEBERG_CATALOG__LAKE__*``: the
    UI snapshot shows the variables by name only, and a run's catalog resource resolves the same config,
    credentials included, for pyiceberg and for its Spark session."""
    from dagster import build_resources

    from kafka_iceberg.catalog.spark import catalog_conf
    from kafka_iceberg.lake_assets.component import declared_specs
    from kafka_iceberg.lake_assets.definitions import build_definitions
    from kafka_iceberg.resources import default_resources

    props = {
        "type": "sql",
        "uri": f"sqlite:///{tmp_path}/catalog.db",
        "warehouse": "s3://lake-bucket/warehouse",
        "s3.endpoint": f"http://127.0.0.1:{free_port()}",
        "s3.region": "us-east-1",
        "s3.path-style-access": "true",
    }
    env = {
        "LAKE_HOME": str(tmp_path / "lake"),
        "DAGSTER_HOME": str(tmp_path / "dagster"),
        "KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{free_port()}",
        "LAKE_CATALOG_PROPERTIES": json.dumps(props),
        "PYICEBERG_CATALOG__LAKE__S3__ACCESS_KEY_ID": "lake-key",
        "PYICEBERG_CATALOG__LAKE__S3__SECRET_ACCESS_KEY": S3_SECRET,
    }
    monkeypatch.delenv("LAKE_CATALOG_URI", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    settings = load_settings()
    defs = build_definitions(settings, declared_specs(settings))
    snapshot = serialize_value(RepositorySnap.from_def(defs.get_repository_def()))
    assert "LAKE_CATALOG_PROPERTIES" in snapshot
    assert S3_SECRET not in snapshot

    resources = default_resources(settings)
    assert not any(S3_SECRET in str(v) for v in resources["lake_pyspark"].spark_config.values())
    with build_resources({"lake_catalog": resources["lake_catalog"]}) as built:
        cat = built.lake_catalog.catalog_settings()
        assert cat.config.properties["s3.secret-access-key"] == S3_SECRET  # the run resolves the credentials
        assert cat.warehouse == "s3://lake-bucket/warehouse"
        assert catalog_conf(cat)["spark.sql.catalog.lake.s3.secret-access-key"] == S3_SECRET
        assert catalog_conf(cat)["spark.sql.catalog.lake.io-impl"] == "org.apache.iceberg.aws.s3.S3FileIO"
        loaded = built.lake_catalog.load()  # pyiceberg gets the s3.* properties
        assert loaded.properties["s3.endpoint"] == props["s3.endpoint"]
        assert loaded.properties["s3.secret-access-key"] == S3_SECRET
