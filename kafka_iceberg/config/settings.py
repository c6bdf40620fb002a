"""Every runtime setting, with its default and its environment variable: the one module of the
product packages that reads (or sets) the process environment (``tests/test_layout.py`` holds it).

:func:`load_settings` reads everything into one frozen :class:`Settings`, once per process and
environment (a cache keyed by the environment's contents, so a changed variable gives new settings);
reading opens no connection. The variables, defaults and units are the pydantic-settings groups of
:mod:`kafka_iceberg.config.models`, read here through pydantic-settings' environment source over the
process environment or an explicit mapping (empty values are unset; a bad value is a
:class:`~kafka_iceberg.errors.ConfigError` naming the variable). ``docs/configuration.md`` lists them.
Parts that must load even when another variable is malformed have their own loaders, used by
``load_settings`` too:
:func:`slack_settings` (alerts never fail), :func:`registry_settings` (Schema Registry credentials),
:func:`debug_enabled` (``LAKE_DEBUG``, for the CLI's error path) and :func:`expand_env_references`
(``${VAR}`` in a declared registry URL). :func:`run_catalog` resolves a Dagster resource's catalog
with the credentials of the run's environment; :func:`export_spark_environment` sets Spark's
child-process variables. ``LAKE_CRASH_AT`` (failure rehearsal) is read only by devtools/rehearsal/faults.py.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import get_args
from urllib.parse import unquote, urlparse

from pydantic import ValidationError
from pydantic_settings import EnvSettingsSource
from pydantic_settings.sources.utils import parse_env_vars

from kafka_iceberg.catalog.config import CatalogConfig, CatalogSettings, catalog_config_from_env  # noqa: F401 (re-exported)
from kafka_iceberg.config.models import (
    DEFAULT_SLACK_TIMEOUT_S,
    EnvGroup,
    RegistrySettings,
    RuntimeSettings,
    SlackSettings,
    StreamSettings,
)
from kafka_iceberg.errors import ConfigError

PACKAGE_DIR = Path(__file__).resolve().parents[1]
"""The installed ``kafka_iceberg`` package."""
CHECKOUT = PACKAGE_DIR.parent
"""The project checkout, in an editable install (``make install``)."""


DEV_BROKER_PORT = 19092
"""TCP port of the local noida-db dev broker that ``make demo`` starts."""


log = logging.getLogger(__name__)


class _MappingSource(EnvSettingsSource):
    """pydantic-settings' environment source over an explicit mapping (the process environment or a test's)."""

    def __init__(self, group: type[EnvGroup], env: Mapping[str, str]):
        self._mapping = env
        super().__init__(group, case_sensitive=True, env_ignore_empty=True)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return parse_env_vars(self._mapping, self.case_sensitive, self.env_ignore_empty, self.env_parse_none_str)


_PHRASES = {
    "float_parsing": "must be a number",
    "float_type": "must be a number",
    "int_parsing": "must be a whole number",
    "int_type": "must be a whole number",
    "int_from_float": "must be a whole number",
}
_BOUNDS = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}


def _problem(err: dict) -> str:
    """What is wrong with one value, e.g. ``must be a number`` or ``must not be negative``."""
    kind, ctx = err["type"], err.get("ctx") or {}
    if kind in _PHRASES:
        return _PHRASES[kind]
    if kind == "greater_than_equal" and ctx.get("ge") == 0:
        return "must not be negative"
    if kind in _BOUNDS:
        return f"must be {_BOUNDS[kind]} {next(iter(ctx.values()), '?')}"
    if kind == "literal_error":
        return f"must be one of {ctx.get('expected')}"
    return err["msg"].removeprefix("Value error, ")


def _group(group: type[EnvGroup], env: Mapping[str, str]):
    """The settings group ``group`` from the variables of ``env`` (empty values already removed).

    Raises:
        ConfigError: a value the group rejects, naming the variable, e.g.
            ``LAKE_KAFKA_TIMEOUT_S must be a number, got 'soon'``.
    """
    try:
        return group(**_MappingSource(group, env)())
    except ValidationError as exc:
        err = exc.errors()[0]
        var = str(err["loc"][0]) if err["loc"] else group.__name__
        raise ConfigError(f"{var} {_problem(err)}, got {env.get(var)!r}") from exc


def _process_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: the process environment) without empty values (empty = unset)."""
    return {k: v for k, v in (os.environ if env is None else env).items() if v.strip()}


def slack_settings(env: Mapping[str, str] | None = None) -> SlackSettings:
    """The Slack settings from ``env`` (default: the process environment). Never raises: a
    ``SLACK_TIMEOUT_S`` that is not a positive number is logged at ERROR and replaced by the
    default, so a configuration slip cannot fail a run, a check or a sensor tick."""
    env = _process_env(env)
    try:
        return _group(SlackSettings, env)
    except ConfigError as exc:
        log.error("%s; using %s s", exc, DEFAULT_SLACK_TIMEOUT_S)
        return _group(SlackSettings, {k: v for k, v in env.items() if k != "SLACK_TIMEOUT_S"})


def registry_settings(env: Mapping[str, str] | None = None) -> RegistrySettings:
    """The Schema Registry credentials from ``env`` (default: the process environment)."""
    return _group(RegistrySettings, _process_env(env))


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
    """All runtime settings. Build with :func:`load_settings`; see docs/configuration.md. The
    variables, their defaults and units are the fields of :mod:`kafka_iceberg.config.models`."""

    lake_home: Path
    tables_file: Path | None  # LAKE_TABLES_FILE; None: the tables are the Component instances of the defs folder
    defs_module: str  # LAKE_DEFS_MODULE: that defs folder, an importable module name
    kafka_bootstrap_servers: str
    kafka_client_config: dict[str, str]
    use_dev_broker: bool
    catalog: CatalogSettings
    spark_master: str
    spark_local_ip: str
    spark_driver_memory: str
    spark_extra_jars: tuple[str, ...]
    spark_conf: dict[str, str]
    kafka_timeout_s: float
    read_timeout_s: float
    max_records_per_task: int
    attempt_timeout_s: float
    orphan_clock_skew_s: float
    catalog_retry_s: float
    dagster_executor: str
    dagster_ui_url: str
    dagster_home_dir: Path | None
    stream: StreamSettings
    slack: SlackSettings
    registry: RegistrySettings
    debug: bool
    """``LAKE_DEBUG``: tracebacks and librdkafka log lines in the CLI."""
    pyspark_python: str
    """``PYSPARK_PYTHON``: the interpreter of Spark's Python workers (default: this one)."""
    from_process_env: frozenset[str]
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


SECRET_BEARING = ("KAFKA_CLIENT_CONFIG", "LAKE_CATALOG_URI", "LAKE_CATALOG_PROPERTIES", "LAKE_CATALOG_SECRETS_DIR")
"""Variables that may hold a secret (``sasl.password`` in the librdkafka properties, the database
password in a catalog URI), plus ``PYICEBERG_CATALOG__*`` (credentials of the catalog config)."""

DAGSTER_EXECUTORS = get_args(RuntimeSettings.model_fields["dagster_executor"].annotation)
"""Values of ``LAKE_DAGSTER_EXECUTOR``: the executor of the code location's jobs."""


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
    run: RuntimeSettings = _group(RuntimeSettings, env)
    lake_home = (run.lake_home or CHECKOUT / ".lake").resolve()
    bootstrap = run.kafka_bootstrap_servers.strip()
    warehouse = run.warehouse or f"file://{lake_home / 'warehouse'}"
    catalog_uri = run.catalog_uri or f"sqlite:///{lake_home / 'catalog.db'}"
    slack = slack_settings(env)
    return Settings(
        lake_home=lake_home,
        tables_file=run.tables_file.resolve() if run.tables_file else None,
        defs_module=run.defs_module,
        kafka_bootstrap_servers=bootstrap or f"127.0.0.1:{DEV_BROKER_PORT}",
        kafka_client_config=dict(run.kafka_client_config),
        use_dev_broker=not bootstrap,
        catalog=resolve_catalog(env, run.catalog_name, catalog_uri, warehouse),
        spark_master=run.spark_master,
        spark_local_ip=run.spark_local_ip,
        spark_driver_memory=run.spark_driver_memory,
        spark_extra_jars=run.spark_extra_jars,
        spark_conf=dict(run.spark_conf),
        kafka_timeout_s=run.kafka_timeout_s,
        read_timeout_s=run.read_timeout_s,
        max_records_per_task=run.max_records_per_task,
        attempt_timeout_s=run.attempt_timeout_s,
        orphan_clock_skew_s=run.orphan_clock_skew_s,
        catalog_retry_s=run.catalog_retry_s,
        dagster_executor=run.dagster_executor,
        dagster_ui_url=slack.ui_url,
        dagster_home_dir=run.dagster_home.resolve() if run.dagster_home else None,
        stream=_group(StreamSettings, env),
        slack=slack,
        registry=registry_settings(env),
        debug=debug_enabled(env),
        pyspark_python=run.pyspark_python or sys.executable,
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
