"""The lake as a Dagster Component: ``KafkaIcebergTables``, one instance per ``defs.yaml``.

A ``defs.yaml`` of type ``kafka_iceberg.lake_assets.component.KafkaIcebergTables`` has the
attributes of a ``tables.yaml``: ``defaults`` (:class:`~kafka_iceberg.declaration.models.Defaults`)
and ``tables`` (a list of :class:`~kafka_iceberg.declaration.models.TableEntry`, the pydantic
models of :mod:`kafka_iceberg.declaration.models`); and the instance's own (:class:`InstanceAttributes`):
``key_prefix`` of its resource keys, its Kafka cluster and catalog (unset: the environment's), and
``location_sensors``. ``dg check yaml`` validates them and reports a bad field with its file and
line; ``{{ env.X }}`` templates are resolved by Dagster when the instance loads; then every table is
parsed into a :class:`~kafka_iceberg.declaration.spec.TableSpec` exactly as a ``tables.yaml`` entry is.

One instance is all a code location needs (:func:`lake_definitions`): per table the topic and
table assets and their checks (:func:`table_definitions`); and once per
instance its resources under its own keys (:class:`~kafka_iceberg.resources.ResourceKeys`), the
worker jobs that serve, maintain and fully check its tables with their sensors (``lake_workers``,
``lake_retention``), the replay job, the executor; with ``location_sensors`` the run-failure alert and
run-liveness sensors. Several instances (two Kafka clusters, two catalogs) live in one code location
when their key prefixes differ and one of them brings the location's sensors; their tables must not
share a name, identifier or topic (:func:`component_specs`).
"""

import dataclasses
import functools
import importlib
import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import dagster as dg
from pydantic import BaseModel, Field, ValidationError

from kafka_iceberg import sensors
from kafka_iceberg.batch.worker import assign_workers, worker_count
from kafka_iceberg.config.settings import CHECKOUT, PACKAGE_DIR, SECRET_BEARING, Settings, load_settings, run_catalog
from kafka_iceberg.declaration.models import Defaults, TableEntry, TablesAttributes
from kafka_iceberg.declaration.spec import TableSpec, check_unique, load_table_specs, parse_declarations
from kafka_iceberg.errors import ConfigError
from kafka_iceberg.lake_assets.analytics import KEY as DOWNSTREAM_KEY
from kafka_iceberg.lake_assets.analytics import SOURCE_TABLES, hourly_departure_delay_asset, refresh_sensor
from kafka_iceberg.lake_assets.liveness import liveness_executor
from kafka_iceberg.lake_assets.quality import quarantine_check
from kafka_iceberg.lake_assets.replay import replay_job
from kafka_iceberg.lake_assets.tables import table_asset, table_checks, topic_asset
from kafka_iceberg.lake_assets.worker import worker_job
from kafka_iceberg.resources import LAKE_KEYS, ResourceKeys, default_resources
from kafka_iceberg.schedules.spread import maintenance_crons

DEFS_FILE = "defs.yaml"
SHIPPED_DEFS = "kafka_iceberg.defs"
"""The defs folder shipped with the package: the demo's tables."""


def _plain(context: dg.ResolutionContext, value: Any) -> Any:
    """``value`` (a validated model, or a list or mapping of them) as plain YAML data, as written
    (unset fields left out), with its ``{{ ... }}`` templates resolved."""
    if isinstance(value, BaseModel):
        value = value.model_dump(by_alias=True, exclude_unset=True)
    elif isinstance(value, (list, tuple)):
        value = [v.model_dump(by_alias=True, exclude_unset=True) if isinstance(v, BaseModel) else v for v in value]
    return context.resolve_value(value)


def _resolve_tables(context: dg.ResolutionContext, model: Any) -> list[TableSpec]:
    """The ``tables`` attribute merged over ``defaults`` and parsed into specs.

    Raises:
        ConfigError: a table is invalid beyond its field types (e.g. ``partition_by`` names an
            unknown column); Dagster reports it with the file of the instance.
    """
    defaults = _plain(context.at_path("defaults"), getattr(model, "defaults", None)) or {}
    tables = _plain(context.at_path("tables"), getattr(model, "tables", None)) or []
    source = getattr(context, "source_position_tree", None)
    where = source.position.filename if source is not None else "the component's attributes"
    return parse_declarations({"defaults": defaults, "tables": tables}, str(where))


class InstanceAttributes(TablesAttributes):
    """The attributes of one ``KafkaIcebergTables`` instance: the tables (``defaults``, ``tables``) and
    the lake they live in. Each connection attribute left out is the environment's setting."""

    key_prefix: str = Field(
        LAKE_KEYS.prefix,
        pattern=r"^[a-z][a-z0-9_]*_$",
        description="Prefix of the instance's resource keys (<prefix>kafka, <prefix>catalog, ...); "
        "another instance in the same code location takes another one.",
    )
    kafka_bootstrap_servers: str | None = Field(None, description="Default: KAFKA_BOOTSTRAP_SERVERS.")
    catalog_name: str | None = Field(None, description="Default: LAKE_CATALOG_NAME.")
    catalog_uri: str | None = Field(None, description="Default: LAKE_CATALOG_URI.")
    warehouse: str | None = Field(None, description="Default: LAKE_WAREHOUSE.")
    location_sensors: bool | None = Field(
        None,
        description="Bring the code location's run-failure alert and run-liveness sensors (exactly one "
        "instance of a code location does); default: the instance with the default key_prefix.",
    )


STARTER = """\
# Kafka topics ingested exactly once into Iceberg tables: one entry under `tables` per topic
# (fields: the lake's docs/tables.md). `dg check yaml` validates this file, `dg list defs` lists what
# it defines. Connection attributes left out are the environment's: KAFKA_BOOTSTRAP_SERVERS,
# LAKE_CATALOG_NAME, LAKE_CATALOG_URI, LAKE_WAREHOUSE.
type: TYPE

attributes:
  # key_prefix: lake_       # resource keys lake_kafka, lake_catalog, ...; a second lake here takes another
  # kafka_bootstrap_servers: "{{ env.KAFKA_BOOTSTRAP_SERVERS }}"
  # catalog_uri: "{{ env.LAKE_CATALOG_URI }}"
  defaults:
    format: {type: json}
  tables: []
  #  - name: orders
  #    identifier: shop.orders
  #    topic: shop.orders
  #    schema:
  #      - {name: id, type: long, required: true}
  #      - {name: amount, type: double}
"""


class TablesScaffolder(dg.Scaffolder):
    """What ``dg scaffold defs kafka_iceberg.lake_assets.component.KafkaIcebergTables <name>`` writes:
    a ``defs.yaml`` with no table yet and, as comments, the attributes and a table to start from."""

    def scaffold(self, request: dg.ScaffoldRequest) -> None:
        """Writes ``<target>/defs.yaml`` (:data:`STARTER`); Dagster's own scaffolding for other formats."""
        if request.scaffold_format != "yaml" or request.append:
            dg.scaffold_component(request)
            return
        (request.target_path / DEFS_FILE).write_text(STARTER.replace("TYPE", request.type_name))


@dg.scaffold_with(TablesScaffolder)
@dataclass
class KafkaIcebergTables(dg.Component, dg.Resolvable):
    """Kafka topics ingested exactly once into Iceberg tables, one asset per table, with everything they
    need: resources, worker jobs, sensors, checks, alerts (docs/tables.md).

    Attributes: ``defaults``, merged under every table (a table's own value wins; ``tags`` merge),
    ``tables``, one entry per Kafka topic, and those of :class:`InstanceAttributes`. In Python, pass
    the parsed ``tables`` directly.
    """

    tables: Annotated[
        list[TableSpec],
        dg.Resolver.from_model(
            _resolve_tables,
            model_field_type=list[TableEntry],
            description="One entry per Kafka topic that becomes an Iceberg table (docs/tables.md).",
        ),
    ] = field(default_factory=list)
    defaults: Annotated[
        dict[str, Any] | None,
        dg.Resolver(
            _plain,
            model_field_type=Defaults | None,
            description="Merged under every table; a table's own value wins, tags merge.",
        ),
    ] = None
    key_prefix: str = LAKE_KEYS.prefix
    kafka_bootstrap_servers: str | None = None
    catalog_name: str | None = None
    catalog_uri: str | None = None
    warehouse: str | None = None
    location_sensors: bool | None = None

    @classmethod
    def model(cls) -> type[BaseModel]:
        """The attributes' pydantic model: the declaration models as they are, without Dagster's
        whole-attribute template alternative, so ``dg check yaml`` reports a bad field at its line."""
        return InstanceAttributes

    def settings(self, base: Settings) -> Settings:
        """``base`` (the environment's settings) with this instance's Kafka cluster and catalog.

        Raises:
            ConfigError: the catalog attributes are malformed (e.g. an unsupported URI).
        """
        return connection_settings(
            base, self.kafka_bootstrap_servers, self.catalog_name, self.catalog_uri, self.warehouse
        )

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        """Everything this instance's tables need (:func:`lake_definitions`); opens no connection."""
        declared_in = context.path / DEFS_FILE if (context.path / DEFS_FILE).exists() else None
        keys = ResourceKeys(self.key_prefix)
        location = keys == LAKE_KEYS if self.location_sensors is None else self.location_sensors
        return lake_definitions(self.settings(load_settings()), self.tables, declared_in, keys, location)


_CATALOG_FROM_ENV = frozenset(SECRET_BEARING) - {"KAFKA_CLIENT_CONFIG"}


def connection_settings(
    base: Settings,
    bootstrap_servers: str | None = None,
    catalog_name: str | None = None,
    catalog_uri: str | None = None,
    warehouse: str | None = None,
) -> Settings:
    """``base`` with another Kafka cluster (``bootstrap_servers``, host:port list) and another catalog
    (``catalog_name``, ``catalog_uri``, ``warehouse``; what is None stays the environment's). The
    catalog's credentials still come from ``PYICEBERG_CATALOG__<NAME>__*`` when a run starts.

    Raises:
        ConfigError: a malformed catalog URI.
    """
    if bootstrap_servers:
        base = dataclasses.replace(base, kafka_bootstrap_servers=bootstrap_servers, use_dev_broker=False)
    if not (catalog_name or catalog_uri or warehouse):
        return base
    cat = base.catalog
    # resolved as the catalog resource resolves it when a run starts
    catalog = run_catalog(catalog_name or cat.name, catalog_uri or cat.sqlalchemy_uri, warehouse or cat.warehouse)
    hidden = frozenset(k for k in base.from_process_env if k in _CATALOG_FROM_ENV or k.startswith("PYICEBERG_"))
    return dataclasses.replace(base, catalog=catalog, from_process_env=base.from_process_env - hidden)


def table_definitions(
    settings: Settings, specs: list[TableSpec], declared_in: Path | None, keys: ResourceKeys = LAKE_KEYS
) -> dg.Definitions:
    """Per table of ``specs``: the topic and table assets, the ``duplicate_free``, ``freshness`` and
    ``quarantine`` checks, all on the resources of ``keys`` (no schedule: the worker runs maintain and
    fully check every table by its crons, :mod:`kafka_iceberg.ops.rota`). ``declared_in``
    (a ``defs.yaml`` or ``tables.yaml``) is where the code references point."""
    sqlite, name = settings.catalog.is_sqlite, settings.catalog.name
    return dg.Definitions(
        assets=[
            *(topic_asset(s) for s in specs),
            *(table_asset(s, sqlite, tables_file=declared_in, catalog_name=name, keys=keys) for s in specs),
        ],
        asset_checks=[*(c for s in specs for c in table_checks(s, keys)), *(quarantine_check(s, keys) for s in specs)],
    )


@functools.cache
def executor(name: str) -> dg.ExecutorDefinition:
    """The executor of every job, from ``LAKE_DAGSTER_EXECUTOR`` ``name``: ``in_process`` (default; SQLite
    admits one committing process, so steps share one process and one Spark session), or with a
    PostgreSQL catalog ``multiprocess`` or ``k8s`` (dagster-k8s) to run tables in parallel. Each tags
    its runs with their worker's liveness and reaps dead runs (:mod:`kafka_iceberg.lake_assets.liveness`).
    One object per name, so the instances of one code location share it."""
    if name == "multiprocess":
        return liveness_executor(dg.multiprocess_executor)
    if name == "k8s":
        from dagster_k8s import k8s_job_executor

        return liveness_executor(k8s_job_executor)
    return liveness_executor(dg.in_process_executor)


ingest_all = dg.define_asset_job(
    "ingest_all",
    selection=dg.AssetSelection.groups("lake", "analytics"),
    description="One micro-batch of every table, then the downstream assets, then all checks.",
)


def lake_definitions(
    settings: Settings,
    specs: list[TableSpec],
    declared_in: Path | None,
    keys: ResourceKeys = LAKE_KEYS,
    location_sensors: bool = True,
) -> dg.Definitions:
    """All a code location needs for the tables ``specs``: :func:`table_definitions`; the resources
    under ``keys`` (configured from ``settings``), the executor, the replay job, the worker jobs
    (:func:`kafka_iceberg.batch.assign.worker_count` of them, the tables dealt out by
    :func:`~kafka_iceberg.batch.assign.assign_workers`) and the sensors that watch every table (``lake_workers``,
    ``lake_retention``); with ``location_sensors`` the
    run-failure and run-liveness sensors; and the demo's downstream asset (with the sensor that
    refreshes it) and ``ingest_all`` when ``specs`` declare the demo's source tables
    (:data:`kafka_iceberg.lake_assets.analytics.SOURCE_TABLES`). Opens no connection."""
    sqlite = settings.catalog.is_sqlite
    demo = SOURCE_TABLES <= {s.identifier for s in specs} and keys == LAKE_KEYS  # it takes lake_pyspark, lake_reader
    workers = worker_count(len(specs), sqlite, os.cpu_count(), settings.stream.workers)
    groups = assign_workers(specs, workers) if specs else {}
    crons = maintenance_crons(specs)  # spread over every table of the location
    workers_jobs = [worker_job(k, group, sqlite, crons, keys) for k, group in groups.items() if group]
    lake = dg.Definitions(
        assets=[hourly_departure_delay_asset(sqlite_catalog=sqlite)] if demo else [],
        jobs=[*([ingest_all] if demo else []), replay_job(specs, sqlite, keys), *workers_jobs],
        sensors=[
            *sensors.location_sensors(groups, workers_jobs, keys, location_sensors, crons),
            *([refresh_sensor([DOWNSTREAM_KEY])] if demo else []),
        ],
        resources=default_resources(settings, keys),
        executor=executor(settings.dagster_executor),
    )
    return dg.Definitions.merge(table_definitions(settings, specs, declared_in, keys), lake)


@contextmanager
def quiet_components() -> Iterator[None]:
    """Dagster's beta and preview warnings off while a defs folder loads: its code references and
    scaffolders are beta or preview in Dagster 1.13, and would print once per asset at every load."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dg.BetaWarning)
        warnings.simplefilter("ignore", dg.PreviewWarning)
        yield


def defs_tree(defs_module: str = SHIPPED_DEFS) -> dg.ComponentTree:
    """The Component tree of the importable defs folder ``defs_module`` (``LAKE_DEFS_MODULE``; default
    the shipped ``kafka_iceberg.defs``, rooted at the checkout or, installed, the package). Another
    module is rooted at the folder that holds its top-level package.

    Raises:
        ConfigError: ``defs_module`` cannot be imported.
    """
    try:
        module = importlib.import_module(defs_module)
    except ImportError as exc:
        raise ConfigError(f"LAKE_DEFS_MODULE {defs_module!r} cannot be imported: {exc}") from exc
    if defs_module == SHIPPED_DEFS:
        root = CHECKOUT if (CHECKOUT / "pyproject.toml").exists() else PACKAGE_DIR
    else:
        folder = Path(next(iter(getattr(module, "__path__", [])), module.__file__ or ".")).resolve()
        root = folder.parents[defs_module.count(".")]
    return dg.ComponentTree.from_module(defs_module=module, project_root=root)


def component_specs(tree: dg.ComponentTree) -> list[TableSpec]:
    """The tables of every ``KafkaIcebergTables`` instance of ``tree``, in load order.

    Raises:
        ConfigError: two instances declare a table with the same name, identifier or topic, or share
            a ``key_prefix`` (their resources, jobs and sensors would collide).
    """
    where = f"the KafkaIcebergTables instances of {tree.defs_module_name}"
    with quiet_components():
        instances = tree.get_all_components(of_type=KafkaIcebergTables)
    prefixes = [c.key_prefix for c in instances]
    if len(set(prefixes)) < len(prefixes):
        repeated = sorted({p for p in prefixes if prefixes.count(p) > 1})
        raise ConfigError(f"{where}: key_prefix must differ between instances (one lake each), repeated: {repeated}")
    specs = [s for c in instances for s in c.tables]
    check_unique(specs, where)
    return specs


def declared_specs(settings: Settings) -> list[TableSpec]:
    """The declared tables: the file ``LAKE_TABLES_FILE`` when set, else the Component instances of
    the defs folder ``LAKE_DEFS_MODULE``. Raises ConfigError on an invalid declaration."""
    if settings.tables_file is not None:
        return load_table_specs(settings.tables_file)
    try:
        return component_specs(defs_tree(settings.defs_module))
    except ConfigError:
        raise
    except Exception as exc:  # Dagster wraps a bad declaration; keep its own words (and file, line)
        raise ConfigError(declaration_error(exc)) from exc


def declaration_error(exc: BaseException) -> str:
    """The innermost message of Dagster's chain of errors around a bad declaration: the
    :class:`ConfigError`, or pydantic's ``attributes.tables.0.freshnes at .../defs.yaml:50``."""
    chain = [exc]
    while chain[-1].__cause__ is not None and len(chain) < 20:
        chain.append(chain[-1].__cause__)
    found = next((e for e in chain if isinstance(e, ConfigError)), chain[-1])
    text, marker = str(found), "ConfigError: "
    if not isinstance(found, ConfigError) and marker in text:  # raised in the resolver, formatted by Dagster
        return f"{text.split(' - ', 1)[0].strip()}: {text.rsplit(marker, 1)[1].splitlines()[0]}"
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return " ".join(lines[1:3] if isinstance(found, ValidationError) else lines[:3])
