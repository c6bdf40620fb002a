"""Table checks: duplicate-free commits and freshness. Plain Python, no Dagster.

The Dagster asset checks in ``lake_assets`` run these and report their figures.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Mapping

from kafka_iceberg.catalog import TableMetadataView
from kafka_iceberg.spec import TableSpec
from kafka_iceberg.state import ancestors, overlapping_batches, state_at


@dataclass
class CheckOutcome:
    """Result of a check: ``passed``, a one-line ``summary``, and figures for the UI."""

    passed: bool
    summary: str
    figures: dict[str, Any] = field(default_factory=dict)


def duplicate_free(spark, qualified_table: str, spec: TableSpec, view: TableMetadataView, sample: int = 10) -> CheckOutcome:
    """Verify that the table holds every Kafka record at most once.

    Three independent views of the same property:

    1. no two snapshots in ``main``'s ancestry cover overlapping offset ranges (snapshot
       summaries, ``kafka.batch``);
    2. no ``(_kafka_partition, _kafka_offset)`` appears twice in the table (a Spark
       aggregation over two columns of the current snapshot);
    3. no data file is referenced twice by the current snapshot (the ``files`` metadata table).

    Returns figures: ``overlapping_snapshot_pairs``, ``duplicate_offsets`` (records that
    are extra copies), ``duplicate_data_files``, and up to ``sample`` examples of each.
    """
    history = ancestors(view.snapshots, view.main)
    overlaps = overlapping_batches(history)
    part, off = spec.kafka_column("partition"), spec.kafka_column("offset")
    dup = spark.sql(
        f"SELECT `{part}` AS p, `{off}` AS o, count(*) AS n FROM {qualified_table} "
        f"GROUP BY `{part}`, `{off}` HAVING count(*) > 1"
    ).cache()
    try:
        dup_rows = dup.selectExpr("coalesce(sum(n - 1), 0) AS extra").collect()[0]["extra"]
        dup_examples = [(r["p"], r["o"], r["n"]) for r in dup.orderBy("p", "o").limit(sample).collect()]
    finally:
        dup.unpersist()
    files = spark.sql(
        f"SELECT file_path, count(*) AS n FROM {qualified_table}.files GROUP BY file_path HAVING count(*) > 1"
    ).collect()
    figures = {
        "snapshots_examined": len(history),
        "overlapping_snapshot_pairs": len(overlaps),
        "duplicate_offsets": int(dup_rows),
        "duplicate_data_files": len(files),
        "overlap_examples": [
            {"partition": o.partition, "snapshot": o.first[0], "range": list(o.first[1]),
             "other_snapshot": o.second[0], "other_range": list(o.second[1])}
            for o in overlaps[:sample]
        ],
        "duplicate_offset_examples": [{"partition": p, "offset": o, "copies": n} for p, o, n in dup_examples],
        "duplicate_file_examples": [r["file_path"] for r in files[:sample]],
    }
    problems = []
    if overlaps:
        problems.append(f"{len(overlaps)} overlapping snapshot offset ranges")
    if dup_rows:
        problems.append(f"{dup_rows} duplicate (partition, offset) records")
    if files:
        problems.append(f"{len(files)} data files referenced twice")
    if problems:
        return CheckOutcome(False, f"table {spec.identifier} has duplicates: " + "; ".join(problems), figures)
    return CheckOutcome(True, f"no duplicates over {len(history)} snapshots", figures)


def freshness(
    spec: TableSpec,
    view: TableMetadataView,
    lag_by_partition: Mapping[int, int],
    now_ms: int | None = None,
) -> CheckOutcome:
    """Compare the latest ingest snapshot's age and its valid-through age with the table's thresholds.

    Args:
        lag_by_partition: offset lag now (high watermark - committed offset), from Kafka.
        now_ms: the current time, ms since epoch (default: the clock).

    The snapshot-age rule passes when the latest ingest snapshot is younger than
    ``max_snapshot_age`` *or* the table has no lag: a table that is caught up is not stale
    just because the topic is quiet. The valid-through rule (skipped when
    ``max_valid_through_age`` is ``none``) compares now with the snapshot's valid-through
    timestamp, the event time up to which every partition is complete.
    """
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    state = state_at(view.snapshots, view.main)
    lag = int(sum(lag_by_partition.values()))
    policy = spec.freshness
    figures: dict[str, Any] = {"lag_records": lag, "max_snapshot_age_s": policy.max_snapshot_age_s,
                               "max_valid_through_age_s": policy.max_valid_through_age_s}
    if state.snapshot_id is None:
        return CheckOutcome(False, f"table {spec.identifier} has no ingest snapshot yet", figures)
    snapshot_age_s = (now_ms - state.snapshot_timestamp_ms) / 1000
    figures["snapshot_age_s"] = round(snapshot_age_s, 1)
    figures["snapshot_id"] = str(state.snapshot_id)
    problems = []
    if snapshot_age_s > policy.max_snapshot_age_s and lag > 0:
        problems.append(
            f"latest snapshot is {snapshot_age_s:.0f} s old (threshold {policy.max_snapshot_age_s:.0f} s) with {lag} records of lag"
        )
    if state.valid_through_ms is not None:
        vt_age = (now_ms - state.valid_through_ms) / 1000
        figures["valid_through_ms"] = state.valid_through_ms
        figures["valid_through_age_s"] = round(vt_age, 1)
        if policy.max_valid_through_age_s is not None and vt_age > policy.max_valid_through_age_s:
            problems.append(f"valid-through is {vt_age:.0f} s old (threshold {policy.max_valid_through_age_s:.0f} s)")
    elif policy.max_valid_through_age_s is not None:
        problems.append("no valid-through timestamp yet (no partition has delivered a record)")
    if problems:
        return CheckOutcome(False, f"table {spec.identifier} is stale: " + "; ".join(problems), figures)
    return CheckOutcome(True, f"snapshot {snapshot_age_s:.0f} s old, lag {lag} records", figures)
