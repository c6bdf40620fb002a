"""Goal 4 of the benchmark: a micro-batch's cost versus the table's snapshot history.

One table per level is grown to 10, 100 and 1,000 snapshots with pyiceberg filler appends that
carry the ``kafka.*`` summary the write path writes, over records really produced to its topic;
then real micro-batches are timed in interleaved rounds, one per level per round. See
docs/benchmark.md, "(4a) commit time versus snapshot count".
"""

from __future__ import annotations

import json
import time
import uuid
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import urlparse

import pyarrow as pa

from devtools.bench.common import (
    COMMITS_TOPIC,
    PARTITIONS,
    TOPIC_CONFIG,
    flights_records,
    flights_spec,
    fmt_phases,
    metadata_json_bytes,
    produce_round_robin,
    read_back,
    say,
    section,
    timed_batch,
)
from devtools.demo import data as demo_data
from kafka_iceberg.batch.pipeline import TableWriter
from kafka_iceberg.catalog.tables import metadata_view
from kafka_iceberg.config.settings import Settings
from kafka_iceberg.declaration.spec import TableSpec
from kafka_iceberg.kafka.admin import KafkaConfig, KafkaMetadata
from kafka_iceberg.state import ingest_summary, state_at


def _plain_type(t: pa.DataType) -> pa.DataType:
    if pa.types.is_list(t):
        return pa.list_(_plain_field(t.value_field))
    if pa.types.is_large_list(t):
        return pa.large_list(_plain_field(t.value_field))
    if pa.types.is_struct(t):
        return pa.struct([_plain_field(f) for f in t])
    return t


def _plain_field(f: pa.Field) -> pa.Field:
    return pa.field(f.name, _plain_type(f.type), f.nullable)  # same field, without its field-id metadata


def filler_rows(recs: list[tuple[int, tuple]], topic: str, spec: TableSpec) -> list[dict]:
    """Table rows for Kafka records, as the write path would write them.

    ``recs`` are (partition, (offset, timestamp_ms, key, value))."""
    out = []
    for p, (offset, ts_ms, key, value) in recs:
        data = json.loads(value)
        row = {}
        for col in spec.columns:
            v = data.get(col.name)
            if v is not None:
                if col.type == "timestamp":
                    v = datetime.fromisoformat(str(v).replace("Z", "+00:00"))
                elif col.type in ("double", "float"):
                    v = float(v)
            row[col.name] = v
        row.update(
            {
                "_kafka_topic": topic,
                "_kafka_partition": p,
                "_kafka_offset": offset,
                "_kafka_timestamp": datetime.fromtimestamp(ts_ms / 1000, tz=timezone.utc),
                "_kafka_key": key,
                "_kafka_headers": None,
            }
        )
        out.append(row)
    return out


def append_filler(table, rows: list[dict], summary: dict[str, str], schema: pa.Schema, data_dir: Path) -> None:
    """One pyiceberg append (one snapshot) of ``rows``, carrying ``summary``.

    ``Table.append`` would compute the months(time_hour) partition with pyiceberg-core, which is
    not installed; so the rows are written by pyarrow to one Parquet file per month under the
    table's data directory and committed with ``Table.add_files`` (the same append snapshot
    producer, so the same manifest handling)."""
    import pyarrow.parquet as pq

    by_month: dict[int, list[dict]] = {}
    for row in rows:
        th = row["time_hour"]
        by_month.setdefault((th.year - 1970) * 12 + th.month - 1, []).append(row)
    paths = []
    for _month, month_rows in sorted(by_month.items()):
        path = data_dir / f"filler-{uuid.uuid4().hex}.parquet"
        pq.write_table(pa.Table.from_pylist(month_rows, schema=schema), path, compression="zstd")
        paths.append(f"file://{path}")
    table.add_files(paths, snapshot_properties=summary, check_duplicate_files=False)


@contextmanager
def cheap_metadata_copies():
    """Make pyiceberg appends to a table with many snapshots affordable, while growing fillers.

    pyiceberg 0.12's ``update_table_metadata`` ends with a deep copy of the whole table metadata,
    and ``Transaction.table_metadata`` calls it on every access (about 20 times per append), so
    one append to a table with ~1,000 snapshots costs seconds and the growth is O(snapshots^2).
    Under this patch it is the write path's :func:`kafka_iceberg.batch.commit.apply_updates`, the
    same function without that copy (tests/test_commit.py pins the two equal). Only the filler
    growth runs under it; the timed micro-batches run the write path unchanged."""
    import pyiceberg.catalog as catalog_module
    import pyiceberg.table as table_module
    import pyiceberg.table.update as update_module

    from kafka_iceberg.batch.commit import apply_updates

    original = update_module.update_table_metadata

    def update_table_metadata(base_metadata, updates, enforce_validation=False, metadata_location=None):
        if enforce_validation:
            return original(base_metadata, updates, enforce_validation, metadata_location)
        return apply_updates(base_metadata, tuple(updates), metadata_location)

    modules = (update_module, table_module, catalog_module)
    for module in modules:
        module.update_table_metadata = update_table_metadata
    try:
        yield
    finally:
        for module in modules:
            module.update_table_metadata = original


def grow_snapshots(catalog, spec: TableSpec, config: KafkaConfig, kafka: KafkaMetadata, df, target: int) -> int:
    """Append pyiceberg snapshots until the table has ``target`` snapshots. Each filler snapshot
    holds one freshly produced record per partition, written as the write path would write
    it, and carries the ingest summary the write path would write for it (offsets advanced,
    max timestamps carried forward). Returns the snapshots added."""
    table = catalog.load_table(spec.identifier)
    need = target - len(table.metadata.snapshots)
    if need <= 0:
        return 0
    partitions = kafka.partitions(spec.topic)
    view = metadata_view(table)
    state = state_at(view.snapshots, view.main)
    before = kafka.watermarks(spec.topic, partitions)
    offsets = {p: state.offsets.get(p, before[p].low) for p in partitions}
    first_row = sum(w.high for w in before.values())  # rows produced so far = next row position
    produce_round_robin(config, spec.topic, flights_records(df, first_row, need * len(partitions)), len(partitions))
    after = kafka.watermarks(spec.topic, partitions)
    records = read_back(config, spec.topic, offsets, {p: after[p].high for p in partitions})
    max_ts = dict(state.max_timestamps)
    schema = pa.schema([_plain_field(f) for f in table.schema().as_arrow()])  # Parquet without field ids
    data_dir = Path(urlparse(table.location()).path) / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    with cheap_metadata_copies():
        _append_fillers(table, spec, partitions, records, offsets, max_ts, need, schema, data_dir)
    return need


def _append_fillers(table, spec, partitions, records, offsets, max_ts, need, schema, data_dir) -> None:
    for i in range(need):
        rows, batch = [], {}
        for p in partitions:
            if i < len(records[p]):
                rec = records[p][i]
                rows.append((p, rec))
                batch[p] = (offsets[p], rec[0] + 1)
                offsets[p] = rec[0] + 1
                max_ts[p] = max(max_ts.get(p, rec[1]), rec[1])
        summary = ingest_summary(
            topic=spec.topic,
            offsets=offsets,
            batch=batch,
            max_timestamps=max_ts,
            commit_id=str(uuid.uuid4()),
            records=len(rows),
        )
        append_filler(table, filler_rows(rows, spec.topic, spec), summary, schema, data_dir)


REPEATS = 15
"""Rounds of timed micro-batches: each round runs one batch on every level's table; a level's figures
are those of its median batch."""


def _level_table(spark, settings: Settings, config: KafkaConfig, kafka: KafkaMetadata, catalog, level: int):
    """The spec and writer of the 4a table for ``level`` snapshots, on a topic of its own."""
    topic = f"{COMMITS_TOPIC}.{level}"
    demo_data.create_topic(config, topic, PARTITIONS, TOPIC_CONFIG)
    spec = flights_spec(f"bench_commits_{level}", f"bench.commits_{level}", topic, 10_000_000)
    writer = TableWriter(spark, settings, spec, kafka, catalog)
    writer.ensure_table()
    table = catalog.load_table(spec.identifier)
    # Iceberg Java (Spark) merges manifests on append by default; pyiceberg only with this
    # property, so setting it keeps the filler manifests as Spark would have left them.
    with table.transaction() as tx:
        tx.set_properties({"commit.manifest-merge.enabled": "true"})
    return spec, writer


def part_c(
    spark,
    settings: Settings,
    config: KafkaConfig,
    kafka: KafkaMetadata,
    catalog,
    df,
    levels: list[int],
    batch_records: int,
) -> list[dict]:
    section(f"(c) commit time versus snapshot count ({batch_records:,}-record micro-batches)")
    say(
        "one table per level, each on its own topic. Filler snapshots: one pyiceberg append each (Table.add_files\n"
        "of a Parquet file written by pyarrow) of 1 record per Kafka partition, records really produced to the topic,\n"
        "with the kafka.* summary the write path writes (ingest_summary: offsets advanced, max timestamps carried\n"
        "forward), so the committed offsets stay where the next micro-batch starts. Then the levels are timed in\n"
        f"{REPEATS} interleaved rounds (one batch per level per round, the order rotating), so a drift of the\n"
        "machine or of the JIT over the run falls on every level alike."
    )
    tables = {}
    for level in levels:
        spec, writer = _level_table(spark, settings, config, kafka, catalog, level)
        t0 = time.perf_counter()
        added = grow_snapshots(catalog, spec, config, kafka, df, level)
        table = catalog.load_table(spec.identifier)
        view = metadata_view(table)
        state = state_at(view.snapshots, view.main)
        consistent = state.offsets == {p: w.high for p, w in kafka.watermarks(spec.topic).items()}
        tables[level] = {
            "spec": spec,
            "writer": writer,
            "runs": [],
            "snapshots": len(table.metadata.snapshots),
            "meta_bytes": metadata_json_bytes(table),
            "state": state,
        }
        say(
            f"{level:>5,}: {added} filler appends in {time.perf_counter() - t0:.1f} s; "
            f"committed offsets == high watermarks: {'yes' if consistent else 'NO'}"
        )
    for i in range(REPEATS):
        order = levels[i % len(levels) :] + levels[: i % len(levels)]
        for level in order:
            t = tables[level]
            done = sum(w.high for w in kafka.watermarks(t["spec"].topic).values())
            demo_data.produce(config, t["spec"].topic, flights_records(df, done, batch_records))
            t["runs"].append(timed_batch(t["writer"]))
    rows = [_level_row(catalog, kafka, level, tables[level], batch_records) for level in levels]
    _print_table(rows)
    return rows


def _each(runs: list, phases: tuple[str, ...]) -> str:
    """Per timed batch, the sum of ``phases`` (seconds), comma-separated."""
    return ", ".join(f"{sum(r[2].phase_seconds.get(p, 0.0) for p in phases):.2f}" for r in runs)


def _level_row(catalog, kafka: KafkaMetadata, level: int, t: dict, batch_records: int) -> dict:
    """Print one level's timed batches and return its figures (those of the median batch)."""
    runs, spec = t["runs"], t["spec"]
    started_at_state = runs[0][3].start_offsets == t["state"].offsets
    plan_s, exec_s, result, plan = sorted(runs, key=lambda r: r[1])[len(runs) // 2]
    after_table = catalog.load_table(spec.identifier)
    in_table = int(after_table.current_snapshot().summary.additional_properties.get("total-records", -1))
    in_topic = sum(w.high - w.low for w in kafka.watermarks(spec.topic).values())
    row = {
        "snapshots": t["snapshots"],
        "plan_s": plan_s,
        "exec_s": exec_s,
        "publish_s": result.phase_seconds.get("publish_s", float("nan")),
        "write_s": result.phase_seconds.get("write_s", float("nan")),
        "meta_bytes": t["meta_bytes"],
        "meta_after": metadata_json_bytes(after_table),
        "snapshots_after": len(after_table.metadata.snapshots),
        "records": result.records,
        "commits_s": sorted(sum(r[2].phase_seconds.get(k, 0.0) for k in ("branch_s", "publish_s")) for r in runs)[
            len(runs) // 2
        ],
    }
    say(
        f"{t['snapshots']:>5,} snapshots: {len(runs)} timed micro-batches of {result.records:,} records, "
        f"execute {', '.join(f'{r[1]:.2f}' for r in runs)} s"
    )
    say(
        f"      read_s of each: {_each(runs, ('read_s',))} s; branch_s + publish_s: {_each(runs, ('branch_s', 'publish_s'))} s"
    )
    say(f"      median: plan {plan_s:.2f} s, execute {exec_s:.2f} s [{fmt_phases(result.phase_seconds)}]")
    say(
        f"      check: rows in table (total-records) {in_table:,} = records in topic {in_topic:,}: "
        f"{'OK' if in_table == in_topic else 'MISMATCH'}; plan started at the committed offsets: "
        f"{'yes' if started_at_state else 'NO'}; snapshots now {row['snapshots_after']:,}"
    )
    if result.records != batch_records:
        say(f"      WARNING: the batch read {result.records} records, expected {batch_records}")
    return row


def _print_table(rows: list[dict]) -> None:
    say()
    say("snapshots before | plan s | execute s | publish s | write s | metadata.json bytes before -> after")
    say("-----------------+--------+-----------+-----------+---------+-------------------------------------")
    for r in rows:
        say(
            f"{r['snapshots']:>16,} | {r['plan_s']:>6.2f} | {r['exec_s']:>9.2f} | {r['publish_s']:>9.2f} | "
            f"{r['write_s']:>7.2f} | {r['meta_bytes']:>12,} -> {r['meta_after']:,}"
        )
