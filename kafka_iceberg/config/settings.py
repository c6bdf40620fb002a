"""Every runtime setting, with its default and its environment variable: the one module of the
product packages that reads (or sets) the process environment (``tests/test_layout.py`` holds it).

:func:`load_settings` reads everything into one frozen :class:`Settings`, once per process and
environment (a cache keyed by the environment's contents, so a changed variable gives new settings);
reading opens no connection. ``docs/configuration.md`` mirrors it. Parts that must load even when
another variable is malformed have their own loaders, used by ``load_settings`` too:
:func:`slack_settings` (alerts never fail), :func:`registry_settings` (Schema Registry credentials),
:func:`debug_enabled` (``LAKE_DEBUG``, for the CLI's error path) and :func:`expand_env_references`
(``${VAR}`` in a declared registry URL). :func:`run_catalog` resolves a Dagster resource's catalog
with the credentials of the run's environment; :func:`export_spark_environment` sets Spark's
child-process variables. ``LAKE_CRASH_AT`` (failure rehearsal) is read only by devtools/rehearsal/faults.py.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlparse

from pydantic import BaseModel, ValidationError

from kafka_iceberg.catalog.config import CatalogConfig, CatalogSettings, catalog_config_from_env  # noqa: F401 (re-exported)
from kafka_iceberg.config.models import DEFAULT_SLACK_TIMEOUT_S, RegistrySettings, SlackSettings, StreamSettings
from kafka_iceberg.errors import ConfigError

PACKAGE_DIR = Path(__file__).resolve().parents[1]
"""The installed ``kafka_iceberg`` package."""
CHECKOUT = PACKAGE_DIR.parent
"""The project checkout, in an editable install (``make install``)."""


DEV_BROKER_PORT = 19092
"""TCP port of the local noida-db dev broker that ``make demo`` starts."""


log = logging.getLogger(__name__)


def _model(model: type[BaseModel], env: Mapping[str, str], names: dict[str, str]):
    """``model`` from the variables ``names`` (field -> variable) that are set in ``env``.

    Raises:
        ConfigError: a value the model rejects, naming the variable.
    """
    try:
        return model(**{f: env[v] for f, v in names.items() if env.get(v)})
    except ValidationError as exc:
        err = exc.errors()[0]
        var = names.get(str(err["loc"][0]), str(err["loc"][0]))
        raise ConfigError(f"{var}: {err['msg']}, got {env.get(var)!r}") from exc


def _process_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: the process environment) without empty values (empty = unset)."""
    return {k: v for k, v in (os.environ if env is None else env).items() if v.strip()}


_STREAM_VARS = {"budget_s": "LAKE_STREAM_BUDGET_S", "idle_s": "LAKE_STREAM_IDLE_S", "workers": "LAKE_WORKERS"}
_SLACK_VARS = {
    "token": "SLACK_BOT_TOKEN",
    "channel": "SLACK_CHANNEL",
    "api_base_url": "SLACK_API_BASE_URL",
    "ui_url": "DAGSTER_UI_URL",
    "timeout_s": "SLACK_TIMEOUT_S",
}
_REGISTRY_VARS = {
    "basic_auth": "LAKE_SCHEMA_REGISTRY_BASIC_AUTH",
    "bearer_token": "LAKE_SCHEMA_REGISTRY_BEARER_TOKEN",
    "logical_cluster": "LAKE_SCHEMA_REGISTRY_LOGICAL_CLUSTER",
    "identity_pool": "LAKE_SCHEMA_REGISTRY_IDENTITY_POOL",
    "ca_location": "LAKE_SCHEMA_REGISTRY_CA",
}


def slack_settings(env: Mapping[str, str] | None = None) -> SlackSettings:
    """The Slack settings from ``env`` (default: the process environment). Never raises: a
    ``SLACK_TIMEOUT_S`` that is not a positive number is logged at ERROR and replaced by the
    default, so a configuration slip cannot fail a run, a check or a sensor tick."""
    env = _process_env(env)
    try:
        return _model(SlackSettings, env, _SLACK_VARS)
    except ConfigError as exc:
        log.error("%s; using %s s", exc, DEFAULT_SLACK_TIMEOUT_S)
        return _model(SlackSettings, env, {k: v for k, v in _SLACK_VARS.items() if k != "timeout_s"})


def registry_settings(env: Mapping[str, str] | None = None) -> RegistrySettings:
    """The Schema Registry credentials from ``env`` (default: the process environment)."""
    return _model(RegistrySettings, _process_env(env), _REGISTRY_VARS)


def debug_enabled(env: Mapping[str, str] | None = None) -> bool:
    """``LAKE_DEBUG`` is set (non-empty): the CLI prints tracebacks and librdkafka's log lines."""
    return bool(_process_env(env).get("LAKE_DEBUG"))


_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def expand_env_references(raw: str, what: str, env: Mapping[str, str] | None = None) -> str:
    """``raw`` with every ``${VAR}`` replaced by the variable's value in ``env`` (default: the
    process environment); ``what`` names the setting in the error.

    Raises:
        ConfigError: a referenced variable is unset or empty.
    """
    values = _process_env(env)

    def sub(m: re.Match) -> str:
        if m.group(1) not in values:
            raise ConfigError(f"{what} {raw!r}: environment variable {m.group(1)} is not set")
        return values[m.group(1)]

    return _ENV_REF.sub(sub, raw)


@dataclass(frozen=True)
class Settings:
    """All runtime settings. Build with :func:`load_settings`; see docs/configuration.md."""

    lake_home: Path
    tables_file: Path | None  # LAKE_TABLES_FILE; None: the tables are the Component instances of the defs folder
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
    writer: str = "arrow"  # LAKE_WRITER: "arrow" (the read task writes what pyarrow parsed) or "spark"
    attempt_timeout_s: float = 3600.0
    orphan_clock_skew_s: float = 1.0
    catalog_retry_s: float = 60.0
    dagster_executor: str = "in_process"
    dagster_ui_url: str = "http://127.0.0.1:3000"
    dagster_home_dir: Path | None = None
    stream: StreamSettings = field(default_factory=StreamSettings)
    slack: SlackSettings = field(default_factory=SlackSettings)
    registry: RegistrySettings = field(default_factory=RegistrySettings)
    debug: bool = False
    """``LAKE_DEBUG``: tracebacks and librdkafka log lines in the CLI."""
    pyspark_python: str = sys.executable
    """``PYSPARK_PYTHON``: the interpreter of Spark's Python workers (default: this one)."""
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
            raise ConfigError(
                f"LAKE_CATALOG_URI must use an absolute SQLite path (sqlite:////abs/catalog.db), got {uri!r}"
            )
        return CatalogSettings(
            name,
            uri,
            f"jdbc:sqlite:{path}",
            None,
            None,
            warehouse,
            CatalogConfig(name, {"type": "sql", "uri": uri, "warehouse": warehouse}),
        )
    if parsed.scheme in ("postgresql", "postgres", "postgresql+psycopg2"):
        host = parsed.hostname or "127.0.0.1"
        port = parsed.port or 5432
        db = parsed.path.lstrip("/")
        user = unquote(parsed.username) if parsed.username else None
        password = unquote(parsed.password) if parsed.password else None
        sa_uri = "postgresql+psycopg2://" + uri.split("://", 1)[1]
        return CatalogSettings(
            name,
            sa_uri,
            f"jdbc:postgresql://{host}:{port}/{db}",
            user,
            password,
            warehouse,
            CatalogConfig(name, {"type": "sql", "uri": uri, "warehouse": warehouse}),
        )
    raise ConfigError(f"LAKE_CATALOG_URI scheme {parsed.scheme!r} is not supported; use sqlite:// or postgresql://")


def resolve_catalog(env: dict[str, str], name: str, uri: str, warehouse: str) -> CatalogSettings:
    """The catalog named ``name``: from ``LAKE_CATALOG_PROPERTIES``, ``PYICEBERG_CATALOG__<NAME>__*`` and
    ``LAKE_CATALOG_SECRETS_DIR`` in ``env`` when any is set (a sql catalog without a warehouse gets
    ``warehouse``), else from the legacy ``uri`` (:func:`catalog_from_uri`).

    Raises:
        ConfigError: see :func:`kafka_iceberg.catalog.config.catalog_config_from_env` and :func:`catalog_from_uri`.
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

    Built once per process and environment: without ``env``, the settings are cached under the
    environment's contents, so every caller of a run shares one object and a changed variable (a
    test's ``monkeypatch.setenv``) gives new settings. An explicit ``env`` is read anew.

    Returns:
        A frozen :class:`Settings`. Paths are absolute.

    Raises:
        ConfigError: a malformed value (bad JSON, a non-numeric number, an unsupported catalog URI).
    """
    if env is None:
        return _cached_settings(tuple(sorted(_process_env().items())))
    return _build_settings(_process_env(env), from_process=False)


@functools.lru_cache(maxsize=8)
def _cached_settings(items: tuple[tuple[str, str], ...]) -> Settings:
    return _build_settings(dict(items), from_process=True)


def _build_settings(env: dict[str, str], from_process: bool) -> Settings:
    """:class:`Settings` from ``env`` (empty values already removed)."""
    lake_home = Path(env.get("LAKE_HOME") or CHECKOUT / ".lake").resolve()
    bootstrap = env.get("KAFKA_BOOTSTRAP_SERVERS", "").strip()
    warehouse = env.get("LAKE_WAREHOUSE") or f"file://{lake_home / 'warehouse'}"
    catalog_uri = env.get("LAKE_CATALOG_URI") or f"sqlite:///{lake_home / 'catalog.db'}"
    catalog = resolve_catalog(env, env.get("LAKE_CATALOG_NAME", "lake"), catalog_uri, warehouse)
    jars = tuple(j for j in env.get("LAKE_SPARK_JARS", "").split(",") if j.strip())
    slack = slack_settings(env)
    return Settings(
        lake_home=lake_home,
        tables_file=Path(env["LAKE_TABLES_FILE"]).resolve() if env.get("LAKE_TABLES_FILE") else None,
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
        writer=_choice(env, "LAKE_WRITER", "arrow", ("arrow", "spark")),
        attempt_timeout_s=_number(env, "LAKE_ATTEMPT_TIMEOUT_S", 3600.0),
        orphan_clock_skew_s=_number(env, "LAKE_ORPHAN_CLOCK_SKEW_S", 1.0),
        catalog_retry_s=_number(env, "LAKE_CATALOG_RETRY_S", 60.0),
        dagster_executor=_choice(env, "LAKE_DAGSTER_EXECUTOR", "in_process", DAGSTER_EXECUTORS),
        dagster_ui_url=slack.ui_url,
        dagster_home_dir=Path(env["DAGSTER_HOME"]).resolve() if env.get("DAGSTER_HOME") else None,
        stream=_model(StreamSettings, env, _STREAM_VARS),
        slack=slack,
        registry=registry_settings(env),
        debug=debug_enabled(env),
        pyspark_python=env.get("PYSPARK_PYTHON", sys.executable),
        from_process_env=frozenset(k for k in env if k in SECRET_BEARING or k.startswith("PYICEBERG_CATALOG__"))
        if from_process
        else frozenset(),
    )


@functools.lru_cache(maxsize=32)
def _run_catalog(
    name: str, uri: str, warehouse: str, properties_json: str, items: tuple[tuple[str, str], ...]
) -> CatalogSettings:
    env = dict(items)
    if properties_json.strip():
        env["LAKE_CATALOG_PROPERTIES"] = properties_json
    return resolve_catalog(env, name, uri, warehouse)


def run_catalog(name: str, uri: str, warehouse: str, properties_json: str = "") -> CatalogSettings:
    """The catalog of a Dagster catalog resource (:func:`resolve_catalog` on ``uri``, or on
    ``properties_json`` when given), with the credentials (``PYICEBERG_CATALOG__<NAME>__*``,
    ``LAKE_CATALOG_SECRETS_DIR``) of this process's environment; resolved once per environment.

    Raises:
        ConfigError: see :func:`resolve_catalog`.
    """
    return _run_catalog(name, uri, warehouse, properties_json, tuple(sorted(_process_env().items())))


def export_spark_environment(spark_local_ip: str, pyspark_python: str = sys.executable) -> None:
    """Set ``SPARK_LOCAL_IP`` and ``PYSPARK_PYTHON`` in this process's environment unless already
    set: the variables Spark's JVM and Python workers (child processes) read. The one place the
    product writes the environment."""
    os.environ.setdefault("SPARK_LOCAL_IP", spark_local_ip)
    os.environ.setdefault("PYSPARK_PYTHON", pyspark_python)
