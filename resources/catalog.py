"""The Iceberg catalog as a Dagster resource (re-exported by :mod:`kafka_iceberg.resources`)."""

from dagster import ConfigurableResource

from kafka_iceberg.catalog.tables import load_catalog
from kafka_iceberg.config.settings import CatalogSettings, run_catalog


class IcebergCatalogResource(ConfigurableResource):
    """The Iceberg catalog: the JDBC catalog of ``uri`` (SQLite by default, PostgreSQL), or any
    catalog of ``LAKE_CATALOG_PROPERTIES`` (:mod:`kafka_iceberg.catalog.config`).

    ``name``: ``LAKE_CATALOG_NAME`` (default ``lake``; Spark SQL names tables
    ``lake.<namespace>.<table>``). ``uri``: ``LAKE_CATALOG_URI`` (default
    ``sqlite:///$LAKE_HOME/catalog.db``; ``postgresql://user:pw@host:5432/db`` for
    PostgreSQL). ``warehouse``: ``LAKE_WAREHOUSE`` (default ``file://$LAKE_HOME/warehouse``).
    ``properties_json``: ``LAKE_CATALOG_PROPERTIES``. The catalog is resolved when a run uses it,
    as :func:`kafka_iceberg.config.settings.load_settings` does, so its credentials
    (``PYICEBERG_CATALOG__<NAME>__*``, ``LAKE_CATALOG_SECRETS_DIR``) come from the run's environment.
    """

    name: str
    uri: str
    warehouse: str
    properties_json: str = ""

    def catalog_settings(self) -> CatalogSettings:
        """The catalog config and, for a JDBC catalog, both spellings (JDBC for Spark, SQLAlchemy for pyiceberg).

        Raises:
            ConfigError: a malformed catalog configuration.
        """
        return run_catalog(self.name, self.uri, self.warehouse, self.properties_json)

    def load(self):
        """pyiceberg's catalog (``pyiceberg.catalog.Catalog``) on this catalog."""
        return load_catalog(self.catalog_settings())


__all__ = ["IcebergCatalogResource"]
