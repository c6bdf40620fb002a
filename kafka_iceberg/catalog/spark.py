"""The Spark session of the write path: the Iceberg runtime jar, the JDBC driver jars and the
``spark.sql.catalog.<name>.*`` settings of the one configured catalog."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from kafka_iceberg.catalog.tables import catalog_config, load_catalog
from kafka_iceberg.config.settings import CatalogSettings, Settings, export_spark_environment
from kafka_iceberg.errors import ConfigError

ICEBERG_JAR = "iceberg-spark-runtime-3.5_2.12-1.10.2.jar"


@lru_cache(maxsize=1)
def iceberg_runtime_jar() -> str:
    """Absolute path of the Iceberg 1.10.2 Spark runtime jar shipped in snowpark-connect-deps-iceberg.

    Raises:
        ConfigError: the package is not installed.
    """
    try:
        import snowpark_connect_deps_iceberg as deps
    except ImportError as exc:  # pragma: no cover - install problem
        raise ConfigError("snowpark-connect-deps-iceberg==1.0.2 is not installed (run make install)") from exc
    return str(deps.get_jar_path(ICEBERG_JAR))


JDBC_DRIVER_JARS = ("/usr/share/java/sqlite-jdbc.jar", "/usr/share/java/postgresql.jar")
"""Debian's JDBC drivers (libxerial-sqlite-jdbc-java, libpostgresql-jdbc-java)."""


def jdbc_driver_jars(cat: CatalogSettings) -> list[str]:
    """The catalog's JDBC driver jar, plus the other Debian driver when installed, so one Spark
    session can also open a second catalog of the other kind."""
    return [cat.jdbc_driver_jar] + [j for j in JDBC_DRIVER_JARS if j != cat.jdbc_driver_jar and Path(j).exists()]


def catalog_conf(cat: CatalogSettings) -> dict[str, str]:
    """The ``spark.sql.catalog.<name>.*`` settings of the catalog, any type
    (:meth:`CatalogConfig.spark_properties`). They are runtime SQL settings, so a running session
    can register another catalog with ``spark.conf.set``."""
    return catalog_config(cat).spark_properties()


def spark_conf(settings: Settings) -> dict[str, str]:
    """Spark configuration for the Iceberg runtime and the JDBC catalog (``spark.sql.catalog.<name>``).

    Includes the master URL, driver memory, the jars (Iceberg runtime, the catalog's
    Debian JDBC driver, ``spark.jars`` of ``LAKE_SPARK_CONF``) and the rest of ``LAKE_SPARK_CONF`` on top.

    Raises:
        ConfigError: a sql/jdbc catalog's JDBC driver jar is missing (install the Debian package; see README).
    """
    cat = settings.catalog
    is_jdbc = catalog_config(cat).type == "sql"
    if is_jdbc and not Path(cat.jdbc_driver_jar).exists():
        raise ConfigError(
            f"{cat.jdbc_driver_jar} is missing: apt-get install libxerial-sqlite-jdbc-java libpostgresql-jdbc-java"
        )
    drivers = jdbc_driver_jars(cat) if is_jdbc else [j for j in JDBC_DRIVER_JARS if Path(j).exists()]
    conf = {
        "spark.master": settings.spark_master,
        "spark.app.name": "kafka-iceberg-lake",
        "spark.driver.memory": settings.spark_driver_memory,
        # executors run the task reader, so they need this interpreter and its packages
        "spark.pyspark.python": settings.pyspark_python,
        "spark.driver.host": settings.spark_local_ip,
        "spark.driver.bindAddress": settings.spark_local_ip,
        "spark.jars": ",".join([iceberg_runtime_jar(), *drivers, *settings.spark_extra_jars]),
        "spark.sql.extensions": "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.shuffle.partitions": "8",
        "spark.ui.showConsoleProgress": "false",
        # a worker runs a session for weeks: keep the UI's history of jobs, stages, tasks and SQL runs short
        # (defaults 1,000 / 1,000 / 100,000 / 1,000), so the driver heap levels off within minutes
        "spark.ui.retainedJobs": "100",
        "spark.ui.retainedStages": "100",
        "spark.ui.retainedTasks": "10000",
        "spark.sql.ui.retainedExecutions": "100",
        # the context cleaner's full GC every 5 min (default 30) frees shuffle and broadcast state steadily
        "spark.cleaner.periodicGC.interval": "5min",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
    }
    conf.update(catalog_conf(cat))
    conf.update(settings.spark_conf)
    return conf


def prepare_spark_environment(settings: Settings) -> None:
    """Set ``SPARK_LOCAL_IP`` and ``PYSPARK_PYTHON`` (default: this interpreter) unless already set
    (:func:`~kafka_iceberg.config.settings.export_spark_environment`),
    and create the JDBC catalog's tables (through pyiceberg) if they do not exist yet.

    PySpark ships ``PYSPARK_PYTHON`` with every Python function, so Python workers import
    this project's packages from the same environment as the driver.
    """
    export_spark_environment(settings.spark_local_ip, settings.pyspark_python)
    load_catalog(
        settings.catalog, settings.catalog_retry_s
    )  # creates the directory and the JDBC catalog tables if missing


def get_spark(settings: Settings):
    """Get or create the process's SparkSession with :func:`spark_conf` (outside Dagster).

    Sets ``SPARK_LOCAL_IP`` first, so Spark binds to loopback by default.
    """
    from pyspark.sql import SparkSession

    prepare_spark_environment(settings)
    builder = SparkSession.builder
    for key, value in spark_conf(settings).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def java_table(spark, qualified_table: str):
    """A Py4J handle to ``qualified_table``'s (``catalog.namespace.table``) ``org.apache.iceberg.Table``,
    loaded through the Spark session's catalog. Iceberg's Java table API (snapshot refs, expiry, orphan
    actions) runs in the driver's JVM without a Spark job. The one place that reaches PySpark's private
    gateway (``_jvm``, ``_jsparkSession``); pinned by ``tests/test_maintenance.py``.

    Raises:
        Py4JJavaError: the table does not exist, or the catalog failed.
    """
    return spark._jvm.org.apache.iceberg.spark.Spark3Util.loadIcebergTable(spark._jsparkSession, qualified_table)


def java_spark_actions(spark):
    """Iceberg's ``SparkActions`` for the session (Spark jobs over a table's files), through the gateway
    of :func:`java_table`."""
    return spark._jvm.org.apache.iceberg.spark.actions.SparkActions.get(spark._jsparkSession)
