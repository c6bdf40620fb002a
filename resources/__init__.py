"""Dagster resources: Kafka, Spark (dagster-pyspark) and the Iceberg catalog.

Every field's default comes from :func:`kafka_iceberg.settings.load_settings`, that is
from an environment variable with a documented default (docs/configuration.md), so the
same code runs against the dev broker and SQLite catalog on a laptop and against a real
Kafka cluster and a PostgreSQL catalog in production.
"""


import dataclasses
import json

from dagster import ConfigurableResource
from dagster_pyspark import PySparkResource

from kafka_iceberg.catalog import load_catalog, prepare_spark_environment, spark_conf
from kafka_iceberg.kafka_client import KafkaConfig, KafkaMetadata
from kafka_iceberg.settings import CatalogSettings, Settings, catalog_from_uri, load_settings
from resources.slack import LakeSlackResource


class KafkaResource(ConfigurableResource):
    """The Kafka cluster the tables read from.

    ``bootstrap_servers``: ``KAFKA_BOOTSTRAP_SERVERS`` (default: the dev broker,
    127.0.0.1:19092). ``client_config_json``: ``KAFKA_CLIENT_CONFIG``, a JSON object of
    librdkafka properties (security.protocol, sasl.*, ssl.*). ``timeout_s``:
    ``LAKE_KAFKA_TIMEOUT_S``, seconds an admin request may take.
    """

    bootstrap_servers: str
    client_config_json: str = "{}"
    timeout_s: float = 30.0

    def config(self) -> KafkaConfig:
        """The connection settings as a :class:`KafkaConfig`."""
        return KafkaConfig(self.bootstrap_servers, json.loads(self.client_config_json or "{}"), self.timeout_s)

    def metadata(self) -> KafkaMetadata:
        """An admin-API client for watermarks and consumer-group offsets."""
        return KafkaMetadata(self.config())


class IcebergCatalogResource(ConfigurableResource):
    """The Iceberg JDBC catalog: SQLite by default, PostgreSQL by URI.

    ``name``: ``LAKE_CATALOG_NAME`` (default ``lake``; Spark SQL names tables
    ``lake.<namespace>.<table>``). ``uri``: ``LAKE_CATALOG_URI`` (default
    ``sqlite:///$LAKE_HOME/catalog.db``; ``postgresql://user:pw@host:5432/db`` for
    PostgreSQL). ``warehouse``: ``LAKE_WAREHOUSE`` (default ``file://$LAKE_HOME/warehouse``).
    """

    name: str
    uri: str
    warehouse: str

    def catalog_settings(self) -> CatalogSettings:
        """Both spellings (JDBC for Spark, SQLAlchemy for pyiceberg) of this catalog."""
        return catalog_from_uri(self.name, self.uri, self.warehouse)

    def load(self):
        """pyiceberg's ``SqlCatalog`` on this catalog."""
        return load_catalog(self.catalog_settings())


def settings_for(kafka: KafkaResource, catalog: IcebergCatalogResource) -> Settings:
    """Runtime settings with the Kafka and catalog parts taken from the resources."""
    base = load_settings()
    return dataclasses.replace(
        base,
        kafka_bootstrap_servers=kafka.bootstrap_servers,
        kafka_client_config=json.loads(kafka.client_config_json or "{}"),
        kafka_timeout_s=kafka.timeout_s,
        catalog=catalog.catalog_settings(),
    )


def default_resources(settings: Settings | None = None) -> dict[str, object]:
    """The resources of the code location, configured from the environment.

    Keys: ``kafka`` (:class:`KafkaResource`), ``catalog`` (:class:`IcebergCatalogResource`),
    ``pyspark`` (dagster-pyspark's ``PySparkResource`` with the Iceberg runtime jar, the JDBC
    catalog and ``SPARK_MASTER``, default ``local[*]``), ``slack`` (:class:`LakeSlackResource`,
    token ``EnvVar("SLACK_BOT_TOKEN")``).
    """
    settings = settings or load_settings()
    prepare_spark_environment(settings)
    catalog = settings.catalog
    uri = catalog.sqlalchemy_uri.replace("postgresql+psycopg2://", "postgresql://")
    return {
        "kafka": KafkaResource(
            bootstrap_servers=settings.kafka_bootstrap_servers,
            client_config_json=json.dumps(settings.kafka_client_config),
            timeout_s=settings.kafka_timeout_s,
        ),
        "catalog": IcebergCatalogResource(name=catalog.name, uri=uri, warehouse=catalog.warehouse),
        "pyspark": PySparkResource(spark_config=spark_conf(settings)),
        "slack": LakeSlackResource.from_env(),
    }


__all__ = ["IcebergCatalogResource", "KafkaResource", "LakeSlackResource", "PySparkResource", "default_resources", "settings_for"]
