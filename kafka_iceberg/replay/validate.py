"""Validation of a replay: the original and the replay compared over the same offsets, with Spark.

Records neither side holds (transaction markers, compacted offsets, records a dead-letter
table quarantined on both sides) are simply absent from both and compare equal.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from pyspark.sql import functions as F

from kafka_iceberg.config.settings import Settings
from kafka_iceberg.declaration.spec import TableSpec
from kafka_iceberg.errors import LakeError


# -- validation -----------------------------------------------------------------------------
@dataclass(frozen=True)
class TableVersion:
    """One version of an Iceberg table to compare: ``identifier`` (``<ns>.<table>``) at snapshot
    ``snapshot_id`` (None: the table has no snapshot, i.e. is empty). ``label`` names the ref in
    reports (``main`` or the branch)."""

    identifier: str
    snapshot_id: int | None
    label: str = "main"

    def describe(self) -> str:
        """``<identifier>@<label>:<snapshot id>``."""
        return f"{self.identifier}@{self.label}:{self.snapshot_id}"


class ReplayMismatchError(LakeError):
    """Validation found rows that differ between the original and the replay; ``report`` is the
    :class:`ValidationReport`."""

    def __init__(self, report: ValidationReport):
        self.report = report
        super().__init__(report.summary())


@dataclass
class PartitionComparison:
    """Validation figures of one partition, in records, over offsets ``[start, end)``.

    ``missing``: offsets the original holds that the replay does not hold at all; ``extra``:
    offsets the replay holds that the original does not; ``differing``: offsets both hold
    whose rows are not identical (a value, a Kafka column, or the number of copies differs).
    """

    partition: int
    start: int
    end: int
    original_records: int = 0
    replay_records: int = 0
    missing: int = 0
    extra: int = 0
    differing: int = 0


@dataclass
class ValidationReport:
    """The comparison of an original and a replay over the same ``(partition, offset)`` range.

    ``columns``: the columns compared (value columns and kept Kafka columns both tables have).
    ``columns_only_in_original`` / ``columns_only_in_replay``: columns one side lacks (schema
    evolution saw a field on one side only); ``rows_with_uncompared_values``: rows in the range
    with a non-null value in such a column, which the other side therefore lacks.
    ``mismatched_rows``: rows of either side without an identical row on the other
    (``EXCEPT ALL`` both ways). ``outside_range``: rows of the replay target outside the
    replayed range (checked for a new table only; it must hold nothing else).
    ``excluded``: offset ranges left out of the comparison (the original's accepted gaps).
    ``examples``: up to ``sample`` mismatches ``{"partition", "offset", "kind"}``.
    """

    original: str
    replay: str
    columns: list[str]
    partitions: list[PartitionComparison]
    mismatched_rows: int = 0
    outside_range: int = 0
    columns_only_in_original: list[str] = field(default_factory=list)
    columns_only_in_replay: list[str] = field(default_factory=list)
    rows_with_uncompared_values: int = 0
    excluded: list[dict] = field(default_factory=list)
    examples: list[dict] = field(default_factory=list)

    @property
    def records_compared(self) -> int:
        """Records of the original inside the range."""
        return sum(p.original_records for p in self.partitions)

    @property
    def replay_records(self) -> int:
        """Records of the replay inside the range."""
        return sum(p.replay_records for p in self.partitions)

    @property
    def missing(self) -> int:
        """Offsets the original holds and the replay lacks (records)."""
        return sum(p.missing for p in self.partitions)

    @property
    def extra(self) -> int:
        """Offsets the replay holds and the original lacks (records)."""
        return sum(p.extra for p in self.partitions)

    @property
    def differing(self) -> int:
        """Offsets both hold with different rows."""
        return sum(p.differing for p in self.partitions)

    @property
    def valid(self) -> bool:
        """True when both sides hold the same multiset of rows over the range and the target holds
        nothing outside it."""
        return (
            self.mismatched_rows == 0
            and self.outside_range == 0
            and self.rows_with_uncompared_values == 0
            and self.missing == self.extra == self.differing == 0
        )

    def summary(self) -> str:
        """One line for logs and run failures."""
        verdict = "MATCH" if self.valid else "MISMATCH"
        text = (
            f"{verdict}: {self.replay} vs {self.original}: {self.records_compared} original records compared, "
            f"{self.replay_records} replayed; missing {self.missing}, extra {self.extra}, differing {self.differing}"
        )
        if self.outside_range:
            text += f", {self.outside_range} replay rows outside the range"
        if self.rows_with_uncompared_values:
            text += (
                f", {self.rows_with_uncompared_values} rows with values in columns only one side has "
                f"({self.columns_only_in_original + self.columns_only_in_replay})"
            )
        return text

    def to_dict(self) -> dict:
        """JSON-ready form (CLI output, Dagster metadata)."""
        return {
            "valid": self.valid,
            "original": self.original,
            "replay": self.replay,
            "records_compared": self.records_compared,
            "replay_records": self.replay_records,
            "missing": self.missing,
            "extra": self.extra,
            "differing": self.differing,
            "mismatched_rows": self.mismatched_rows,
            "outside_range": self.outside_range,
            "columns": self.columns,
            "columns_only_in_original": self.columns_only_in_original,
            "columns_only_in_replay": self.columns_only_in_replay,
            "rows_with_uncompared_values": self.rows_with_uncompared_values,
            "excluded": self.excluded,
            "partitions": [dataclasses.asdict(p) for p in self.partitions],
            "examples": self.examples,
        }


def _range_predicate(p: str, o: str, ranges: Mapping[int, tuple[int, int]]) -> str:
    parts = [
        f"(`{p}` = {int(part)} AND `{o}` >= {int(s)} AND `{o}` < {int(e)})"
        for part, (s, e) in sorted(ranges.items())
        if e > s
    ]
    return "(" + " OR ".join(parts) + ")" if parts else "FALSE"


def _scope(P: str, O: str, ranges: Mapping[int, tuple[int, int]], excluded: list[dict]) -> str:
    """The SQL predicate of the compared rows: inside ``ranges``, outside every ``excluded`` range."""
    gap_pred = " OR ".join(
        f"(`{P}` = {int(g['partition'])} AND `{O}` >= {int(g['start'])} AND `{O}` < {int(g['end'])})" for g in excluded
    )
    where = _range_predicate(P, O, ranges)
    return f"{where} AND NOT ({gap_pred})" if gap_pred else where


def _read_version(spark, catalog_name: str, version: TableVersion):
    table = f"{catalog_name}.{version.identifier}"
    if version.snapshot_id is None:
        return spark.table(table).limit(0)
    return spark.read.option("snapshot-id", str(version.snapshot_id)).table(table)


def _columns_and_uncompared(orig_all, rep_all, scope: str) -> tuple[list[str], list[str], list[str], int]:
    """The columns both DataFrames have, those only the original has, those only the replay has,
    and how many rows in ``scope`` hold a non-null value in a one-sided column (Spark counts)."""
    rep_cols = set(rep_all.columns)
    columns = [c for c in orig_all.columns if c in rep_cols]
    only_o = [c for c in orig_all.columns if c not in rep_cols]
    only_r = [c for c in rep_all.columns if c not in set(orig_all.columns)]
    uncompared = sum(
        df.where(scope).where(" OR ".join(f"`{c}` IS NOT NULL" for c in cols)).count()
        for df, cols in ((orig_all, only_o), (rep_all, only_r))
        if cols
    )
    return columns, only_o, only_r, uncompared


def validate_replay(
    spark,
    settings: Settings,
    spec: TableSpec,
    *,
    original: TableVersion,
    replay: TableVersion,
    ranges: Mapping[int, tuple[int, int]],
    excluded: Sequence[Mapping] = (),
    check_outside_range: bool = False,
    sample: int = 10,
    raise_on_mismatch: bool = False,
) -> ValidationReport:
    """Compare ``original`` and ``replay`` over the same ``(partition, offset)`` range, with Spark.

    Both sides are restricted to ``ranges`` (``{partition: (start, end)}``, half-open offsets)
    minus ``excluded`` (``[{"partition", "start", "end"}]``, e.g. the original's accepted gaps,
    which no replay can read). Over the columns both tables have (value columns plus
    ``_kafka_partition``, ``_kafka_offset`` and whichever of key, timestamp, topic, headers the
    table keeps), it counts records per partition on each side and computes
    ``original EXCEPT ALL replay`` and ``replay EXCEPT ALL original``; every unmatched row is
    classified by its ``(partition, offset)`` as missing, extra or differing. With
    ``check_outside_range``, rows of ``replay`` outside the range count as mismatches (a new
    replay table must hold nothing else). A column only one side has (schema evolution) must be
    null on every row of the range, or those rows count against the verdict.

    Returns:
        A :class:`ValidationReport`; ``report.valid`` is the verdict.

    Raises:
        ReplayMismatchError: with ``raise_on_mismatch``, when the report is not valid.
    """
    cat = settings.catalog.name
    P, O = spec.kafka_column("partition"), spec.kafka_column("offset")
    excluded = [dict(g) for g in excluded]
    where, scope = _range_predicate(P, O, ranges), _scope(P, O, ranges, excluded)
    orig_all = _read_version(spark, cat, original)
    rep_all = _read_version(spark, cat, replay)
    columns, only_o, only_r, uncompared = _columns_and_uncompared(orig_all, rep_all, scope)
    comps = {p: PartitionComparison(p, s, e) for p, (s, e) in sorted(ranges.items())}
    mismatched, examples = _compare(
        orig_all.where(scope).select(*columns), rep_all.where(scope).select(*columns), P, O, comps, sample
    )
    outside = rep_all.where(f"NOT {where}").count() if check_outside_range else 0
    report = ValidationReport(
        original=original.describe(),
        replay=replay.describe(),
        columns=columns,
        partitions=list(comps.values()),
        mismatched_rows=int(mismatched),
        outside_range=int(outside),
        columns_only_in_original=only_o,
        columns_only_in_replay=only_r,
        rows_with_uncompared_values=int(uncompared),
        excluded=excluded,
        examples=sorted(examples, key=lambda e: (e["partition"], e["offset"]))[:sample],
    )
    if raise_on_mismatch and not report.valid:
        raise ReplayMismatchError(report)
    return report


def _per_partition(df, P: str) -> dict[int, int]:
    return {row[P]: row["n"] for row in df.groupBy(P).agg(F.count(F.lit(1)).alias("n")).collect()}


def _compare(o, r, P: str, O: str, comps: dict, sample: int) -> tuple[int, list[dict]]:
    """Count records per partition of both sides into ``comps``, and the rows without an identical
    row on the other side (``EXCEPT ALL`` both ways), classified per offset as missing, extra or
    differing. Returns (mismatched rows, up to ``sample`` examples per kind)."""
    for p, n in _per_partition(o, P).items():
        comps[p].original_records = n
    for p, n in _per_partition(r, P).items():
        comps[p].replay_records = n
    mo = o.exceptAll(r).cache()
    mr = r.exceptAll(o).cache()
    examples: list[dict] = []
    try:
        mismatched = mo.count() + mr.count()
        if not mismatched:
            return 0, examples
        keys_o = o.select(P, O).distinct()
        keys_r = r.select(P, O).distinct()
        kinds = {
            "missing": mo.select(P, O).distinct().join(keys_r, [P, O], "left_anti"),
            "extra": mr.select(P, O).distinct().join(keys_o, [P, O], "left_anti"),
            "differing": mo.select(P, O)
            .union(mr.select(P, O))
            .distinct()
            .join(keys_o, [P, O], "left_semi")
            .join(keys_r, [P, O], "left_semi"),
        }
        for kind, df in kinds.items():
            df = df.cache()
            try:
                for p, n in _per_partition(df, P).items():
                    setattr(comps[p], kind, n)
                examples += [
                    {"partition": row[P], "offset": row[O], "kind": kind}
                    for row in df.orderBy(P, O).limit(sample).collect()
                ]
            finally:
                df.unpersist()
        return mismatched, examples
    finally:
        mo.unpersist()
        mr.unpersist()
