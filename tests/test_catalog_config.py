"""One catalog configuration (pyiceberg properties) translated for pyiceberg and for Spark.

Translation is checked for every catalog type; the SQLite catalog is also run end to end:
pyiceberg writes through ``load_catalog(**props)``, the session's real Spark reads and writes
through the translated ``spark.sql.catalog.<name>.*`` settings, and each sees the other's rows.
"""

from __future__ import annotations

import dataclasses
import json

import pyarrow as pa
import pytest

from kafka_iceberg.catalog.config import S3_FILE_IO, S3_ONLY_CLIENT_FACTORY, CatalogConfig, catalog_config_from_env
from kafka_iceberg.config.settings import load_settings
from kafka_iceberg.errors import ConfigError


def spark_keys(cfg: CatalogConfig) -> dict[str, str]:
    """The Spark settings without the ``spark.sql.catalog.<name>.`` prefix."""
    prefix = f"spark.sql.catalog.{cfg.name}"
    props = cfg.spark_properties()
    assert props[prefix] == "org.apache.iceberg.spark.SparkCatalog"
    return {k[len(prefix) + 1 :]: v for k, v in props.items() if k != prefix}


def test_sql_sqlite():
    cfg = CatalogConfig("lake", {"type": "sql", "uri": "sqlite:////data/cat.db", "warehouse": "file:///data/wh"})
    assert cfg.pyiceberg_properties() == {
        "type": "sql",
        "uri": "sqlite:////data/cat.db",
        "warehouse": "file:///data/wh",
    }
    spark = spark_keys(cfg)
    assert spark["type"] == "jdbc" and spark["uri"] == "jdbc:sqlite:/data/cat.db"
    assert spark["warehouse"] == "file:///data/wh" and spark["jdbc.schema-version"] == "V1"
    assert "io-impl" not in spark and "jdbc.user" not in spark


def test_sql_postgres_password_from_the_environment():
    env = {
        "LAKE_CATALOG_PROPERTIES": json.dumps(
            {
                "type": "sql",
                "uri": "postgresql://lake@db.svc:5433/iceberg",
                "warehouse": "s3://lake/wh",
                "s3.region": "eu-west-1",
            }
        ),
        "PYICEBERG_CATALOG__LAKE__PASSWORD": "p@ss",
    }
    cfg = catalog_config_from_env(env)
    assert cfg.pyiceberg_properties()["uri"] == "postgresql+psycopg2://lake:p@ss@db.svc:5433/iceberg"
    assert "password" not in cfg.pyiceberg_properties()
    spark = spark_keys(cfg)
    assert spark["uri"] == "jdbc:postgresql://db.svc:5433/iceberg"
    assert (spark["jdbc.user"], spark["jdbc.password"]) == ("lake", "p@ss")
    assert spark["io-impl"] == S3_FILE_IO and spark["client.region"] == "eu-west-1"
    assert spark["s3.client-factory-impl"] == S3_ONLY_CLIENT_FACTORY
    assert "p@ss" not in repr(cfg)


def test_jdbc_alias_takes_java_spelling():
    cfg = CatalogConfig(
        "lake",
        {
            "type": "jdbc",
            "uri": "jdbc:postgresql://db:5432/ice",
            "jdbc.user": "u",
            "jdbc.password": "pw",
            "warehouse": "file:///wh",
        },
    )
    assert cfg.type == "sql"
    assert cfg.pyiceberg_properties() == {
        "type": "sql",
        "uri": "postgresql+psycopg2://u:pw@db:5432/ice",
        "warehouse": "file:///wh",
    }
    assert spark_keys(cfg)["uri"] == "jdbc:postgresql://db:5432/ice" and spark_keys(cfg)["type"] == "jdbc"


def test_rest_with_credential_from_a_secret_directory(tmp_path):
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "credential").write_text("client-id:client-secret\n")
    (secrets / "s3.secret-access-key").write_text("sk")
    (secrets / ".hidden").write_text("kubernetes bookkeeping")
    env = {
        "LAKE_CATALOG_PROPERTIES": json.dumps(
            {
                "type": "rest",
                "uri": "https://catalog.example.com/api/catalog",
                "warehouse": "prod",
                "scope": "PRINCIPAL_ROLE:ALL",
                "header.X-Iceberg-Access-Delegation": "vended-credentials",
            }
        ),
        "LAKE_CATALOG_SECRETS_DIR": str(secrets),
    }
    cfg = catalog_config_from_env(env)
    py = cfg.pyiceberg_properties()
    assert py["type"] == "rest" and py["credential"] == "client-id:client-secret" and py["s3.secret-access-key"] == "sk"
    assert ".hidden" not in py
    spark = spark_keys(cfg)
    assert spark["type"] == "rest" and spark["uri"] == "https://catalog.example.com/api/catalog"
    assert spark["credential"] == "client-id:client-secret" and spark["scope"] == "PRINCIPAL_ROLE:ALL"
    assert spark["header.X-Iceberg-Access-Delegation"] == "vended-credentials"
    assert "io-impl" not in spark  # the warehouse is a name; the REST server says where files live


def test_glue():
    cfg = CatalogConfig(
        "lake",
        {
            "type": "glue",
            "glue.region": "us-east-2",
            "glue.id": "123456789012",
            "warehouse": "s3://lake-bucket/warehouse",
        },
    )
    assert cfg.pyiceberg_properties() == {
        "type": "glue",
        "glue.region": "us-east-2",
        "glue.id": "123456789012",
        "warehouse": "s3://lake-bucket/warehouse",
    }
    spark = spark_keys(cfg)
    assert spark["type"] == "glue" and spark["glue.id"] == "123456789012" and spark["client.region"] == "us-east-2"
    assert spark["io-impl"] == S3_FILE_IO
    assert "s3.client-factory-impl" not in spark  # the Glue client needs Iceberg's full AWS client factory


def test_hive():
    cfg = CatalogConfig(
        "lake",
        {
            "type": "hive",
            "uri": "thrift://metastore:9083",
            "warehouse": "s3://b/wh",
            "io-impl": "org.apache.iceberg.hadoop.HadoopFileIO",
        },
    )
    assert cfg.pyiceberg_properties() == {"type": "hive", "uri": "thrift://metastore:9083", "warehouse": "s3://b/wh"}
    spark = spark_keys(cfg)
    assert spark["type"] == "hive" and spark["uri"] == "thrift://metastore:9083"
    assert spark["io-impl"] == "org.apache.iceberg.hadoop.HadoopFileIO"  # an explicit io-impl is kept


def test_nessie_goes_through_its_iceberg_rest_endpoint():
    cfg = CatalogConfig(
        "lake", {"type": "nessie", "uri": "http://nessie:19120/api/v2", "nessie.ref": "main", "warehouse": "s3://b/wh"}
    )
    assert cfg.pyiceberg_properties() == {
        "type": "rest",
        "uri": "http://nessie:19120/iceberg/main",
        "warehouse": "s3://b/wh",
    }
    spark = spark_keys(cfg)
    assert spark["type"] == "rest" and spark["uri"] == "http://nessie:19120/iceberg/main" and "nessie.ref" not in spark


def test_pyiceberg_environment_spelling():
    env = {
        "PYICEBERG_CATALOG__LAKE__TYPE": "rest",
        "PYICEBERG_CATALOG__LAKE__URI": "http://r:8181",
        "PYICEBERG_CATALOG__LAKE__S3__ACCESS_KEY_ID": "ak",
        "PYICEBERG_CATALOG__OTHER__URI": "http://x",
    }
    cfg = catalog_config_from_env(env)
    assert cfg.properties == {"type": "rest", "uri": "http://r:8181", "s3.access-key-id": "ak"}


@pytest.mark.parametrize(
    "env, message",
    [
        ({"LAKE_CATALOG_PROPERTIES": '{"type": "rest", "uri": "http://r", "credential": "a:b"}'}, "holds credentials"),
        ({"LAKE_CATALOG_PROPERTIES": '{"type": "mysql", "uri": "x"}'}, "type must be one of"),
        ({"LAKE_CATALOG_PROPERTIES": '{"type": "rest"}'}, "needs a uri"),
        ({"LAKE_CATALOG_PROPERTIES": "[1]"}, "JSON object"),
        ({"LAKE_CATALOG_PROPERTIES": '{"type": "sql", "uri": "mysql://h/db"}'}, "not supported"),
        ({"LAKE_CATALOG_SECRETS_DIR": "/nonexistent/dir"}, "not a directory"),
    ],
)
def test_bad_configurations_are_rejected(env, message):
    with pytest.raises(ConfigError, match=message):
        cfg = catalog_config_from_env(env)
        cfg.spark_properties()


def test_settings_use_the_catalog_properties(tmp_path):
    base = {"LAKE_HOME": str(tmp_path)}
    assert catalog_config_from_env(base) is None
    legacy = load_settings(env=base).catalog
    assert legacy.config.spark_properties()["spark.sql.catalog.lake.uri"] == legacy.jdbc_uri  # one path for both
    rest = load_settings(env={**base, "LAKE_CATALOG_PROPERTIES": '{"type": "rest", "uri": "http://r:8181"}'}).catalog
    assert rest.config.type == "rest" and not rest.is_sqlite
    sql = load_settings(env={**base, "LAKE_CATALOG_PROPERTIES": '{"type": "sql", "uri": "sqlite:////x/c.db"}'}).catalog
    assert sql.is_sqlite and sql.warehouse == f"file://{tmp_path}/warehouse"


def test_one_config_drives_pyiceberg_and_spark(spark, tmp_path, unique):
    """A real SQLite catalog: pyiceberg writes, Spark (the session's local[2]) reads and appends, pyiceberg reads."""
    name = f"cfg_{unique}"
    cfg = CatalogConfig(
        name, {"type": "sql", "uri": f"sqlite:///{tmp_path}/catalog.db", "warehouse": f"file://{tmp_path}/wh"}
    )
    (tmp_path / "wh").mkdir()
    catalog = cfg.load()
    catalog.create_namespace("db")
    table = catalog.create_table("db.events", schema=pa.schema([pa.field("id", pa.int64())]))
    table.append(pa.table({"id": pa.array(range(7), pa.int64())}))
    for key, value in cfg.spark_properties().items():
        spark.conf.set(key, value)
    assert spark.table(f"{name}.db.events").count() == 7
    spark.sql(f"INSERT INTO {name}.db.events VALUES (7), (8)")
    assert catalog.load_table("db.events").scan().to_arrow().num_rows == 9


def test_a_sqlite_catalog_commits_beside_an_open_reader_and_spark(spark, tmp_path, unique):
    """The product's SQLite catalog is in WAL mode (``synchronous=NORMAL``): pyiceberg commits while another
    connection holds a read transaction (in rollback-journal mode the commit waits out SQLite's busy
    timeout and fails with "database is locked"), and Spark's JDBC catalog commits on the same file."""
    import sqlite3

    from kafka_iceberg.catalog.tables import load_catalog

    db = tmp_path / "catalog.db"
    props = {"type": "sql", "uri": f"sqlite:///{db}", "warehouse": f"file://{tmp_path}/wh"}
    cat = CatalogConfig(f"wal_{unique}", props).to_catalog_settings()
    assert cat.is_sqlite
    catalog = load_catalog(cat)
    catalog.create_namespace("db")
    table = catalog.create_table("db.events", schema=pa.schema([pa.field("id", pa.int64())]))
    with catalog.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 1  # NORMAL
    reader = sqlite3.connect(db, timeout=1, isolation_level=None)
    assert reader.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    reader.execute("BEGIN")
    assert reader.execute("SELECT count(*) FROM iceberg_tables").fetchone() == (1,)  # a read transaction, held
    table.append(pa.table({"id": pa.array(range(7), pa.int64())}))
    reader.execute("COMMIT")
    reader.close()
    for key, value in cat.config.spark_properties().items():
        spark.conf.set(key, value)
    spark.sql(f"INSERT INTO {cat.name}.db.events VALUES (7), (8)")
    assert catalog.load_table("db.events").scan().to_arrow().num_rows == 9


@pytest.mark.parametrize("uri", ["sqlite:////data/lake/catalog.db", "postgresql://lake:pw@db.svc:5432/iceberg"])
def test_legacy_uri_config_gives_todays_spark_settings(uri):
    """``LAKE_CATALOG_URI`` alone yields a config whose Spark settings equal kafka_iceberg.catalog.spark.catalog_conf's,
    so catalog.py can switch to ``cat.config.spark_properties()`` without changing a JDBC deployment."""
    from kafka_iceberg.catalog.spark import catalog_conf
    from kafka_iceberg.config.settings import catalog_from_uri

    cat = catalog_from_uri("lake", uri, "file:///data/lake/warehouse")
    assert cat.config.spark_properties() == jdbc_catalog_conf_before_the_switch(cat)
    assert catalog_conf(cat) == cat.config.spark_properties()
    assert (
        catalog_conf(dataclasses.replace(cat, config=None)) == cat.config.spark_properties()
    )  # settings without a config
    py = cat.config.pyiceberg_properties()
    assert (py["uri"], py["warehouse"]) == (cat.sqlalchemy_uri, cat.warehouse)


def jdbc_catalog_conf_before_the_switch(cat) -> dict[str, str]:
    """kafka_iceberg.catalog.spark.catalog_conf as it was before it used the catalog config (JDBC only)."""
    prefix = f"spark.sql.catalog.{cat.name}"
    conf = {
        prefix: "org.apache.iceberg.spark.SparkCatalog",
        f"{prefix}.type": "jdbc",
        f"{prefix}.uri": cat.jdbc_uri,
        f"{prefix}.jdbc.schema-version": "V1",
        f"{prefix}.jdbc.init-catalog-tables": "false",
        f"{prefix}.warehouse": cat.warehouse,
        f"{prefix}.cache-enabled": "false",
    }
    if cat.jdbc_user:
        conf[f"{prefix}.jdbc.user"] = cat.jdbc_user
    if cat.jdbc_password:
        conf[f"{prefix}.jdbc.password"] = cat.jdbc_password
    return conf
