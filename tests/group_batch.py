"""One micro-batch of a consistency group, run in its own process by tests/test_group_commit.py so a
crash hook (``LAKE_CRASH_AT``) can SIGKILL it: every member gets an attempt branch, its data files and
a staged publish, then :func:`kafka_iceberg.batch.group_commit.commit_group` commits them together.

The source is synthetic: table ``i`` holds ids ``0 .. records - 1`` at offsets of partition 0, and a
batch reads from the group's committed offsets to ``records``. Prints a JSON line with what it did."""

from __future__ import annotations

import json
import sys
import time

import pyarrow as pa
from pyiceberg.catalog.sql import SqlCatalog

from devtools.rehearsal.faults import env_crash_hook
from kafka_iceberg.batch.commit import commit_branch, stage_publish
from kafka_iceberg.batch.files import data_files
from kafka_iceberg.batch.group_commit import GroupMember, commit_group
from kafka_iceberg.batch.recovery import attempt_branch
from kafka_iceberg.catalog.tables import metadata_view
from kafka_iceberg.state import group_state, group_summary, ingest_summary, state_at


def run(uri: str, name: str, warehouse: str, identifiers: list[str], records: int, commit_id: str) -> dict:
    """Plan, write and group-commit one batch; returns ``{"committed": seq}`` or ``{"committed": None}``."""
    catalog = SqlCatalog(name, uri=uri, warehouse=warehouse)
    tables = [catalog.load_table(i) for i in identifiers]
    views = [metadata_view(t) for t in tables]
    starts = [state_at(v.snapshots, v.main).offsets.get(0, 0) for v in views]
    if all(start >= records for start in starts):
        return {"committed": None}
    seq = 1 + max((group_state(v.snapshots, v.main) or {"seq": 0})["seq"] for v in views)
    members = {i: (f"topic.{i}", {0: records}) for i in identifiers}
    group = group_summary("shop", seq, {"transactions": {"0": seq}}, members)
    branch = attempt_branch(commit_id, int(time.time() * 1000))
    staged = []
    for table, start in zip(tables, starts, strict=True):
        base = table.metadata.current_snapshot_id
        on_branch = commit_branch(table, branch, base)
        rows = pa.table({"id": pa.array(range(start, records), pa.int64())})
        files = data_files(on_branch.metadata, rows, on_branch.io)
        summary = ingest_summary(
            topic=f"topic.{'.'.join(table.name())}",
            offsets={0: records},
            batch={0: (start, records)},
            max_timestamps={},
            commit_id=commit_id,
            records=records - start,
        )
        staged.append(
            stage_publish(
                on_branch, files, {**summary, **group}, branch=branch, branch_base=base, ref="main", ref_base=base
            )
        )
    commit_group([GroupMember.of(s) for s in staged], crash_hook=env_crash_hook())
    return {"committed": seq}


if __name__ == "__main__":
    args = json.loads(sys.argv[1])
    print(json.dumps(run(**args)))
