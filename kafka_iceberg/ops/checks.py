"""Table checks: duplicate-free commits and freshness. Plain Python, no Dagster.

The Dagster asset checks in ``lake_assets`` run these and report their figures.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pyiceberg.table import Table

from kafka_iceberg.catalog.tables import TableMetadataView, metadata_view
from kafka_iceberg.declaration.spec import TableSpec
from kafka_iceberg.ops.incremental_check import duplicate_free_since, outcome_figures, overlap_examples
from kafka_iceberg.state import (
    KEY_QUARANTINE_KINDS,
    KEY_QUARANTINED,
    KEY_READ,
    KEY_RECORDS,
    ancestors,
    batch_ranges,
    dead_letter_ref,
    int_map,
    overlapping_batches,
    state_at,
)


@dataclass
class CheckOutcome:
    """Result of a check: ``passed``, a one-line ``summary``, figures for the UI, and ``snapshot_id``: the
    ``main`` snapshot it checked through (None: not a snapshot's check, or an empty table)."""

    passed: bool
    summary: str
    figures: dict[str, Any] = field(default_factory=dict)
    snapshot_id: int | None = None

    @property
    def full_scan(self) -> bool:
        """Whether the check read every row of the table (figure ``scope`` ``full``), not only the rows added
        since an earlier check: only such a pass shows that a table found with duplicates is free of them."""
        return self.figures.get("scope") == "full"


def duplicate_keys(spark, qualified_table: str, spec: TableSpec) -> int:
    """Upsert tables: how many keys appear in more than one row (0 for append tables; one Spark job)."""
    if spec.upsert is None:
        return 0
    keys = ", ".join(f"`{k}`" for k in spec.upsert.key)
    return int(
        spark.sql(
            f"SELECT count(*) FROM (SELECT {keys} FROM {qualified_table} GROUP BY {keys} HAVING count(*) > 1)"
        ).first()[0]
    )


def duplicate_free(
    spark,
    qualified_table: str,
    spec: TableSpec,
    table: Table,
    sample: int = 10,
    commit_id: str | None = None,
    after: int | None = None,
) -> CheckOutcome:
    """Verify that the table holds every Kafka record at most once.

    Four independent views of the same property:
    1. no two snapshots in ``main``'s ancestry cover overlapping offset ranges (snapshot
       summaries, ``kafka.batch``);
    2. no ``(_kafka_partition, _kafka_offset)`` appears twice in the table (a Spark
       aggregation over two columns of the current snapshot);
    3. no data file is referenced twice by the current snapshot (the ``files`` metadata table);
    4. for upsert tables, no key appears in two rows (:func:`duplicate_keys`).

    Returns figures: ``overlapping_snapshot_pairs``, ``duplicate_offsets`` (records that
    are extra copies), ``duplicate_data_files``, ``duplicate_keys``, and up to ``sample`` examples.

    ``table``: the pyiceberg table (``qualified_table`` in Spark); the check covers its ``main`` snapshot
    (:attr:`CheckOutcome.snapshot_id`). With ``commit_id`` (a run that committed) on an append table, only
    the rows added since that commit id's first snapshot (after snapshot ``after``, which an earlier check
    of it covered) are read, by pyiceberg without Spark (:mod:`kafka_iceberg.ops.incremental_check`); the
    full scan (Spark jobs) runs when it committed nothing, and always for upsert tables (a key may repeat
    an old row). Raises what Spark, the catalog or the file IO raise."""
    view = metadata_view(table)
    if commit_id is not None and spec.upsert is None:
        since = duplicate_free_since(table, spec, view, commit_id, after)
        if since is not None:
            passed, summary, figures = outcome_figures(since, sample)
            return CheckOutcome(passed, f"table {spec.identifier}: {summary}", figures, view.main)
    return _full_scan(spark, qualified_table, spec, view, sample)


def _full_scan(spark, qualified_table: str, spec: TableSpec, view: TableMetadataView, sample: int) -> CheckOutcome:
    """:func:`duplicate_free` over every row of ``view``'s ``main`` snapshot: Spark jobs on ``qualified_table``."""
    history = ancestors(view.snapshots, view.main)
    overlaps = overlapping_batches(history)
    dup_rows, dup_examples = _duplicate_offsets(spark, qualified_table, spec, sample)
    files = spark.sql(
        f"SELECT file_path, count(*) AS n FROM {qualified_table}.files GROUP BY file_path HAVING count(*) > 1"
    ).collect()
    dup_keys = duplicate_keys(spark, qualified_table, spec)
    figures = {
        "scope": "full",
        "snapshots_examined": len(history),
        "overlapping_snapshot_pairs": len(overlaps),
        "duplicate_offsets": int(dup_rows),
        "duplicate_data_files": len(files),
        **_examples(overlaps, dup_examples, files, sample),
        "duplicate_keys": dup_keys,
    }
    problems = [
        text
        for count, text in (
            (len(overlaps), f"{len(overlaps)} overlapping snapshot offset ranges"),
            (dup_rows, f"{dup_rows} duplicate (partition, offset) records"),
            (len(files), f"{len(files)} data files referenced twice"),
            (dup_keys, f"{dup_keys} keys ({', '.join(spec.upsert.key) if spec.upsert else ''}) in more than one row"),
        )
        if count
    ]
    if problems:
        return CheckOutcome(
            False, f"table {spec.identifier} has duplicates: " + "; ".join(problems), figures, view.main
        )
    return CheckOutcome(True, f"no duplicates over {len(history)} snapshots", figures, view.main)


def _examples(overlaps: list, dup_examples: list[tuple], files: list, sample: int) -> dict[str, list]:
    """Up to ``sample`` examples of each kind of duplicate, for a check's metadata."""
    return {
        "overlap_examples": overlap_examples(overlaps, sample),
        "duplicate_offset_examples": [{"partition": p, "offset": o, "copies": n} for p, o, n in dup_examples],
        "duplicate_file_examples": [r["file_path"] for r in files[:sample]],
    }


def _duplicate_offsets(spark, qualified_table: str, spec: TableSpec, sample: int) -> tuple[int, list[tuple]]:
    """Records that are extra copies of a (partition, offset), and up to ``sample`` (partition, offset,
    copies) examples (one Spark aggregation over two columns of the current snapshot)."""
    part, off = spec.kafka_column("partition"), spec.kafka_column("offset")
    dup = spark.sql(
        f"SELECT `{part}` AS p, `{off}` AS o, count(*) AS n FROM {qualified_table} "
        f"GROUP BY `{part}`, `{off}` HAVING count(*) > 1"
    ).cache()
    try:
        dup_rows = dup.selectExpr("coalesce(sum(n - 1), 0) AS extra").collect()[0]["extra"]
        return int(dup_rows), [(r["p"], r["o"], r["n"]) for r in dup.orderBy("p", "o").limit(sample).collect()]
    finally:
        dup.unpersist()


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
    figures: dict[str, Any] = {
        "lag_records": lag,
        "max_snapshot_age_s": policy.max_snapshot_age_s,
        "max_valid_through_age_s": policy.max_valid_through_age_s,
    }
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


def quarantine(
    spark, catalog_name: str, spec: TableSpec, view: TableMetadataView, dead_letter_view: TableMetadataView | None
) -> CheckOutcome:
    """Check the latest micro-batch that read records against the table's bad-record policy, and
    reconcile its accounting with the dead-letter table.

    Fails when any of these holds for that batch (read from its snapshot summary, and from the
    dead-letter table ``spec.bad_records.dead_letter_identifier`` with Spark):

    1. quarantined / read > ``bad_records.max_quarantine_rate`` (records / records);
    2. records were quarantined as ``schema`` (a producer's type change or dropped required
       field, blocked from the table);
    3. per partition, rows added + rows quarantined != records read, or the dead-letter table
       does not hold exactly the batch's quarantined offsets (counted by (partition, offset)
       inside the batch's ranges), or its dead-letter snapshot is not published;
    4. the dead-letter table holds a (partition, offset) twice.

    Figures: ``read``, ``quarantined``, ``quarantine_rate``, ``kinds``, ``dead_letter_rows_in_batch``,
    ``duplicate_dead_letters``, ``snapshot_id``.
    """
    policy = spec.bad_records
    latest = _latest_reading_batch(view)
    figures: dict[str, Any] = {
        "max_quarantine_rate": policy.max_quarantine_rate,
        "dead_letter_table": policy.dead_letter_identifier,
    }
    if latest is None:
        return CheckOutcome(True, "no micro-batch has read records yet", figures)
    read, bad = int_map(latest, KEY_READ), int_map(latest, KEY_QUARANTINED)
    added = int(latest.summary.get(KEY_RECORDS, "0"))
    kinds = json.loads(latest.summary.get(KEY_QUARANTINE_KINDS) or "{}")
    n_read, n_bad = sum(read.values()), sum(bad.values())
    rate = n_bad / n_read
    figures.update(
        {
            "snapshot_id": str(latest.snapshot_id),
            "read": n_read,
            "quarantined": n_bad,
            "added": added,
            "quarantine_rate": round(rate, 6),
            "kinds": kinds,
        }
    )
    problems = []
    if added + n_bad != n_read:
        problems.append(f"rows added {added} + quarantined {n_bad} != records read {n_read}")
    in_batch, dup = {}, 0
    if dead_letter_view is not None and dead_letter_view.main is not None:
        in_batch, dup, unpublished = _dead_letters_of(spark, catalog_name, spec, latest, dead_letter_view)
        problems += unpublished
    figures["dead_letter_rows_in_batch"] = sum(in_batch.values())
    figures["duplicate_dead_letters"] = dup
    problems += _quarantine_problems(policy.max_quarantine_rate, rate, n_read, in_batch, bad, dup, kinds)
    if problems:
        return CheckOutcome(False, f"table {spec.identifier}: " + "; ".join(problems), figures)
    return CheckOutcome(True, f"{n_bad} of {n_read} records quarantined ({rate:.2%}); accounting reconciles", figures)


def _quarantine_problems(
    max_rate: float,
    rate: float,
    n_read: int,
    in_batch: dict[int, int],
    bad: dict[int, int],
    dup: int,
    kinds: dict[str, int],
) -> list[str]:
    """What fails the quarantine check of a batch that read ``n_read`` records and quarantined
    ``rate`` of them, given the dead-letter rows per partition ``in_batch``, its quarantined records
    per partition ``bad``, records quarantined twice ``dup`` and its quarantined records per kind ``kinds``."""
    problems = []
    n_bad = sum(bad.values())
    if {p: n for p, n in in_batch.items() if n} != {p: n for p, n in bad.items() if n}:
        problems.append(f"dead-letter rows per partition {in_batch} != quarantined per partition {bad}")
    if dup:
        problems.append(f"{dup} records quarantined twice")
    if rate > max_rate:
        problems.append(f"quarantine rate {rate:.2%} is above {max_rate:.2%} ({n_bad} of {n_read} records)")
    if kinds.get("schema"):
        problems.append(f"{kinds['schema']} records blocked by the table schema (a producer schema change?)")
    return problems


def _latest_reading_batch(view: TableMetadataView):
    """The newest snapshot of ``main``'s ancestry whose micro-batch read records, or None."""
    return next(
        (
            s
            for s in ancestors(view.snapshots, view.main)
            if KEY_READ in s.summary and sum(int_map(s, KEY_READ).values()) > 0
        ),
        None,
    )


def _dead_letters_of(spark, catalog_name: str, spec: TableSpec, latest, dead_letter_view: TableMetadataView):
    """Dead-letter rows per partition inside ``latest``'s batch ranges, rows quarantined twice, and
    a problem if ``latest``'s dead-letter snapshot is not published (Spark queries)."""
    dlq = f"{catalog_name}.{spec.bad_records.dead_letter_identifier}"
    in_batch: dict[int, int] = {}
    ranges = batch_ranges(latest)
    if ranges:
        cond = " OR ".join(
            f"(`partition` = {p} AND `offset` >= {s} AND `offset` < {e})" for p, (s, e) in ranges.items()
        )
        in_batch = {
            r["p"]: int(r["n"])
            for r in spark.sql(
                f"SELECT `partition` AS p, count(*) AS n FROM {dlq} WHERE `topic` = '{spec.topic}' AND ({cond}) GROUP BY `partition`"
            ).collect()
        }
    dup = int(
        spark.sql(
            f"SELECT coalesce(sum(n - 1), 0) AS extra FROM (SELECT count(*) AS n FROM {dlq} "
            f"GROUP BY `topic`, `partition`, `offset` HAVING count(*) > 1)"
        ).collect()[0]["extra"]
    )
    ref = dead_letter_ref(latest)
    published = {s.snapshot_id for s in ancestors(dead_letter_view.snapshots, dead_letter_view.main)}
    problems = []
    if ref is not None and int(ref["snapshot-id"]) not in published:
        problems.append(f"dead-letter snapshot {ref['snapshot-id']} is not published yet")
    return in_batch, dup, problems
