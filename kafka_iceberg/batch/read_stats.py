"""Statistics and checks of a read batch: records, bad records, the largest offset and record timestamp
(ms since epoch) and key + value bytes per partition (:class:`~kafka_iceberg.batch.types.PartitionStats`),
from the read tasks' piece tallies or from a classified Spark DataFrame; every record inside its planned
range; the first bad record under ``bad_records.policy: fail``.
"""

from __future__ import annotations

from pyspark.sql import functions as F

from kafka_iceberg.batch.planning import BatchPlan
from kafka_iceberg.batch.types import PartitionStats
from kafka_iceberg.declaration.spec import TableSpec
from kafka_iceberg.errors import LakeError, MalformedRecordError
from kafka_iceberg.formats.transform import PROBLEM


def piece_totals(pieces) -> tuple[PartitionStats, ...]:
    """Per-partition :class:`PartitionStats` (none quarantined) of the read tasks' ``PieceStats``;
    partitions without records are left out, as :func:`partition_stats` leaves them out."""
    by_partition: dict[int, list] = {}
    for piece in pieces:
        if piece.records:
            by_partition.setdefault(piece.partition, []).append(piece)
    out = []
    for p, mine in sorted(by_partition.items()):
        stamps = [x.max_timestamp_ms for x in mine if x.max_timestamp_ms is not None]
        out.append(
            PartitionStats(
                p,
                sum(x.records for x in mine),
                0,
                max(x.max_offset for x in mine),
                max(stamps) if stamps else None,
                sum(x.bytes for x in mine),
            )
        )
    return tuple(out)


def partition_stats(classified) -> tuple[PartitionStats, ...]:
    """Records, bad records, max offset, max timestamp and key + value bytes per partition (one Spark job)."""
    rows = (
        classified.groupBy("partition")
        .agg(
            F.count(F.lit(1)).alias("records"),
            F.count(F.col(PROBLEM)).alias("quarantined"),
            F.max("offset").alias("max_offset"),
            F.max("timestamp_ms").alias("max_timestamp_ms"),
            F.sum(F.coalesce(F.length("key"), F.lit(0)) + F.coalesce(F.length("value"), F.lit(0))).alias("bytes"),
        )
        .collect()
    )
    return tuple(
        sorted(
            (
                PartitionStats(
                    int(r["partition"]),
                    int(r["records"]),
                    int(r["quarantined"]),
                    int(r["max_offset"]),
                    r["max_timestamp_ms"],
                    int(r["bytes"] or 0),
                )
                for r in rows
            ),
            key=lambda s: s.partition,
        )
    )


def check_read(offsets: BatchPlan, stats) -> None:
    """Every record read lies inside its planned range (a reader bug would otherwise duplicate).

    Raises:
        LakeError: a partition read outside its range.
    """
    planned = {r.partition: r for r in offsets.ranges}
    for s in stats:
        r = planned.get(s.partition)
        if r is None or s.max_offset >= r.end or s.records > r.size:
            raise LakeError(
                f"table {offsets.table}: read {s.records} records up to offset {s.max_offset} "
                f"from partition {s.partition}, outside the planned range {r}"
            )


def quarantine_kinds(classified) -> dict[str, int]:
    """Bad records per problem kind (``malformed``, ``schema``, ...)."""
    rows = (
        classified.where(F.col(PROBLEM).isNotNull())
        .groupBy(F.col(f"{PROBLEM}.kind").alias("kind"))
        .agg(F.count(F.lit(1)).alias("n"))
        .collect()
    )
    return {r["kind"]: int(r["n"]) for r in rows}


def first_bad_record(spec: TableSpec, classified) -> MalformedRecordError:
    """The error for the lowest bad ``(partition, offset)`` of the batch."""
    row = (
        classified.where(F.col(PROBLEM).isNotNull())
        .orderBy("partition", "offset")
        .select(
            "topic",
            "partition",
            "offset",
            F.col(f"{PROBLEM}.kind").alias("kind"),
            F.col(f"{PROBLEM}.reason").alias("reason"),
        )
        .first()
    )
    return MalformedRecordError(
        spec.identifier, row["topic"], row["partition"], row["offset"], f"{row['kind']}: {row['reason']}"
    )
