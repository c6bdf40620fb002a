"""The typed groups of :class:`kafka_iceberg.config.settings.Settings`: pydantic-settings models whose
fields are read from environment variables (each field's ``validation_alias`` is its variable; its
description starts with the variable and gives the unit). Built only by the loaders of
:mod:`kafka_iceberg.config.settings`, from the mapping they pass (the process environment or a test's):
these models never read the environment themselves. ``docs/configuration.md`` lists every variable
(``tests/test_settings.py`` holds it)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, PydanticBaseSettingsSource, SettingsConfigDict


class EnvGroup(BaseSettings):
    """A group of settings read from environment variables by their names (``case_sensitive``); an
    empty value is unset. Constructed from keyword values only (its sources are the init values:
    :func:`kafka_iceberg.config.settings.load_settings` reads the environment)."""

    model_config = SettingsConfigDict(
        frozen=True, extra="forbid", case_sensitive=True, env_ignore_empty=True, populate_by_name=True
    )

    @classmethod
    def settings_customise_sources(
        cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource, *_: Any, **__: Any
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings,)


def _json_object(value: Any) -> dict[str, str]:
    """A JSON object (text or already decoded) as str -> str; ValueError for anything else."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"must be a JSON object: {exc}") from exc
    if not isinstance(value, dict):
        raise ValueError(f"must be a JSON object, got {type(value).__name__}")
    return {str(k): str(v) for k, v in value.items()}


JsonObject = Annotated[dict[str, str], NoDecode]


class RuntimeSettings(EnvGroup):
    """Where things are, the Kafka client, Spark and the micro-batch limits. Defaults that depend on
    the checkout or ``LAKE_HOME`` are None here and derived by :func:`kafka_iceberg.config.settings.load_settings`."""

    lake_home: Path | None = Field(
        None, validation_alias="LAKE_HOME", description="LAKE_HOME: root of all local state (default <checkout>/.lake)."
    )
    tables_file: Path | None = Field(
        None,
        validation_alias="LAKE_TABLES_FILE",
        description="LAKE_TABLES_FILE: a table declarations file; unset: the Component instances of the defs folder.",
    )
    defs_module: str = Field(
        "kafka_iceberg.defs",
        validation_alias="LAKE_DEFS_MODULE",
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$",
        description="LAKE_DEFS_MODULE: the importable defs folder whose KafkaIcebergTables instances declare the tables.",
    )
    kafka_bootstrap_servers: str = Field(
        "",
        validation_alias="KAFKA_BOOTSTRAP_SERVERS",
        description="KAFKA_BOOTSTRAP_SERVERS: host:port list; unset: the dev broker.",
    )
    kafka_client_config: JsonObject = Field(
        default_factory=dict,
        validation_alias="KAFKA_CLIENT_CONFIG",
        description="KAFKA_CLIENT_CONFIG: JSON object of librdkafka properties.",
    )
    catalog_name: str = Field(
        "lake", validation_alias="LAKE_CATALOG_NAME", description="LAKE_CATALOG_NAME: the Iceberg catalog name."
    )
    catalog_uri: str | None = Field(
        None,
        validation_alias="LAKE_CATALOG_URI",
        description="LAKE_CATALOG_URI: sqlite:////abs/catalog.db or postgresql://… (default $LAKE_HOME/catalog.db).",
    )
    warehouse: str | None = Field(
        None,
        validation_alias="LAKE_WAREHOUSE",
        description="LAKE_WAREHOUSE: table data and metadata location (default file://$LAKE_HOME/warehouse).",
    )
    spark_master: str = Field("local[*]", validation_alias="SPARK_MASTER", description="SPARK_MASTER: spark.master.")
    spark_local_ip: str = Field(
        "127.0.0.1",
        validation_alias="SPARK_LOCAL_IP",
        description="SPARK_LOCAL_IP: the driver's host and bind address.",
    )
    spark_driver_memory: str = Field(
        "2g", validation_alias="LAKE_SPARK_DRIVER_MEMORY", description="LAKE_SPARK_DRIVER_MEMORY: spark.driver.memory."
    )
    spark_extra_jars: Annotated[tuple[str, ...], NoDecode] = Field(
        (), validation_alias="LAKE_SPARK_JARS", description="LAKE_SPARK_JARS: comma-separated jar paths."
    )
    spark_conf: JsonObject = Field(
        default_factory=dict,
        validation_alias="LAKE_SPARK_CONF",
        description="LAKE_SPARK_CONF: JSON object of Spark settings applied last.",
    )
    pyspark_python: str | None = Field(
        None,
        validation_alias="PYSPARK_PYTHON",
        description="PYSPARK_PYTHON: the interpreter of Spark's Python workers (default: the driver's).",
    )
    kafka_timeout_s: float = Field(
        30.0,
        ge=0,
        validation_alias="LAKE_KAFKA_TIMEOUT_S",
        description="LAKE_KAFKA_TIMEOUT_S: seconds per admin request.",
    )
    read_timeout_s: float = Field(
        120.0,
        ge=0,
        validation_alias="LAKE_READ_TIMEOUT_S",
        description="LAKE_READ_TIMEOUT_S: seconds a read task may go without progress.",
    )
    max_records_per_task: int = Field(
        250_000,
        ge=0,
        validation_alias="LAKE_MAX_RECORDS_PER_TASK",
        description="LAKE_MAX_RECORDS_PER_TASK: offsets per read task.",
    )
    attempt_timeout_s: float = Field(
        3600.0,
        ge=0,
        validation_alias="LAKE_ATTEMPT_TIMEOUT_S",
        description="LAKE_ATTEMPT_TIMEOUT_S: seconds after which a write attempt outside Dagster is abandoned.",
    )
    orphan_clock_skew_s: float = Field(
        1.0,
        ge=0,
        validation_alias="LAKE_ORPHAN_CLOCK_SKEW_S",
        description="LAKE_ORPHAN_CLOCK_SKEW_S: seconds subtracted from the orphan-file cut-off in recovery.",
    )
    catalog_retry_s: float = Field(
        60.0,
        ge=0,
        validation_alias="LAKE_CATALOG_RETRY_S",
        description="LAKE_CATALOG_RETRY_S: seconds a transient catalog error is retried.",
    )
    dagster_executor: Literal["in_process", "multiprocess", "k8s"] = Field(
        "in_process",
        validation_alias="LAKE_DAGSTER_EXECUTOR",
        description="LAKE_DAGSTER_EXECUTOR: the executor of the code location's jobs.",
    )
    dagster_home: Path | None = Field(
        None,
        validation_alias="DAGSTER_HOME",
        description="DAGSTER_HOME: the Dagster instance directory (default $LAKE_HOME/dagster).",
    )

    v_json = field_validator("kafka_client_config", "spark_conf", mode="before")(_json_object)

    @field_validator("spark_extra_jars", mode="before")
    @classmethod
    def _jars(cls, value: Any) -> Any:
        return tuple(j for j in value.split(",") if j.strip()) if isinstance(value, str) else value


class StreamSettings(EnvGroup):
    """Streaming runs (``lake_assets/streaming.py``): how long a sensor-launched run keeps committing."""

    budget_s: float = Field(
        300.0,
        validation_alias="LAKE_STREAM_BUDGET_S",
        ge=0,
        description="LAKE_STREAM_BUDGET_S: seconds a sensor-launched run (not part "
        "of a backfill) may keep starting micro-batches; 0 turns streaming off.",
    )
    idle_s: float = Field(
        2.0,
        validation_alias="LAKE_STREAM_IDLE_S",
        ge=0,
        description="LAKE_STREAM_IDLE_S: seconds a streaming run with no lag left polls "
        "the high watermarks for new records before it ends.",
    )
    check_niceness: int = Field(
        10,
        validation_alias="LAKE_CHECK_NICENESS",
        ge=0,
        le=19,
        description="LAKE_CHECK_NICENESS: the nice value a streaming run's process tree (its Spark JVM included) "
        "takes for its last checks, so the next run on the same host gets the cores first; 0 leaves it as is.",
    )
    workers: int = Field(
        0,
        validation_alias="LAKE_WORKERS",
        ge=0,
        le=256,
        description="LAKE_WORKERS: 0 (default) gives every table its own sensor-launched runs; N >= 1 serves "
        "all tables from N long-running worker runs (one process and Spark session each), launched by one "
        "sensor that watches every table.",
    )
    worker_threads: int = Field(
        2,
        validation_alias="LAKE_WORKER_THREADS",
        ge=1,
        le=16,
        description="LAKE_WORKER_THREADS: micro-batches of different tables a worker run (LAKE_WORKERS >= 1) "
        "runs at once, in threads of its one process and Spark session; 1: one at a time.",
    )
    group_mirror_s: float = Field(
        10.0,
        validation_alias="LAKE_GROUP_MIRROR_S",
        ge=0,
        description="LAKE_GROUP_MIRROR_S: seconds between a worker run's consumer-group offset commits (the "
        "latest committed offsets of every table it committed to, and all of them when it stops serving); "
        "0: after every micro-batch.",
    )


DEFAULT_SLACK_CHANNEL = "#data-platform-alerts"
DEFAULT_SLACK_API_BASE_URL = "https://slack.com/api/"
DEFAULT_UI_URL = "http://127.0.0.1:3000"
DEFAULT_SLACK_TIMEOUT_S = 10.0


class SlackSettings(EnvGroup):
    """Slack alerts (``kafka_iceberg/ops/alerts.py``, ``resources/slack.py``)."""

    token: SecretStr | None = Field(
        None,
        validation_alias="SLACK_BOT_TOKEN",
        description="SLACK_BOT_TOKEN: bot token (xoxb-…); unset: alerts are only logged.",
    )
    channel: str = Field(
        DEFAULT_SLACK_CHANNEL,
        validation_alias="SLACK_CHANNEL",
        description="SLACK_CHANNEL: channel name or id alerts go to.",
    )
    api_base_url: str = Field(
        DEFAULT_SLACK_API_BASE_URL,
        validation_alias="SLACK_API_BASE_URL",
        description="SLACK_API_BASE_URL: Slack Web API base URL.",
    )
    ui_url: str = Field(
        DEFAULT_UI_URL,
        validation_alias="DAGSTER_UI_URL",
        description="DAGSTER_UI_URL: base URL of the Dagster UI for asset and run links.",
    )
    timeout_s: float = Field(
        DEFAULT_SLACK_TIMEOUT_S,
        validation_alias="SLACK_TIMEOUT_S",
        gt=0,
        description="SLACK_TIMEOUT_S: seconds one HTTP request may take.",
    )


class RegistrySettings(EnvGroup):
    """Schema Registry credentials (``kafka_iceberg/formats/resolver.py``); never in ``tables.yaml``."""

    basic_auth: SecretStr | None = Field(
        None,
        validation_alias="LAKE_SCHEMA_REGISTRY_BASIC_AUTH",
        description="LAKE_SCHEMA_REGISTRY_BASIC_AUTH: user:password.",
    )
    bearer_token: SecretStr | None = Field(
        None,
        validation_alias="LAKE_SCHEMA_REGISTRY_BEARER_TOKEN",
        description="LAKE_SCHEMA_REGISTRY_BEARER_TOKEN: a static bearer token.",
    )
    logical_cluster: str = Field(
        "",
        validation_alias="LAKE_SCHEMA_REGISTRY_LOGICAL_CLUSTER",
        description="LAKE_SCHEMA_REGISTRY_LOGICAL_CLUSTER: Confluent Cloud logical cluster of the bearer token.",
    )
    identity_pool: str | None = Field(
        None,
        validation_alias="LAKE_SCHEMA_REGISTRY_IDENTITY_POOL",
        description="LAKE_SCHEMA_REGISTRY_IDENTITY_POOL: Confluent Cloud identity pool id of the bearer token.",
    )
    ca_location: str | None = Field(
        None,
        validation_alias="LAKE_SCHEMA_REGISTRY_CA",
        description="LAKE_SCHEMA_REGISTRY_CA: path of a CA bundle for TLS.",
    )


__all__ = [
    "DEFAULT_SLACK_API_BASE_URL",
    "DEFAULT_SLACK_CHANNEL",
    "DEFAULT_SLACK_TIMEOUT_S",
    "DEFAULT_UI_URL",
    "EnvGroup",
    "RegistrySettings",
    "RuntimeSettings",
    "SlackSettings",
    "StreamSettings",
]
