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

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator
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
    defs_module: str | None = Field(
        None,
        validation_alias="LAKE_DEFS_MODULE",
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$",
        description="LAKE_DEFS_MODULE: the importable defs folder whose KafkaIcebergTables instances declare the "
        "tables (LAKE_DEV=1: default kafka_iceberg.defs, the demo's tables).",
    )
    dev: bool = Field(
        False,
        validation_alias="LAKE_DEV",
        description="LAKE_DEV: 1 in the repository's make targets, workspace.yaml and tests: the dev broker, the "
        "SQLite catalog under LAKE_HOME and the demo's tables are the defaults; unset, each must be configured.",
    )
    kafka_bootstrap_servers: str = Field(
        "",
        validation_alias="KAFKA_BOOTSTRAP_SERVERS",
        description="KAFKA_BOOTSTRAP_SERVERS: host:port list; required (LAKE_DEV=1: default the dev broker).",
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
        description="LAKE_CATALOG_URI: sqlite:////abs/catalog.db or postgresql://…; this or LAKE_CATALOG_PROPERTIES "
        "is required (LAKE_DEV=1: default $LAKE_HOME/catalog.db).",
    )
    catalog_properties: str | None = Field(
        None,
        validation_alias="LAKE_CATALOG_PROPERTIES",
        description="LAKE_CATALOG_PROPERTIES: JSON object of the catalog's non-secret pyiceberg properties; "
        "replaces LAKE_CATALOG_URI (read by kafka_iceberg.catalog.config).",
    )
    catalog_secrets_dir: Path | None = Field(
        None,
        validation_alias="LAKE_CATALOG_SECRETS_DIR",
        description="LAKE_CATALOG_SECRETS_DIR: a directory of one file per secret catalog property (a mounted Secret).",
    )
    warehouse: str | None = Field(
        None,
        validation_alias="LAKE_WAREHOUSE",
        description="LAKE_WAREHOUSE: table data and metadata location; required with LAKE_CATALOG_URI "
        "(LAKE_DEV=1: default file://$LAKE_HOME/warehouse).",
    )
    spark_master: str = Field("local[*]", validation_alias="SPARK_MASTER", description="SPARK_MASTER: spark.master.")
    spark_local_ip: str = Field(
        "127.0.0.1",
        validation_alias="SPARK_LOCAL_IP",
        description="SPARK_LOCAL_IP: the driver's host and bind address.",
    )
    spark_conf: JsonObject = Field(
        default_factory=dict,
        validation_alias="LAKE_SPARK_CONF",
        description="LAKE_SPARK_CONF: JSON object of Spark settings applied last; spark.driver.memory (default 2g) "
        "also sizes the run pods, spark.jars is appended to the derived jars.",
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
    max_records_per_task: int = Field(
        250_000,
        ge=0,
        validation_alias="LAKE_MAX_RECORDS_PER_TASK",
        description="LAKE_MAX_RECORDS_PER_TASK: offsets per read task.",
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


class StreamSettings(EnvGroup):
    """The worker runs that serve every table (``lake_assets/worker.py``): how many."""

    workers: int | None = Field(
        None,
        validation_alias="LAKE_WORKERS",
        ge=1,
        le=256,
        description="LAKE_WORKERS: worker runs (one process and Spark session each) serving all tables; "
        "unset: 1 on a SQLite catalog, else one per core, at most 4 and at most one per table.",
    )
    metrics_port: int = Field(
        9464,
        validation_alias="LAKE_METRICS_PORT",
        ge=0,
        le=65535,
        description="LAKE_METRICS_PORT: the port a worker run serves its Prometheus metrics on (the next free "
        "one when taken, so several worker processes on one host listen on consecutive ports); 0: off.",
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
    """Schema Registry client properties (``kafka_iceberg/formats/resolver.py``): credentials and TLS, from a
    Secret; never in the table declarations."""

    url: str | None = Field(
        None,
        validation_alias="LAKE_SCHEMA_REGISTRY_URL",
        description="LAKE_SCHEMA_REGISTRY_URL: the registry URL of a table that declares none.",
    )
    client_config: SecretStr | None = Field(
        None,
        validation_alias="LAKE_SCHEMA_REGISTRY_CONFIG",
        description="LAKE_SCHEMA_REGISTRY_CONFIG: JSON object of SchemaRegistryClient properties "
        "(basic.auth.user.info, bearer.auth.token, bearer.auth.logical.cluster, bearer.auth.identity.pool.id, "
        "ssl.ca.location, ...); a secret.",
    )

    @field_validator("client_config", mode="before")
    @classmethod
    def _object(cls, value: Any) -> Any:
        raw = value.get_secret_value() if isinstance(value, SecretStr) else value
        if isinstance(raw, str):
            _json_object(raw)  # ValueError (without the value) unless a JSON object
        return value

    def properties(self) -> dict[str, str]:
        """The client properties (str -> str); empty when unset."""
        return _json_object(self.client_config.get_secret_value()) if self.client_config else {}


class DevHooks(BaseModel):
    """Test and rehearsal hooks: the keys of ``LAKE_DEV_HOOKS`` (:class:`DevSettings`), read only under
    ``LAKE_DEV=1`` (the repository's targets and tests); an installed package uses the defaults, which
    are constants no deployment tunes. Not product settings. Units: seconds."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    attempt_timeout_s: float = Field(
        3600.0,
        ge=0,
        description="seconds after which a write attempt outside Dagster counts as dead; under Dagster an "
        "attempt is dead when its run is no longer queued or running.",
    )
    read_timeout_s: float = Field(120.0, ge=0, description="seconds a read task may go without progress.")
    catalog_retry_s: float = Field(
        60.0,
        ge=0,
        description="seconds a transient catalog error (SQLite locked, PostgreSQL down) is retried before "
        "CatalogUnavailableError; a minute covers a database failover.",
    )

    def env_value(self) -> str:
        """The ``LAKE_DEV_HOOKS`` value of the hooks set explicitly, e.g. ``read_timeout_s=30,catalog_retry_s=1``."""
        return ",".join(f"{k}={getattr(self, k):g}" for k in type(self).model_fields if k in self.model_fields_set)


def _dev_hooks(value: Any) -> Any:
    """``key=seconds,key=seconds`` (text) as a dict for :class:`DevHooks`; anything else unchanged.

    Raises:
        ValueError: an item without ``=``, an unknown or repeated key (naming it).
    """
    if not isinstance(value, str):
        return value
    hooks: dict[str, str] = {}
    for item in filter(None, (i.strip() for i in value.split(","))):
        key, eq, seconds = (part.strip() for part in item.partition("="))
        if not eq or not key or not seconds:
            raise ValueError(f"has {item!r}, not key=seconds (items separated by commas)")
        if key not in DevHooks.model_fields:
            raise ValueError(f"has an unknown key {key!r} (known: {', '.join(DevHooks.model_fields)})")
        if key in hooks:
            raise ValueError(f"sets {key!r} twice")
        hooks[key] = seconds
    return hooks


class DevSettings(EnvGroup):
    """The one variable of the LAKE_DEV-only hooks (:class:`DevHooks`)."""

    hooks: Annotated[DevHooks, NoDecode] = Field(
        default_factory=DevHooks,
        validation_alias="LAKE_DEV_HOOKS",
        description="LAKE_DEV_HOOKS: (LAKE_DEV only) test hooks as key=seconds items separated by commas, "
        "keys attempt_timeout_s, read_timeout_s, catalog_retry_s (DevHooks); unset keys keep their defaults.",
    )

    v_hooks = field_validator("hooks", mode="before")(_dev_hooks)


ORPHAN_CLOCK_SKEW_S = 1.0
"""Seconds subtracted from the orphan-file cut-off in recovery: covers clock skew between the hosts that
write data files and the one that deletes orphans (file modification times against this host's clock)."""


__all__ = [
    "DEFAULT_SLACK_API_BASE_URL",
    "DEFAULT_SLACK_CHANNEL",
    "DEFAULT_SLACK_TIMEOUT_S",
    "DEFAULT_UI_URL",
    "DevHooks",
    "DevSettings",
    "EnvGroup",
    "ORPHAN_CLOCK_SKEW_S",
    "RegistrySettings",
    "RuntimeSettings",
    "SlackSettings",
    "StreamSettings",
]
