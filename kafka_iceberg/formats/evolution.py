"""Classifying a writer schema against the table schema: evolvable, promotion or blocked.

Both sides are Iceberg schemas (the writer's through :mod:`kafka_iceberg.formats.types`);
fields match by name, nested structs field by field, list elements and map values as such.

=============  ==========================================================================
``none``       the writer fits the table as it is (a narrower writer type, such as int for
               a long column, uuid for a string column, fixed for a binary one, or an
               optional column the writer lacks, is fine)
``evolvable``  the writer has fields the table lacks (top-level or nested): with
               ``unknown_fields: evolve`` each becomes a new optional column
``promotion``  a column needs an Iceberg type promotion: int -> long, float -> double,
               decimal(P,S) -> decimal(P2,S) with P2 > P
``blocked``    anything else (another type, a required column the writer lacks or may
               send as null, a changed decimal scale): the records are quarantined with
               the reason and an alert fires; the table schema never changes silently
=============  ==========================================================================
"""

from __future__ import annotations

from dataclasses import dataclass

from pyiceberg.schema import Schema
from pyiceberg.types import (
    BinaryType,
    DecimalType,
    DoubleType,
    FixedType,
    FloatType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    PrimitiveType,
    StringType,
    StructType,
    UUIDType,
)

from kafka_iceberg.formats.types import iceberg_schema

ORDER = ("none", "evolvable", "promotion", "blocked")


@dataclass(frozen=True)
class Change:
    """One difference: ``kind`` (``evolvable``, ``promotion`` or ``blocked``), the dotted field
    ``path`` (``a.b``; ``a.element`` / ``a.value`` inside lists and maps), the Iceberg type the
    table should get (``None`` when blocked) and a human-readable ``reason``."""

    kind: str
    path: str
    new_type: IcebergType | None
    reason: str


@dataclass(frozen=True)
class Evolution:
    """All changes between a table schema and a writer schema; ``kind`` is the worst of them."""

    changes: tuple[Change, ...]

    @property
    def kind(self) -> str:
        return max((c.kind for c in self.changes), key=ORDER.index, default="none")

    def of(self, kind: str) -> list[Change]:
        return [c for c in self.changes if c.kind == kind]


_AS_SPARK_STORES = {(UUIDType, StringType), (FixedType, BinaryType)}
"""(writer, table) pairs that fit: a table created through Spark holds ``uuid`` as ``string`` and
``fixed`` as ``binary``, which is how the decoders carry them (docs/tables.md#type-mapping)."""


def _promotion(table: IcebergType, writer: IcebergType) -> str | None:
    """'fits', 'promote' or None (blocked) for two primitive types."""
    if table == writer:
        return "fits"
    pairs = {(IntegerType, LongType), (FloatType, DoubleType)}
    if (type(writer), type(table)) in pairs | _AS_SPARK_STORES:
        return "fits"  # the table's type is wider: values widen when written
    if (type(table), type(writer)) in pairs:
        return "promote"
    if isinstance(table, DecimalType) and isinstance(writer, DecimalType) and table.scale == writer.scale:
        return "fits" if writer.precision <= table.precision else "promote"
    return None


def _compare(table: IcebergType, writer: IcebergType, path: str, out: list[Change]) -> None:
    if isinstance(table, StructType) and isinstance(writer, StructType):
        _fields(table.fields, writer.fields, path, out)
    elif isinstance(table, ListType) and isinstance(writer, ListType):
        _compare(table.element_type, writer.element_type, f"{path}.element", out)
    elif isinstance(table, MapType) and isinstance(writer, MapType):
        _compare(table.key_type, writer.key_type, f"{path}.key", out)
        _compare(table.value_type, writer.value_type, f"{path}.value", out)
    elif isinstance(table, PrimitiveType) and isinstance(writer, PrimitiveType):
        verdict = _promotion(table, writer)
        if verdict == "promote":
            out.append(Change("promotion", path, writer, f"{path}: {table} -> {writer} (an Iceberg type promotion)"))
        elif verdict is None:
            out.append(Change("blocked", path, None, f"{path}: the table has {table}, the writer sends {writer}"))
    else:
        out.append(Change("blocked", path, None, f"{path}: the table has {table}, the writer sends {writer}"))


def _fields(table: tuple[NestedField, ...], writer: tuple[NestedField, ...], prefix: str, out: list[Change]) -> None:
    by_name = {f.name: f for f in writer}
    for t in table:
        path = f"{prefix}.{t.name}" if prefix else t.name
        w = by_name.pop(t.name, None)
        if w is None:
            if t.required:
                out.append(
                    Change(
                        "blocked",
                        path,
                        None,
                        f"{path}: required in the table, absent from the writer schema (a required field was removed)",
                    )
                )
            continue
        if t.required and not w.required:
            out.append(
                Change(
                    "blocked",
                    path,
                    None,
                    f"{path}: required in the table, optional in the writer schema (it may send null)",
                )
            )
        _compare(t.field_type, w.field_type, path, out)
    for w in by_name.values():  # what is left is new
        path = f"{prefix}.{w.name}" if prefix else w.name
        out.append(
            Change(
                "evolvable",
                path,
                w.field_type,
                f"{path}: a new field of type {w.field_type}, added as an optional column",
            )
        )


def classify(table: Schema, writer: Schema) -> Evolution:
    """Compare the table's Iceberg schema with a writer's (see the module docstring).

    ``table`` may hold columns that are not the writer's (the Kafka columns, columns added by
    hand): an optional one is ignored, a required one the writer lacks is ``blocked`` - so pass
    the table's value columns only.
    """
    out: list[Change] = []
    _fields(table.fields, writer.fields, "", out)
    return Evolution(tuple(out))


def apply(table, evolution: Evolution) -> None:
    """Apply the ``evolvable`` and ``promotion`` changes to a pyiceberg ``Table`` in one schema
    update (a metadata-only commit). The Spark write path may use ``ALTER TABLE`` instead.

    Raises:
        ValueError: the evolution has ``blocked`` changes.
    """
    if evolution.of("blocked"):
        raise ValueError("blocked schema changes: " + "; ".join(c.reason for c in evolution.of("blocked")))
    with table.update_schema() as update:
        for c in evolution.changes:
            path = tuple(c.path.split("."))
            if c.kind == "evolvable":
                update.add_column(path, _fresh(c.new_type), doc="added from the schema registry")
            elif c.kind == "promotion":
                update.update_column(path, field_type=c.new_type)


def _fresh(t: IcebergType) -> IcebergType:
    """``t`` with every nested field optional (Iceberg adds only optional columns)."""
    if isinstance(t, StructType):
        return StructType(
            *[NestedField(f.field_id, f.name, _fresh(f.field_type), required=False, doc=f.doc) for f in t.fields]
        )
    if isinstance(t, ListType):
        return ListType(t.element_id, _fresh(t.element_type), element_required=False)
    if isinstance(t, MapType):
        return MapType(t.key_id, t.key_type, t.value_id, _fresh(t.value_type), value_required=False)
    return t


@dataclass(frozen=True)
class BatchPlan:
    """What a micro-batch does about its writer schemas (from :func:`plan_batch`).

    ``apply``: changes to make to the table before writing (new optional columns with
    ``unknown_fields: evolve``, type promotions), each once. ``refused``: schema id -> (bad-record
    kind, reason) for every schema id whose records must not be written (``schema`` for a blocked
    change, ``unknown_field`` for new fields under ``reject``); pass it to ``decode_values``.
    ``ignored``: new fields dropped under ``unknown_fields: ignore``.
    """

    apply: tuple[Change, ...]
    refused: dict[int, tuple[str, str]]
    ignored: tuple[Change, ...]


def plan_batch(table: Schema, writers: dict, unknown_fields: str = "reject") -> BatchPlan:
    """Classify every resolved writer schema (``{id: WriterSchema or None}``; unknown ids are
    skipped) against the table's value columns under the ``unknown_fields`` policy (``reject``,
    ``ignore`` or ``evolve``). Promotions always apply; blocked changes refuse the schema id.

    Raises:
        ValueError: an unknown policy, or two writers asking for different promotions of one column.
    """

    if unknown_fields not in ("reject", "ignore", "evolve"):
        raise ValueError(f"unknown_fields must be reject, ignore or evolve, not {unknown_fields!r}")
    apply: dict[str, Change] = {}
    refused: dict[int, tuple[str, str]] = {}
    ignored: dict[str, Change] = {}
    for sid, writer in sorted(writers.items()):
        if writer is None:
            continue
        ev = classify(table, iceberg_schema(writer))
        if ev.of("blocked"):
            refused[sid] = ("schema", f"schema id {sid} is blocked: " + "; ".join(c.reason for c in ev.of("blocked")))
            continue
        new = ev.of("evolvable")
        if new and unknown_fields == "reject":
            refused[sid] = (
                "unknown_field",
                f"schema id {sid} has fields the table lacks (unknown_fields: reject): "
                + ", ".join(c.path for c in new),
            )
            continue
        for c in ev.of("promotion") + (new if unknown_fields == "evolve" else []):
            if c.path in apply and apply[c.path].new_type != c.new_type:
                raise ValueError(f"writers disagree on column {c.path}: {apply[c.path].new_type} vs {c.new_type}")
            apply[c.path] = c
        for c in new if unknown_fields == "ignore" else []:
            ignored[c.path] = c
    return BatchPlan(tuple(apply.values()), refused, tuple(ignored.values()))
