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
and :func:`expand_env_references`
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

from pydantic import ValidationError
from pydantic_settings import EnvSettingsSource
from pydantic_settings.sources.utils import parse_env_vars

from kafka_iceberg.catalog.config import (  # noqa: F401 (re-exported)
    CatalogConfig,
    CatalogSettings,
    catalog_config_from_env,
    catalog_from_uri,
    catalog_properties_from_env,
    resolve_catalog,
)
from kafka_iceberg.config.models import (
    DEFAULT_SLACK_TIMEOUT_S,
    ORPHAN_CLOCK_SKEW_S,
    DevHooks,
    DevSettings,
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
        ConfigError: a value the group rejects, naming the variable (and the key, inside a variable of
            key=value items), e.g. ``LAKE_KAFKA_TIMEOUT_S must be a number, got 'soon'`` or
            ``LAKE_DEV_HOOKS catalog_retry_s must not be negative, got '-1'``.
    """
    try:
        return group(**_MappingSource(group, env)())
    except ValidationError as exc:
        err = exc.errors()[0]
        var = str(err["loc"][0]) if err["loc"] else group.__name__
        shown = "a value not shown (it may hold a secret)" if var in NEVER_SHOWN else repr(env.get(var))
        if len(err["loc"]) > 1 and var not in NEVER_SHOWN:  # one key of a key=value variable
            var, shown = " ".join(map(str, err["loc"])), repr(err["input"])
        raise ConfigError(f"{var} {_problem(err)}, got {shown}") from exc


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


def dev_defaults(env: Mapping[str, str] | None = None) -> bool:
    """``LAKE_DEV`` is 1 (or true) in ``env`` (default: the process environment): the repository's make
    targets, ``workspace.yaml`` (``devtools/dev_location.py``) and ``tests/conftest.py`` set it, and
    only there do the dev broker, the SQLite catalog under ``LAKE_HOME`` and the demo's tables apply."""
    return _process_env(env).get("LAKE_DEV", "").strip().lower() in ("1", "true", "yes")


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


DRIVER_MEMORY = "2g"  # spark.driver.memory unless LAKE_SPARK_CONF sets it: planning and commits, not data


def _spark_sizing(conf: Mapping[str, str]) -> dict:
    """``LAKE_SPARK_CONF`` split into the driver memory (``spark.driver.memory``, also the run pods' size),
    the extra jars (``spark.jars``, comma-separated, appended to the derived ones) and the rest."""
    rest = dict(conf)
    memory = rest.pop("spark.driver.memory", DRIVER_MEMORY)
    jars = tuple(j.strip() for j in rest.pop("spark.jars", "").split(",") if j.strip())
    return {"spark_driver_memory": memory, "spark_extra_jars": jars, "spark_conf": rest}


@dataclass(frozen=True)
class Settings:
    """All runtime settings. Build with :func:`load_settings`; see docs/configuration.md. The
    variables, their defaults and units are the fields of :mod:`kafka_iceberg.config.models`."""

    lake_home: Path
    tables_file: Path | None  # LAKE_TABLES_FILE; None: the tables are the Component instances of the defs folder
    defs_module: str  # LAKE_DEFS_MODULE: that defs folder, an importable module name
    tables_declared: bool  # LAKE_TABLES_FILE or LAKE_DEFS_MODULE is set (or LAKE_DEV=1 serves the demo's)
    dev: bool  # LAKE_DEV=1: the development defaults apply (dev_defaults)
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


NEVER_SHOWN = frozenset({"KAFKA_CLIENT_CONFIG", "LAKE_SCHEMA_REGISTRY_CONFIG", "SLACK_BOT_TOKEN", "LAKE_CATALOG_URI"})
"""Variables whose value an error message never repeats (credentials may be inside)."""

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
    """:class:`Settings` from ``env`` (empty values already removed). ``LAKE_DEV`` is the process's
    mode: set in ``env`` or in the process environment.

    Raises:
        ConfigError: see :func:`load_settings` and :func:`_deployment_choices`.
    """
    run: RuntimeSettings = _group(RuntimeSettings, env)
    dev = run.dev or dev_defaults()
    lake_home = (run.lake_home or CHECKOUT / ".lake").resolve()
    bootstrap, catalog = _deployment_choices(run, env, dev, lake_home)
    hooks = _group(DevSettings, env).hooks if dev else DevHooks()  # constants outside LAKE_DEV
    slack = slack_settings(env)
    return Settings(
        lake_home=lake_home,
        tables_file=run.tables_file.resolve() if run.tables_file else None,
        defs_module=run.defs_module or DEMO_DEFS,
        tables_declared=dev or run.tables_file is not None or run.defs_module is not None,
        dev=dev,
        kafka_bootstrap_servers=bootstrap or f"127.0.0.1:{DEV_BROKER_PORT}",
        kafka_client_config=dict(run.kafka_client_config),
        use_dev_broker=not bootstrap,
        catalog=catalog,
        spark_master=run.spark_master,
        spark_local_ip=run.spark_local_ip,
        **_spark_sizing(run.spark_conf),
        kafka_timeout_s=run.kafka_timeout_s,
        read_timeout_s=hooks.read_timeout_s,
        max_records_per_task=run.max_records_per_task,
        attempt_timeout_s=hooks.attempt_timeout_s,
        orphan_clock_skew_s=ORPHAN_CLOCK_SKEW_S,
        catalog_retry_s=hooks.catalog_retry_s,
        dagster_executor=run.dagster_executor,
        dagster_ui_url=slack.ui_url,
        dagster_home_dir=run.dagster_home.resolve() if run.dagster_home else None,
        stream=_group(StreamSettings, env),
        slack=slack,
        registry=registry_settings(env),
        pyspark_python=run.pyspark_python or sys.executable,
        from_process_env=frozenset(k for k in env if k in SECRET_BEARING or k.startswith("PYICEBERG_CATALOG__"))
        if from_process
        else frozenset(),
    )


DEMO_DEFS = "kafka_iceberg.defs"
"""The defs folder of the demo's tables: the default ``LAKE_DEFS_MODULE`` under ``LAKE_DEV=1`` only."""


def _deployment_choices(run: RuntimeSettings, env: dict[str, str], dev: bool, lake_home: Path):
    """The Kafka bootstrap servers ("" for the dev broker) and the catalog. Under ``LAKE_DEV`` the dev
    broker and a SQLite catalog with its warehouse under ``LAKE_HOME`` are the defaults; elsewhere
    each must be configured, and a local SQLite catalog cannot index a warehouse in object storage
    (the catalog would be lost with the pod while the data stays).

    Raises:
        ConfigError: one line naming the missing or conflicting setting.
    """
    bootstrap = run.kafka_bootstrap_servers.strip()
    props = catalog_properties_from_env(env, run.catalog_name) or {}
    if dev:
        uri = run.catalog_uri or f"sqlite:///{lake_home / 'catalog.db'}"
        return bootstrap, resolve_catalog(
            env, run.catalog_name, uri, run.warehouse or f"file://{lake_home / 'warehouse'}"
        )
    if not bootstrap:
        raise ConfigError("KAFKA_BOOTSTRAP_SERVERS is not set: name the Kafka brokers (host:port,...)")
    if "type" not in props and not run.catalog_uri:
        raise ConfigError(
            "LAKE_CATALOG_PROPERTIES (or LAKE_CATALOG_URI) is not set: name the Iceberg catalog (docs/configuration.md)"
        )
    if props.get("type", "sql") in ("sql", "jdbc") and "warehouse" not in props and not run.warehouse:
        raise ConfigError("LAKE_WAREHOUSE is not set: name the table data location (s3://bucket/prefix, file:///abs)")
    catalog = resolve_catalog(env, run.catalog_name, run.catalog_uri or "", run.warehouse or "")
    if catalog.is_sqlite and not catalog.warehouse.startswith(("file:", "/")):
        setting = "LAKE_CATALOG_PROPERTIES" if "type" in props else "LAKE_CATALOG_URI"
        raise ConfigError(
            f"{setting} names a local SQLite catalog but the warehouse {catalog.warehouse!r} is object storage: "
            "use a shared catalog (PostgreSQL, REST, Glue, ...)"
        )
    return bootstrap, catalog


def require_declared_tables(settings: Settings) -> None:
    """Refuse a code location with no declared tables (outside ``LAKE_DEV``, the demo's tables are
    never a default).

    Raises:
        ConfigError: neither ``LAKE_TABLES_FILE`` nor ``LAKE_DEFS_MODULE`` is set.
    """
    if not settings.tables_declared:
        raise ConfigError(
            "LAKE_TABLES_FILE (or LAKE_DEFS_MODULE) is not set: no tables are declared (docs/configuration.md)"
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
