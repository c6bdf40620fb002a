"""The table declarations as a Dagster Component: ``KafkaIcebergTables``, one instance per ``defs.yaml``.

A ``defs.yaml`` of type ``kafka_iceberg.lake_assets.component.KafkaIcebergTables`` has the
attributes of a ``tables.yaml``: ``defaults`` (:class:`~kafka_iceberg.declaration.models.Defaults`)
and ``tables`` (a list of :class:`~kafka_iceberg.declaration.models.TableEntry`, the pydantic
models of :mod:`kafka_iceberg.declaration.models`). ``dg check yaml`` validates them against these
models and reports a bad field with its file and line; ``{{ env.X }}`` templates are resolved by
Dagster when the instance loads; then every table is parsed into a
:class:`~kafka_iceberg.declaration.spec.TableSpec` exactly as a ``tables.yaml`` entry is.

One instance builds the per-table definitions of its tables (:func:`table_definitions`): the topic
and table assets, their checks, the full-check schedules with their jobs. The per-location definitions
(resources, executor, the replay job, the worker jobs and the sensors, the demo's downstream asset) are
built once by
:mod:`kafka_iceberg.lake_assets.definitions`, so several instances live in one project; their
tables must not share a name, identifier or topic (:func:`component_specs`).
"""

import importlib
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import dagster as dg
from pydantic import BaseModel, ValidationError

from kafka_iceberg import schedules
from kafka_iceberg.config.settings import CHECKOUT, PACKAGE_DIR, Settings, load_settings
from kafka_iceberg.declaration.models import Defaults, TableEntry, TablesAttributes
from kafka_iceberg.declaration.spec import TableSpec, check_unique, load_table_specs, parse_declarations
from kafka_iceberg.errors import ConfigError
from kafka_iceberg.lake_assets.quality import quarantine_check
from kafka_iceberg.lake_assets.tables import table_asset, table_checks, topic_asset

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


@dataclass
class KafkaIcebergTables(dg.Component, dg.Resolvable):
    """Kafka topics ingested exactly once into Iceberg tables, one asset per table (docs/tables.md).

    Attributes: ``defaults``, merged under every table (a table's own value wins; ``tags`` merge),
    and ``tables``, one entry per Kafka topic. In Python, pass the parsed ``tables`` directly.
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

    @classmethod
    def model(cls) -> type[BaseModel]:
        """The attributes' pydantic model: the declaration models as they are, without Dagster's
        whole-attribute template alternative, so ``dg check yaml`` reports a bad field at its line."""
        return TablesAttributes

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        """The per-table definitions of this instance's tables; opens no connection."""
        declared_in = context.path / DEFS_FILE if (context.path / DEFS_FILE).exists() else None
        return table_definitions(load_settings(), self.tables, declared_in)


def table_definitions(settings: Settings, specs: list[TableSpec], declared_in: Path | None) -> dg.Definitions:
    """Per table of ``specs``: the topic and table assets, the ``duplicate_free``, ``freshness`` and
    ``quarantine`` checks, the full-check schedules.
    ``declared_in`` (a ``defs.yaml`` or ``tables.yaml``) is where the code references point."""
    sqlite = settings.catalog.is_sqlite
    return dg.Definitions(
        assets=[
            *(topic_asset(s) for s in specs),
            *(
                table_asset(s, sqlite_catalog=sqlite, tables_file=declared_in, catalog_name=settings.catalog.name)
                for s in specs
            ),
        ],
        asset_checks=[*(c for s in specs for c in table_checks(s)), *(quarantine_check(s) for s in specs)],
        # the location's worker runs serve and maintain every table: its sensors are per location, and
        # of the schedules only the full-scan checks remain
        schedules=schedules.all_schedules(specs, sqlite_catalog=sqlite, workers=1),
    )


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
        ConfigError: two instances declare a table with the same name, identifier or topic.
    """
    with quiet_components():
        specs = [s for c in tree.get_all_components(of_type=KafkaIcebergTables) for s in c.tables]
    check_unique(specs, f"the KafkaIcebergTables instances of {tree.defs_module_name}")
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
