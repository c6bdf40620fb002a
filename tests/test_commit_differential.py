"""kafka_iceberg/batch/commit.py against pyiceberg's own commit, on a real SqlCatalog (SQLite): the
pyiceberg version is the one the module was written for, and random sequences of appends, branch
creations, fast-forwards, ref removals, schema and property updates (and requirements that fail),
applied once through :func:`~kafka_iceberg.batch.commit.commit` and once through pyiceberg's public
``Catalog.commit_table``, give equal metadata (ids and timestamps aside)."""

from __future__ import annotations

import random
from pathlib import Path

import pyarrow as pa
import pyiceberg
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.schema import Schema
from pyiceberg.table.refs import SnapshotRefType
from pyiceberg.table.update import (
    AssertRefSnapshotId,
    RemovePropertiesUpdate,
    RemoveSnapshotRefUpdate,
    SetPropertiesUpdate,
    SetSnapshotRefUpdate,
)
from pyiceberg.types import LongType, NestedField, StringType

from kafka_iceberg.batch import commit as commit_module
from kafka_iceberg.batch.commit import commit, staged_updates


def test_pyiceberg_is_the_version_batch_commit_was_written_for():
    # an upgrade: re-check the private pyiceberg code kafka_iceberg/batch/commit.py wraps, then bump
    assert pyiceberg.__version__ == commit_module.WRITTEN_FOR


PROPERTIES = {"write.metadata.previous-versions-max": "4", "write.metadata.delete-after-commit.enabled": "true"}


def _catalog(root: Path, name: str) -> SqlCatalog:
    root.mkdir()
    catalog = SqlCatalog("lake", uri=f"sqlite:///{root}/catalog.db", warehouse=f"file://{root}/warehouse")
    catalog.create_namespace("db")
    schema = Schema(NestedField(1, "id", LongType(), required=False), NestedField(2, "s", StringType(), required=False))
    catalog.create_table(f"db.{name}", schema, properties=PROPERTIES)
    return catalog


def _rows(rng: random.Random, table) -> pa.Table:
    n = rng.randint(1, 5)
    columns = {f.name: f for f in table.schema().fields}
    data = {"id": pa.array([rng.randint(0, 1000) for _ in range(n)], pa.int64()), "s": [f"r{i}" for i in range(n)]}
    for extra in [c for c in columns if c not in data]:
        data[extra] = pa.array([None] * n, pa.string())
    return pa.table(data)


def _branch(name: str, snapshot_id: int) -> SetSnapshotRefUpdate:
    return SetSnapshotRefUpdate(ref_name=name, type=SnapshotRefType.BRANCH, snapshot_id=snapshot_id)


def _step(rng: random.Random, table, step: int) -> tuple[tuple, tuple]:
    """One random operation on ``table``: (requirements, updates)."""
    md = table.metadata
    branches = [name for name in md.refs if name != "main"]
    snapshots = [s.snapshot_id for s in md.snapshots]
    kind = rng.choice(
        ["append", "append", "append", "branch", "fast_forward", "remove", "schema", "properties", "refused"]
    )
    if kind == "append" or not snapshots:
        ref = rng.choice(["main", *branches])
        tx = table.transaction()
        tx.append(_rows(rng, table), branch=ref, snapshot_properties={"kafka.step": str(step)})
        head = md.refs[ref].snapshot_id if ref in md.refs else None
        return (AssertRefSnapshotId(ref=ref, snapshot_id=head),), staged_updates(tx)
    if kind == "branch":
        name = f"b{step}"
        return (AssertRefSnapshotId(ref=name, snapshot_id=None),), (_branch(name, rng.choice(snapshots)),)
    if kind == "fast_forward" and branches:
        source = rng.choice(branches)
        head = md.refs[source].snapshot_id
        main = md.refs["main"].snapshot_id if "main" in md.refs else None
        requirements = (
            AssertRefSnapshotId(ref="main", snapshot_id=main),
            AssertRefSnapshotId(ref=source, snapshot_id=head),
        )
        return requirements, (_branch("main", head), RemoveSnapshotRefUpdate(ref_name=source))
    if kind == "remove" and branches:
        return (), (RemoveSnapshotRefUpdate(ref_name=rng.choice(branches)),)
    if kind == "schema":
        tx = table.transaction()
        with tx.update_schema() as update:
            update.add_column(f"c{step}", StringType())
        return (), staged_updates(tx)
    if kind == "refused":  # a requirement that fails: nothing may change on either side
        return (AssertRefSnapshotId(ref="main", snapshot_id=-1),), (SetPropertiesUpdate(updates={"never": "set"}),)
    if md.properties and rng.random() < 0.3:
        removable = [k for k in md.properties if k.startswith("test.")]
        if removable:
            return (), (RemovePropertiesUpdate(removals=[rng.choice(removable)]),)
    return (), (SetPropertiesUpdate(updates={f"test.p{rng.randint(0, 3)}": str(step)}),)


def _normal(metadata) -> dict:
    """The metadata without what differs by nature between two tables: uuid, locations, timestamps
    (the metadata log is compared by length, the snapshot log by snapshot ids)."""
    out = metadata.model_dump(mode="json", by_alias=True)
    for key in ("table-uuid", "location", "last-updated-ms"):
        out.pop(key)
    out["metadata-log"] = len(metadata.metadata_log)
    out["snapshot-log"] = [entry.snapshot_id for entry in metadata.snapshot_log]
    out["snapshots"] = [
        {k: v for k, v in s.items() if k not in ("timestamp-ms", "manifest-list")} for s in out["snapshots"]
    ]
    return out


@pytest.mark.parametrize("seed", range(4))
def test_random_commits_equal_pyicebergs_commit_table(tmp_path, seed):
    rng = random.Random(seed)
    ours_catalog, theirs_catalog = _catalog(tmp_path / "ours", "t"), _catalog(tmp_path / "theirs", "t")
    ours, theirs = ours_catalog.load_table("db.t"), theirs_catalog.load_table("db.t")
    done: tuple = ()
    for step in range(40):
        requirements, updates = _step(rng, ours, step)  # the same updates (snapshot ids included) for both
        outcomes = []
        try:
            ours = commit(ours, requirements, updates)
            outcomes.append("committed")
        except CommitFailedException:
            outcomes.append("refused")
        try:
            theirs_catalog.commit_table(theirs, requirements, updates)
            outcomes.append("committed")
        except CommitFailedException:
            outcomes.append("refused")
        theirs = theirs_catalog.load_table("db.t")
        assert outcomes[0] == outcomes[1], (seed, step, updates)
        done += updates if outcomes[0] == "committed" else ()
        assert ours_catalog.load_table("db.t").metadata == ours.metadata, "the committed table is what was stored"
        assert _normal(ours.metadata) == _normal(theirs.metadata), (seed, step, updates)
    kinds = {type(u).__name__ for u in done}
    assert len(ours.metadata.snapshots) > 3 and len(kinds) >= 5, f"the sequence did things: {kinds}"
    metadata_dir = Path(ours.location().removeprefix("file://"), "metadata")
    kept = {Path(e.metadata_file).name for e in ours.metadata.metadata_log} | {Path(ours.metadata_location).name}
    assert {p.name for p in metadata_dir.glob("*.metadata.json")} == kept, "files off the metadata log are deleted"
