"""Every runtime setting, with its default and its environment variable.

All runtime settings of the write path and the Dagster layer are read from the process
environment by :func:`load_settings` (``docs/configuration.md`` mirrors it); reading them opens
no connection. The only other variables the project reads are ``PYSPARK_PYTHON`` (Spark's own),
``LAKE_CRASH_AT`` (failure rehearsal, devtools/faults.py, read only by dev tooling) and the Slack alert settings
``SLACK_*`` and ``DAGSTER_UI_URL`` (kafka_iceberg/alerts.py).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlparse

from kafka_iceberg.catalog_config import CatalogConfig, catalog_config_from_env
from kafka_iceberg.errors import ConfigError

CHECKOUT = Path(__file__).resolve().parents[1]
"""The project checkout (the package is installed in editable mode)."""

DEV_BROKER_PORT = 19092
"""TCP port of the local noida-db dev broker that ``make demo`` starts."""


@dataclass(frozen=True)
class CatalogSettings:
    """Where the Iceberg JDBC catalog lives, in the two spellings its two clients need.

    ``name`` is the Iceberg catalog name. It is stored in the ``catalog_name`` column
    of the JDBC catalog tables, so Spark (``spark.sql.catalog.<name>``) and pyiceberg
    (``SqlCatalog(<name>)``) must use the same one to see the same tables.
    """

    name: str
    sqlalchemy_uri: str  # for pyiceberg's SqlCatalog, e.g. sqlite:////abs/catalog.db
    jdbc_uri: str  # for Iceberg's JdbcCatalog in Spark, e.g. jdbc:sqlite:/abs/catalog.db
    jdbc_user: str | None
    jdbc_password: str | None
    warehouse: str  # file:///abs/warehouse or s3://bucket/prefix
    config: CatalogConfig | None = None  # the same catalog as pyiceberg properties (kafka_iceberg.catalog_config)

    @property
    def is_sqlite(self) -> bool:
        """True for the embedded SQLite catalog, which admits one committing process at a time."""
        return self.jdbc_uri.startswith("jdbc:sqlite:")

    @property
    def jdbc_driver_jar(self) -> str:
        """Path of the Debian JDBC driver jar Spark needs for this catalog."""
        return "/usr/share/java/sqlite-jdbc.jar" if self.is_sqlite else "/usr/share/java/postgresql.jar"


@dataclass(frozen=True)
class Settings:
    """All runtime settings. Build with :func:`load_settings`; see docs/configuration.md."""

    lake_home: Path
    tables_file: Path
    kafka_bootstrap_servers: str
    kafka_client_config: dict[str, str]
    use_dev_broker: bool
    catalog: CatalogSettings
    spark_master: str
    spark_local_ip: str
    spark_driver_memory: str
    spark_extra_jars: tuple[str, ...]
    spark_conf: dict[str, str] = field(default_factory=dict)
    kafka_timeout_s: float = 30.0
    read_timeout_s: float = 120.0
    max_records_per_task: int = 250_000
    json_parser: str = "arrow"  # LAKE_JSON_PARSER: "arrow" (pyarrow in the read task) or "spark" (from_json)
    attempt_timeout_s: float = 3600.0
    orphan_clock_skew_s: float = 1.0
    catalog_retry_s: float = 60.0
    dagster_executor: str = "in_process"
    dagster_ui_url: str = "http://127.0.0.1:3000"
    dagster_home_dir: Path | None = None
    from_process_env: frozenset[str] = frozenset()
    """Names of the variables read from the process environment (empty when ``load_settings`` was
    given an explicit ``env``): the Dagster resources refer to secret-bearing ones by name
    (``EnvVar``), so the UI shows the variable, never its value."""

    @property
    def dagster_home(self) -> Path:
        """The Dagster instance directory: ``DAGSTER_HOME``, default ``$LAKE_HOME/dagster``."""
        return self.dagster_home_dir or self.lake_home / "dagster"

    @property
    def broker_data_dir(self) -> Path:
        """``$LAKE_HOME/kafka``: the dev broker's data directory."""
        return self.lake_home / "kafka"


def catalog_from_uri(name: str, uri: str, warehouse: str) -> CatalogSettings:
    """Derive the JDBC (Spark) and SQLAlchemy (pyiceberg) spellings from one URI.

    Accepts ``sqlite:////abs/path/catalog.db`` or
    ``postgresql://user:password@host:port/database``.

    Raises:
        ConfigError: for any other scheme, or a relative SQLite path.
    """
    parsed = urlparse(uri)
    if parsed.scheme == "sqlite":
        path = uri[len("sqlite:///") :]
        if not path.startswith("/"):
            raise ConfigError(f"LAKE_CATALOG_URI must use an absolute SQLite path (sqlite:////abs/catalog.db), got {uri!r}")
        return CatalogSettings(name, uri, f"jdbc:sqlite:{path}", None, None, warehouse,
                               CatalogConfig(name, {"type": "sql", "uri": uri, "warehouse": warehouse}))
    if parsed.scheme in ("postgresql", "postgres", "postgresql+psycopg2"):
        host = parsed.hostname or "127.0.0.1"
        port = parsed.port or 5432
        db = parsed.path.lstrip("/")
        user = unquote(parsed.username) if parsed.username else None
        password = unquote(parsed.password) if parsed.password else None
        sa_uri = "postgresql+psycopg2://" + uri.split("://", 1)[1]
        return CatalogSettings(name, sa_uri, f"jdbc:postgresql://{host}:{port}/{db}", user, password, warehouse,
                               CatalogConfig(name, {"type": "sql", "uri": uri, "warehouse": warehouse}))
    raise ConfigError(f"LAKE_CATALOG_URI scheme {parsed.scheme!r} is not supported; use sqlite:// or postgresql://")


def resolve_catalog(env: dict[str, str], name: str, uri: str, warehouse: str) -> CatalogSettings:
    """The catalog named ``name``: from ``LAKE_CATALOG_PROPERTIES``, ``PYICEBERG_CATALOG__<NAME>__*`` and
    ``LAKE_CATALOG_SECRETS_DIR`` in ``env`` when any is set (a sql catalog without a warehouse gets
    ``warehouse``), else from the legacy ``uri`` (:func:`catalog_from_uri`).

    Raises:
        ConfigError: see :func:`kafka_iceberg.catalog_config.catalog_config_from_env` and :func:`catalog_from_uri`.
    """
    config = catalog_config_from_env(env, name)  # LAKE_CATALOG_PROPERTIES & co. win over LAKE_CATALOG_URI
    if config is None:
        return catalog_from_uri(name, uri, warehouse)
    if config.warehouse is None and config.type == "sql":
        config = CatalogConfig(name, {**config.properties, "warehouse": warehouse})
    return config.to_catalog_settings()


def _json_env(env: dict[str, str], key: str) -> dict[str, str]:
    raw = env.get(key, "").strip()
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{key} must be a JSON object: {exc}") from exc
    if not isinstance(value, dict):
        raise ConfigError(f"{key} must be a JSON object, got {type(value).__name__}")
    return {str(k): str(v) for k, v in value.items()}


def _number(env: dict[str, str], key: str, default: float) -> float:
    raw = env.get(key)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError as exc:
        raise ConfigError(f"{key} must be a number, got {raw!r}") from exc
    if value < 0:
        raise ConfigError(f"{key} must not be negative, got {raw!r}")
    return value


SECRET_BEARING = ("KAFKA_CLIENT_CONFIG", "LAKE_CATALOG_URI", "LAKE_CATALOG_PROPERTIES", "LAKE_CATALOG_SECRETS_DIR")
"""Variables that may hold a secret (``sasl.password`` in the librdkafka properties, the database
password in a catalog URI), plus ``PYICEBERG_CATALOG__*`` (credentials of the catalog config)."""

DAGSTER_EXECUTORS = ("in_process", "multiprocess", "k8s")
"""Values of ``LAKE_DAGSTER_EXECUTOR``: the executor of the code location's jobs."""


def _choice(env: dict[str, str], key: str, default: str, choices: tuple[str, ...]) -> str:
    value = env.get(key, default)
    if value not in choices:
        raise ConfigError(f"{key} must be one of {', '.join(choices)}, got {value!r}")
    return value


def load_settings(env: dict[str, str] | None = None) -> Settings:
    """Read every setting from ``env`` (default: ``os.environ``).

    Returns:
        A frozen :class:`Settings`. Paths are absolute.

    Raises:
        ConfigError: a malformed value (bad JSON, a non-numeric number, an unsupported catalog URI).
    """
    from_process = env is None
    env = {k: v for k, v in (os.environ if env is None else env).items() if v.strip()}  # empty = unset
    lake_home = Path(env.get("LAKE_HOME") or CHECKOUT / ".lake").resolve()
    bootstrap = env.get("KAFKA_BOOTSTRAP_SERVERS", "").strip()
    warehouse = env.get("LAKE_WAREHOUSE") or f"file://{lake_home / 'warehouse'}"
    catalog_uri = env.get("LAKE_CATALOG_URI") or f"sqlite:///{lake_home / 'catalog.db'}"
    catalog = resolve_catalog(env, env.get("LAKE_CATALOG_NAME", "lake"), catalog_uri, warehouse)
    jars = tuple(j for j in env.get("LAKE_SPARK_JARS", "").split(",") if j.strip())
    return Settings(
        lake_home=lake_home,
        tables_file=Path(env.get("LAKE_TABLES_FILE") or CHECKOUT / "lake_assets" / "tables.yaml").resolve(),
        kafka_bootstrap_servers=bootstrap or f"127.0.0.1:{DEV_BROKER_PORT}",
        kafka_client_config=_json_env(env, "KAFKA_CLIENT_CONFIG"),
        use_dev_broker=not bootstrap,
        catalog=catalog,
        spark_master=env.get("SPARK_MASTER", "local[*]"),
        spark_local_ip=env.get("SPARK_LOCAL_IP", "127.0.0.1"),
        spark_driver_memory=env.get("LAKE_SPARK_DRIVER_MEMORY", "2g"),
        spark_extra_jars=jars,
        spark_conf=_json_env(env, "LAKE_SPARK_CONF"),
        kafka_timeout_s=_number(env, "LAKE_KAFKA_TIMEOUT_S", 30.0),
        read_timeout_s=_number(env, "LAKE_READ_TIMEOUT_S", 120.0),
        max_records_per_task=int(_number(env, "LAKE_MAX_RECORDS_PER_TASK", 250_000)),
        json_parser=_choice(env, "LAKE_JSON_PARSER", "arrow", ("arrow", "spark")),
        attempt_timeout_s=_number(env, "LAKE_ATTEMPT_TIMEOUT_S", 3600.0),
        orphan_clock_skew_s=_number(env, "LAKE_ORPHAN_CLOCK_SKEW_S", 1.0),
        catalog_retry_s=_number(env, "LAKE_CATALOG_RETRY_S", 60.0),
        dagster_executor=_choice(env, "LAKE_DAGSTER_EXECUTOR", "in_process", DAGSTER_EXECUTORS),
        dagster_ui_url=env.get("DAGSTER_UI_URL", "http://127.0.0.1:3000"),
        dagster_home_dir=Path(env["DAGSTER_HOME"]).resolve() if env.get("DAGSTER_HOME") else None,
        from_process_env=frozenset(k for k in env if k in SECRET_BEARING or k.startswith("PYICEBERG_CATALOG__"))
        if from_process else frozenset(),
    )
