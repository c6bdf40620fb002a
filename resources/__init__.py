"""Dagster resources: Kafka, Spark (dagster-pyspark), the Iceberg catalog, Slack, and the read path
of downstream assets (:class:`LakeTableReader`, :mod:`kafka_iceberg.resources.reader`).

Built once, by the composition root (:mod:`kafka_iceberg.lake_assets.definitions`), from one
:class:`~kafka_iceberg.config.settings.Settings` (:func:`kafka_iceberg.config.settings.load_settings`: every
variable with a documented default, docs/configuration.md), so the same code runs against the dev
broker and SQLite catalog on a laptop and against a real Kafka cluster and a PostgreSQL catalog in
production.

Building them opens no connection: the catalog is opened (and its JDBC tables created) when a run
starts its Spark session or calls :meth:`IcebergCatalogResource.load`, so a catalog or broker
outage never keeps the code location, the UI or the sensors from loading. Secret-bearing values
(``KAFKA_CLIENT_CONFIG`` with ``sasl.password``, ``LAKE_CATALOG_URI`` with the database password,
``LAKE_CATALOG_PROPERTIES``) are passed as ``EnvVar`` when they come from the process environment:
the UI shows the variable's name. The catalog's credentials (``PYICEBERG_CATALOG__<NAME>__*``,
``LAKE_CATALOG_SECRETS_DIR``) are read when a run starts, so the Spark resource's visible
``spark_config`` carries no password, key or token.
"""

import dataclasses
import json
import re
from typing import Any

from dagster import ConfigurableResource, EnvVar, InitResourceContext
from dagster_pyspark import PySparkResource

from kafka_iceberg.catalog.config import SECRET_KEYS
from kafka_iceberg.catalog.spark import catalog_conf, spark_conf
from kafka_iceberg.catalog.tables import load_catalog
from kafka_iceberg.config.models import DevHooks, RuntimeSettings
from kafka_iceberg.config.settings import (
    Settings,
    export_spark_environment,
    load_settings,
)
from kafka_iceberg.kafka.admin import KafkaConfig, KafkaMetadata
from kafka_iceberg.resources.catalog import IcebergCatalogResource
from kafka_iceberg.resources.reader import LakeTableReader, TableSnapshot, source_snapshots
from kafka_iceberg.resources.slack import LakeSlackResource

ROLES = ("kafka", "catalog", "pyspark", "slack", "reader")
"""The resources of one lake, by role; their keys are ``<prefix><role>``."""


@dataclasses.dataclass(frozen=True)
class ResourceKeys:
    """The resource keys of one lake (one ``KafkaIcebergTables`` instance): ``<prefix>kafka``,
    ``<prefix>catalog``, ``<prefix>pyspark``, ``<prefix>slack``, ``<prefix>reader``. Default prefix
    ``lake_``; another instance in the same code location takes another prefix, so neither collides
    with the other's keys nor with a host project's own ``kafka`` or ``catalog``.

    Raises:
        ValueError: ``prefix`` is not lower-case letters, digits and underscores ending in ``_``.
    """

    prefix: str = "lake_"

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[a-z][a-z0-9_]*_", self.prefix):
            raise ValueError(f"resource key prefix {self.prefix!r}: lower-case letters, digits, _; ending in _")

    def key(self, role: str) -> str:
        """The key of the resource of ``role`` (one of :data:`ROLES`)."""
        if role not in ROLES:
            raise ValueError(f"unknown resource role {role!r}; one of {ROLES}")
        return f"{self.prefix}{role}"

    def required(self, *roles: str) -> set[str]:
        """The keys of ``roles``, as an op's, asset's, check's or sensor's ``required_resource_keys``."""
        return {self.key(r) for r in roles}

    def of(self, context: Any, *roles: str) -> tuple:
        """The resources of ``roles`` from a Dagster ``context`` (its ``resources``), in that order."""
        return tuple(getattr(context.resources, self.key(r)) for r in roles)

    def name(self, name: str) -> str:
        """A job's or sensor's name that exists once per lake: as is for the default prefix, else prefixed."""
        return name if self.prefix == LAKE_KEYS.prefix else f"{self.prefix}{name}"


LAKE_KEYS = ResourceKeys()
"""The default keys: ``lake_kafka``, ``lake_catalog``, ``lake_pyspark``, ``lake_slack``, ``lake_reader``."""


class KafkaResource(ConfigurableResource):
    """The Kafka cluster the tables read from.

    ``bootstrap_servers``: ``KAFKA_BOOTSTRAP_SERVERS`` (default: the dev broker,
    127.0.0.1:19092). ``client_config_json``: ``KAFKA_CLIENT_CONFIG``, a JSON object of
    librdkafka properties (security.protocol, sasl.*, ssl.*). ``timeout_s``:
    ``LAKE_KAFKA_TIMEOUT_S``, seconds an admin request may take.
    """

    bootstrap_servers: str
    client_config_json: str = "{}"
    timeout_s: float = RuntimeSettings.model_fields["kafka_timeout_s"].default

    def config(self) -> KafkaConfig:
        """The connection settings as a :class:`KafkaConfig`."""
        return KafkaConfig(self.bootstrap_servers, json.loads(self.client_config_json or "{}"), self.timeout_s)

    def metadata(self, reader_pool: bool = False) -> KafkaMetadata:
        """An admin-API client for watermarks and consumer-group offsets; with ``reader_pool``, its range
        reads keep their consumers between micro-batches until :meth:`KafkaMetadata.close`."""
        return KafkaMetadata(self.config(), reader_pool)


def settings_for(kafka: KafkaResource, catalog: IcebergCatalogResource) -> Settings:
    """Runtime settings with the Kafka and catalog parts taken from the resources; the rest is the
    process's :func:`~kafka_iceberg.config.settings.load_settings` (built once per environment)."""
    base = load_settings()
    return dataclasses.replace(
        base,
        kafka_bootstrap_servers=kafka.bootstrap_servers,
        kafka_client_config=json.loads(kafka.client_config_json or "{}"),
        kafka_timeout_s=kafka.timeout_s,
        catalog=catalog.catalog_settings(),
    )


class LakeSparkResource(PySparkResource):
    """dagster-pyspark's ``PySparkResource`` for the lake: the session it starts when a run begins
    also gets the JDBC catalog's credentials from ``catalog`` (resolved at run time, so never in
    the visible ``spark_config``), and the catalog is opened first (``open_retry_s`` seconds of
    retries while it is locked or unreachable; it creates the JDBC catalog tables if missing).

    Raises (at run start): ``CatalogUnavailableError`` when the catalog stays unreachable.
    """

    catalog: IcebergCatalogResource
    open_retry_s: float = DevHooks.model_fields["catalog_retry_s"].default

    @classmethod
    def _is_dagster_maintained(cls) -> bool:
        return False

    def setup_for_execution(self, context: InitResourceContext) -> None:
        from pyspark.sql import SparkSession

        cat = self.catalog.catalog_settings()
        python = self.spark_config.get("spark.pyspark.python") or load_settings().pyspark_python
        export_spark_environment(str(self.spark_config.get("spark.driver.host", "127.0.0.1")), str(python))
        load_catalog(cat, self.open_retry_s)  # creates the directory and the JDBC catalog tables if missing
        secret = {k: v for k, v in catalog_conf(cat).items() if _is_secret_key(k, cat.name)}
        builder = SparkSession.builder
        for key, value in {**self.spark_config, **secret}.items():
            builder = builder.config(key, value)
        self._spark_session = builder.getOrCreate()


def _is_secret_key(spark_key: str, catalog_name: str) -> bool:
    """True for ``spark.sql.catalog.<name>.<credential property>`` (``jdbc.password``, ``s3.secret-access-key``, ...)."""
    prefix = f"spark.sql.catalog.{catalog_name}."
    return spark_key.startswith(prefix) and spark_key[len(prefix) :] in SECRET_KEYS


def _from_env_or(settings: Settings, name: str, value: str):
    """``EnvVar(name)`` when ``settings`` read ``name`` from the process environment, else ``value``."""
    return EnvVar(name) if name in settings.from_process_env else value


def default_resources(settings: Settings | None = None, keys: ResourceKeys = LAKE_KEYS) -> dict[str, object]:
    """The resources of one lake, configured from ``settings`` (default: the environment).

    Keys (:class:`ResourceKeys`, default prefix ``lake_``): ``lake_kafka`` (:class:`KafkaResource`),
    ``lake_catalog`` (:class:`IcebergCatalogResource`), ``lake_pyspark`` (:class:`LakeSparkResource`
    with the Iceberg runtime jar, the JDBC catalog and ``SPARK_MASTER``, default ``local[*]``),
    ``lake_slack`` (:class:`LakeSlackResource`, token ``EnvVar("SLACK_BOT_TOKEN")``), ``lake_reader``
    (:class:`LakeTableReader`, the read path of downstream assets). Opens no connection.

    Raises:
        ConfigError: a JDBC driver jar is missing (see :func:`kafka_iceberg.catalog.spark.spark_conf`).
    """
    settings = settings or load_settings()
    catalog = settings.catalog
    from_properties = any(
        k == "LAKE_CATALOG_PROPERTIES" or k.startswith("PYICEBERG_CATALOG__") or k == "LAKE_CATALOG_SECRETS_DIR"
        for k in settings.from_process_env
    )
    # a properties catalog is resolved from the run's environment; its uri here could hold a password
    uri = "" if from_properties else catalog.sqlalchemy_uri.replace("postgresql+psycopg2://", "postgresql://")
    catalog_resource = IcebergCatalogResource(
        name=catalog.name,
        uri=_from_env_or(settings, "LAKE_CATALOG_URI", uri),
        warehouse=catalog.warehouse,
        properties_json=_from_env_or(settings, "LAKE_CATALOG_PROPERTIES", ""),
    )
    visible_conf = {k: v for k, v in spark_conf(settings).items() if not _is_secret_key(k, catalog.name)}
    resources = {
        "kafka": KafkaResource(
            bootstrap_servers=settings.kafka_bootstrap_servers,
            client_config_json=_from_env_or(settings, "KAFKA_CLIENT_CONFIG", json.dumps(settings.kafka_client_config)),
            timeout_s=settings.kafka_timeout_s,
        ),
        "catalog": catalog_resource,
        "pyspark": LakeSparkResource(
            spark_config=visible_conf, catalog=catalog_resource, open_retry_s=settings.catalog_retry_s
        ),
        # the token is an EnvVar of the process, so the other Slack settings come from its environment too
        "slack": LakeSlackResource.from_env(),
        "reader": LakeTableReader(catalog=catalog_resource),
    }
    return {keys.key(role): resource for role, resource in resources.items()}


__all__ = [
    "IcebergCatalogResource",
    "KafkaResource",
    "LAKE_KEYS",
    "LakeSlackResource",
    "LakeSparkResource",
    "LakeTableReader",
    "ROLES",
    "ResourceKeys",
    "TableSnapshot",
    "default_resources",
    "settings_for",
    "source_snapshots",
]
