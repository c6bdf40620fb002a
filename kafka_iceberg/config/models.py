"""The typed groups of :class:`kafka_iceberg.config.settings.Settings` that are pydantic models: each field
documents its environment variable and unit. Built only by the loaders of :mod:`kafka_iceberg.config.settings`
(this module reads no environment)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, SecretStr

_FROZEN = ConfigDict(frozen=True, extra="forbid")


class StreamSettings(BaseModel):
    """Streaming runs (``lake_assets/streaming.py``): how long a sensor-launched run keeps committing."""

    model_config = _FROZEN
    budget_s: float = Field(
        300.0,
        ge=0,
        description="LAKE_STREAM_BUDGET_S: seconds a sensor-launched run (not part "
        "of a backfill) may keep starting micro-batches; 0 turns streaming off.",
    )
    idle_s: float = Field(
        2.0,
        ge=0,
        description="LAKE_STREAM_IDLE_S: seconds a streaming run with no lag left polls "
        "the high watermarks for new records before it ends.",
    )
    workers: int = Field(
        0,
        ge=0,
        le=256,
        description="LAKE_WORKERS: 0 (default) gives every table its own sensor-launched runs; N >= 1 serves "
        "all tables from N long-running worker runs (one process and Spark session each), launched by one "
        "sensor that watches every table.",
    )


DEFAULT_SLACK_CHANNEL = "#data-platform-alerts"
DEFAULT_SLACK_API_BASE_URL = "https://slack.com/api/"
DEFAULT_UI_URL = "http://127.0.0.1:3000"
DEFAULT_SLACK_TIMEOUT_S = 10.0


class SlackSettings(BaseModel):
    """Slack alerts (``kafka_iceberg/ops/alerts.py``, ``resources/slack.py``)."""

    model_config = _FROZEN
    token: SecretStr | None = Field(
        None, description="SLACK_BOT_TOKEN: bot token (xoxb-…); unset: alerts are only logged."
    )
    channel: str = Field(DEFAULT_SLACK_CHANNEL, description="SLACK_CHANNEL: channel name or id alerts go to.")
    api_base_url: str = Field(DEFAULT_SLACK_API_BASE_URL, description="SLACK_API_BASE_URL: Slack Web API base URL.")
    ui_url: str = Field(
        DEFAULT_UI_URL, description="DAGSTER_UI_URL: base URL of the Dagster UI for asset and run links."
    )
    timeout_s: float = Field(
        DEFAULT_SLACK_TIMEOUT_S, gt=0, description="SLACK_TIMEOUT_S: seconds one HTTP request may take."
    )


class RegistrySettings(BaseModel):
    """Schema Registry credentials (``kafka_iceberg/formats/resolver.py``); never in ``tables.yaml``."""

    model_config = _FROZEN
    basic_auth: SecretStr | None = Field(None, description="LAKE_SCHEMA_REGISTRY_BASIC_AUTH: user:password.")
    bearer_token: SecretStr | None = Field(
        None, description="LAKE_SCHEMA_REGISTRY_BEARER_TOKEN: a static bearer token."
    )
    logical_cluster: str = Field(
        "", description="LAKE_SCHEMA_REGISTRY_LOGICAL_CLUSTER: Confluent Cloud logical cluster of the bearer token."
    )
    identity_pool: str | None = Field(
        None, description="LAKE_SCHEMA_REGISTRY_IDENTITY_POOL: Confluent Cloud identity pool id of the bearer token."
    )
    ca_location: str | None = Field(None, description="LAKE_SCHEMA_REGISTRY_CA: path of a CA bundle for TLS.")


__all__ = [
    "DEFAULT_SLACK_API_BASE_URL",
    "DEFAULT_SLACK_CHANNEL",
    "DEFAULT_SLACK_TIMEOUT_S",
    "DEFAULT_UI_URL",
    "RegistrySettings",
    "SlackSettings",
    "StreamSettings",
]
