"""The read path of downstream assets: a declared table at one Iceberg snapshot, as Arrow, DuckDB or Spark.

:class:`LakeTableReader` (the ``lake_reader`` resource) resolves which snapshot to read and returns a
:class:`TableSnapshot`, which carries the snapshot id and reads the table as it was at that snapshot:

- by default, the snapshot the table asset's latest materialization recorded (its ``snapshot_id``
  metadata, whatever micro-batch slot that was; a micro-batch that committed nothing records
  ``none (nothing new)`` and is passed over for the one before), so a downstream asset reads what
  its upstream materialization produced, not a commit that landed since;
- ``snapshot_id=...``: that snapshot;
- when the Dagster instance has no materialization with a snapshot id (the table is written
  outside this instance), or the recorded snapshot was expired, the table's current snapshot
  (logged at WARNING).

The downstream asset records what it read with :func:`source_snapshots` (metadata
``lake/source_snapshots``: ``{identifier: snapshot id}``, ids as text since they are 64-bit). See
docs/downstream.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dagster import AssetKey, AssetRecordsFilter, ConfigurableResource, MetadataValue

from kafka_iceberg.catalog.group_view import read_group
from kafka_iceberg.catalog.tables import load_table
from kafka_iceberg.errors import ConfigError
from kafka_iceberg.lake_assets.vocabulary import SNAPSHOT_ID_METADATA, identifier_key, key_identifier
from kafka_iceberg.resources.catalog import IcebergCatalogResource

SOURCE_SNAPSHOTS_METADATA = "lake/source_snapshots"
"""Metadata key of a downstream asset: ``{table identifier: snapshot id (text)}`` of the tables it read."""

PAGE = 50  # materialization records fetched per request while looking for a recorded snapshot id
MAX_RECORDS = 500  # materializations looked at before giving up on a recorded snapshot id


def recorded_snapshot_id(metadata: Any) -> int | None:
    """The snapshot id in a table asset's materialization metadata (``snapshot_id``, text or a
    ``MetadataValue``), or ``None`` when it records none (``none (nothing new)``, absent)."""
    value = metadata.get(SNAPSHOT_ID_METADATA) if metadata else None
    text = str(getattr(value, "value", value) if value is not None else "").strip()
    return int(text) if text.lstrip("-").isdigit() else None


@dataclass(frozen=True)
class TableSnapshot:
    """One table at one snapshot, and where that snapshot came from.

    Attributes:
        identifier: the Iceberg identifier, e.g. ``nyc.flights``.
        snapshot_id: the Iceberg snapshot id read.
        asset_key: the table asset's key, e.g. ``lake/nyc/flights``.
        pinned_by: ``materialization`` (recorded by the asset's materialization), ``argument``
            (asked for), ``group`` (a consistency group's position, :meth:`LakeTableReader.group`), or ``current`` (the table's current snapshot, see the module docstring).
        run_id, partition: the materialization's run and micro-batch slot (``pinned_by`` ``materialization``).
        catalog_name: the catalog's name in Spark SQL (``lake``).
        table: the pyiceberg ``Table``.
    """

    identifier: str
    snapshot_id: int
    asset_key: AssetKey
    pinned_by: str
    catalog_name: str
    table: Any = field(repr=False, compare=False)
    run_id: str | None = None
    partition: str | None = None

    def to_arrow(self, columns: tuple[str, ...] | None = None, row_filter: str | None = None):
        """The rows at this snapshot as a ``pyarrow.Table`` (pyiceberg scan; ``columns`` to select,
        ``row_filter`` an Iceberg expression such as ``"origin = 'JFK'"``)."""
        scan = self.table.scan(snapshot_id=self.snapshot_id, selected_fields=columns or ("*",))
        return (scan.filter(row_filter) if row_filter else scan).to_arrow()

    def to_duckdb(self, connection=None, columns: tuple[str, ...] | None = None, row_filter: str | None = None):
        """A DuckDB relation over :meth:`to_arrow` (on ``connection``, default a new in-memory one).

        Raises:
            ModuleNotFoundError: duckdb is not installed.
        """
        import duckdb  # optional: only readers that ask for DuckDB need it

        con = connection if connection is not None else duckdb.connect()
        return con.from_arrow(self.to_arrow(columns, row_filter))

    def to_spark(self, spark):
        """A Spark DataFrame of the table at this snapshot (``VERSION AS OF``), through the
        session's Iceberg catalog ``catalog_name``."""
        name = ".".join(f"`{p}`" for p in [self.catalog_name, *self.identifier.split(".")])
        return spark.sql(f"SELECT * FROM {name} VERSION AS OF {self.snapshot_id}")


def source_snapshots(*snapshots: TableSnapshot) -> dict[str, MetadataValue]:
    """Metadata recording what a downstream asset read: ``lake/source_snapshots``."""
    return {
        SOURCE_SNAPSHOTS_METADATA: MetadataValue.json({s.identifier: str(s.snapshot_id) for s in snapshots}),
    }


class LakeTableReader(ConfigurableResource):
    """Reads the declared tables of ``catalog`` for downstream assets, at the snapshot their
    materialization recorded (see the module docstring). Opens the catalog on each :meth:`snapshot`."""

    catalog: IcebergCatalogResource

    def snapshot(self, context, table: AssetKey | str, snapshot_id: int | None = None) -> TableSnapshot:
        """``table`` (its asset key ``lake/<namespace>/<table>`` or its identifier) at a snapshot.

        Args:
            context: the asset's execution context (its ``instance`` holds the materializations,
                its ``log`` gets a warning when the current snapshot is read instead).
            snapshot_id: read this snapshot instead of the recorded one.

        Raises:
            ConfigError: the table does not exist, has no snapshot, or has no snapshot ``snapshot_id``.
            ValueError: ``table`` is an asset key that is not a table asset's.
        """
        key = table if isinstance(table, AssetKey) else identifier_key(table)
        identifier = key_identifier(key)
        iceberg = load_table(self.catalog.load(), identifier)
        if iceberg is None:
            raise ConfigError(f"table {identifier} does not exist in catalog {self.catalog.name}")
        pin = dict(identifier=identifier, asset_key=key, catalog_name=self.catalog.name, table=iceberg)
        if snapshot_id is not None:
            if iceberg.snapshot_by_id(snapshot_id) is None:
                raise ConfigError(f"table {identifier} has no snapshot {snapshot_id}")
            return TableSnapshot(snapshot_id=snapshot_id, pinned_by="argument", **pin)
        recorded = latest_recorded_snapshot(context.instance, key)
        if recorded is not None and iceberg.snapshot_by_id(recorded[0]) is not None:
            sid, run_id, partition = recorded
            return TableSnapshot(
                snapshot_id=sid, pinned_by="materialization", run_id=run_id, partition=partition, **pin
            )
        current = iceberg.current_snapshot()
        if current is None:
            raise ConfigError(f"table {identifier} has no snapshot yet")
        why = "was expired" if recorded else "is not recorded in this Dagster instance"
        context.log.warning(
            f"{identifier}: the snapshot of its latest materialization {why}; reading the current snapshot "
            f"{current.snapshot_id}"
        )
        return TableSnapshot(snapshot_id=current.snapshot_id, pinned_by="current", **pin)

    def group(self, tables: list[AssetKey | str]) -> dict[str, TableSnapshot]:
        """The tables of one consistency group (asset keys or identifiers) at one consistent position:
        identifier -> :class:`TableSnapshot` (``pinned_by`` ``group``) at the snapshots of one group commit
        (:func:`kafka_iceberg.catalog.group_view.read_group`; docs/cdc.md#consistency-groups).

        Raises:
            ConfigError: a table does not exist or the tables were never committed as a group.
            LakeError: no group commit is on every member.
        """
        keys = [t if isinstance(t, AssetKey) else identifier_key(t) for t in tables]
        idents = [key_identifier(k) for k in keys]
        read = read_group(self.catalog.load(), idents)
        return {
            ident: TableSnapshot(ident, read[ident][1], key, "group", self.catalog.name, read[ident][0])
            for ident, key in zip(idents, keys, strict=True)
        }


def latest_recorded_snapshot(instance, key: AssetKey) -> tuple[int, str, str | None] | None:
    """``(snapshot id, run id, partition)`` of the latest materialization of ``key`` that recorded a
    snapshot id (any micro-batch slot), looking at up to :data:`MAX_RECORDS` materializations."""
    cursor, seen = None, 0
    while seen < MAX_RECORDS:
        page = instance.fetch_materializations(AssetRecordsFilter(asset_key=key), limit=PAGE, cursor=cursor)
        for record in page.records:
            sid = recorded_snapshot_id(record.asset_materialization.metadata)
            if sid is not None:
                return sid, record.run_id, record.partition_key
        seen += len(page.records)
        if not page.has_more:
            return None
        cursor = page.cursor
    return None


__all__ = [
    "SOURCE_SNAPSHOTS_METADATA",
    "LakeTableReader",
    "TableSnapshot",
    "latest_recorded_snapshot",
    "recorded_snapshot_id",
    "source_snapshots",
]
