"""What a commit that merges manifests costs as a table's data files grow (one per commit).

``python -m devtools.bench.manifest_merge [COMMITS] [TARGET_BYTES]`` (default 6,000; the table's
``commit.manifest.target-size-bytes``, default: none, the write path's) appends a one-file,
35-record micro-batch per commit to a fresh table on a SQLite catalog under a temporary
directory, through the write path's own snapshot producer (``merge_append`` on the table without its
history, :func:`kafka_iceberg.batch.commit._without_history`) and commit
(:func:`kafka_iceberg.batch.commit.commit`). Every 500 commits it prints the live data files and the
p50 / p99 / max seconds of producing the snapshot (manifests and manifest list) and of the catalog
commit. About one commit in a hundred merges the manifests and rewrites an entry per live data file:
that is the p99. No Spark, no Kafka. It prints figures; it never asserts.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
from pyiceberg.catalog.sql import SqlCatalog

from kafka_iceberg.batch.commit import _without_history, commit, staged_updates
from kafka_iceberg.batch.files import data_files


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def main(commits: int = 6000, target_bytes: int | None = None, every: int = 500) -> None:
    """Append ``commits`` one-file micro-batches to a table with ``commit.manifest.target-size-bytes``
    ``target_bytes`` (None: not set) and print the figures of each ``every`` commits."""
    with tempfile.TemporaryDirectory(prefix="bench-merge-") as tmp:
        catalog = SqlCatalog("bench", uri=f"sqlite:///{Path(tmp) / 'catalog.db'}", warehouse=f"file://{tmp}")
        catalog.create_namespace("bench")
        rows = pa.table({"id": pa.array(range(35), pa.int64()), "v": pa.array(["x" * 100] * 35)})
        properties = {} if target_bytes is None else {"commit.manifest.target-size-bytes": str(target_bytes)}
        table = catalog.create_table("bench.t", rows.schema, properties=properties)
        produce, swap = [], []
        for i in range(1, commits + 1):
            slim = _without_history(table, "main", "main")
            tx = slim.transaction()
            files = data_files(slim.metadata, rows, slim.io)
            t0 = time.perf_counter()
            with tx.update_snapshot().merge_append() as append:
                for f in files:
                    append.append_data_file(f)
            t1 = time.perf_counter()
            table = commit(table, (), staged_updates(tx))
            produce.append(t1 - t0)
            swap.append(time.perf_counter() - t1)
            if i % every == 0:
                live = table.current_snapshot().summary["total-data-files"]
                p, c = produce[-every:], swap[-every:]
                print(
                    f"{i:>6} commits, {live:>6} data files, {len(table.current_snapshot().manifests(table.io))} "
                    f"manifests: snapshot p50 {_pct(p, 0.5):.3f} p99 {_pct(p, 0.99):.3f} "
                    f"max {max(p):.3f} s; catalog commit p50 {_pct(c, 0.5):.3f} max {max(c):.3f} s",
                    flush=True,
                )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 6000, int(sys.argv[2]) if len(sys.argv) > 2 else None)
