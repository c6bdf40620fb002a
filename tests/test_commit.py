"""Commits on a known base (kafka_iceberg/batch/commit.py) against a real pyiceberg SqlCatalog on
SQLite: the metadata they write equals pyiceberg's own commit's (this pins the private pyiceberg
functions the module wraps), they round-trip through the catalog, and a stale base or a failed
requirement commits nothing. The write path's tests run the same commits under Spark and Java."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.schema import Schema
from pyiceberg.table.refs import SnapshotRefType
from pyiceberg.table.update import (
    AssertRefSnapshotId,
    RemoveSnapshotRefUpdate,
    SetSnapshotRefUpdate,
    update_table_metadata,
)
from pyiceberg.types import LongType, NestedField, StringType

from kafka_iceberg.batch.commit import StaleBaseError, apply_updates, commit, staged_updates


@pytest.fixture()
def table(tmp_path: Path):
    """An unpartitioned table with three appends, on a SqlCatalog named like Spark's (``lake``)."""
    catalog = SqlCatalog("lake", uri=f"sqlite:///{tmp_path}/catalog.db", warehouse=f"file://{tmp_path}/warehouse")
    catalog.create_namespace("db")
    schema = Schema(NestedField(1, "id", LongType(), required=False), NestedField(2, "s", StringType(), required=False))
    t = catalog.create_table("db.t", schema)
    for i in range(3):
        t.append(
            pa.table({"id": pa.array([i], pa.int64()), "s": [f"r{i}"]}), snapshot_properties={"kafka.records": "1"}
        )
    return catalog.load_table("db.t")


def _branch(name: str, snapshot_id: int) -> SetSnapshotRefUpdate:
    return SetSnapshotRefUpdate(ref_name=name, type=SnapshotRefType.BRANCH, snapshot_id=snapshot_id)


def _metadata_files(t) -> set[str]:
    return {p.name for p in Path(t.location().removeprefix("file://"), "metadata").glob("*.metadata.json")}


def test_apply_updates_equals_pyicebergs_update_table_metadata(table):
    head = table.metadata.current_snapshot_id
    tx = table.transaction()
    tx.append(pa.table({"id": pa.array([9], pa.int64()), "s": ["r9"]}))
    appended = staged_updates(tx)  # AddSnapshot + SetSnapshotRef(main): last-updated-ms is the snapshot's
    cases = [
        appended,
        (_branch("attempt", head),),
        (_branch("attempt", head), RemoveSnapshotRefUpdate(ref_name="attempt")),
    ]
    for updates in cases:
        ours = apply_updates(table.metadata, updates, table.metadata_location)
        theirs = update_table_metadata(table.metadata, updates, metadata_location=table.metadata_location)
        assert ours.model_copy(update={"last_updated_ms": 0}) == theirs.model_copy(update={"last_updated_ms": 0}), (
            updates
        )
        assert ours.metadata_log[-1].metadata_file == table.metadata_location
        unlogged = apply_updates(table.metadata, updates, None)  # as Transaction.table_metadata applies them
        assert unlogged.model_copy(update={"last_updated_ms": 0}) == update_table_metadata(
            table.metadata, updates
        ).model_copy(update={"last_updated_ms": 0})
        assert unlogged.metadata_log == table.metadata.metadata_log
    assert apply_updates(table.metadata, (), table.metadata_location) is table.metadata  # no change, no new metadata


def test_commit_round_trips_through_the_catalog_and_names_the_next_version(table):
    head = table.metadata.current_snapshot_id
    committed = commit(table, (AssertRefSnapshotId(ref="attempt", snapshot_id=None),), (_branch("attempt", head),))
    loaded = table.catalog.load_table("db.t")
    assert loaded.metadata_location == committed.metadata_location != table.metadata_location
    assert loaded.metadata == committed.metadata and loaded.metadata.refs["attempt"].snapshot_id == head
    before, after = (Path(t.metadata_location).name.split("-", 1)[0] for t in (table, committed))
    assert int(after) == int(before) + 1
    # the next commit starts from the committed table without a load
    again = commit(
        committed,
        (AssertRefSnapshotId(ref="attempt", snapshot_id=head),),
        (RemoveSnapshotRefUpdate(ref_name="attempt"),),
    )
    assert "attempt" not in table.catalog.load_table("db.t").metadata.refs
    assert again.metadata.refs.keys() == table.metadata.refs.keys()


def test_a_stale_base_commits_nothing_and_leaves_no_metadata_file(table):
    head = table.metadata.current_snapshot_id
    first = commit(table, (), (_branch("a", head),))
    files = _metadata_files(table)
    with pytest.raises(StaleBaseError, match="moved since"):
        commit(table, (AssertRefSnapshotId(ref="b", snapshot_id=None),), (_branch("b", head),))  # base before `first`
    loaded = table.catalog.load_table("db.t")
    assert loaded.metadata_location == first.metadata_location and "b" not in loaded.metadata.refs
    assert _metadata_files(table) == files, "the refused commit's metadata.json was deleted"


def test_a_requirement_is_checked_against_the_base_before_anything_is_written(table):
    head = table.metadata.current_snapshot_id
    first = commit(table, (), (_branch("a", head),))
    files = _metadata_files(table)
    with pytest.raises(CommitFailedException) as refused:
        commit(first, (AssertRefSnapshotId(ref="a", snapshot_id=None),), (_branch("a", head),))
    assert not isinstance(refused.value, StaleBaseError)
    assert _metadata_files(table) == files
    assert table.catalog.load_table("db.t").metadata_location == first.metadata_location


def _with_properties(table, **properties):
    tx = table.transaction()
    tx.set_properties(**properties)
    return tx.commit_transaction()


@pytest.mark.parametrize("enabled", ["true", "false"])
def test_metadata_files_off_the_metadata_log_are_deleted_when_the_table_says_so(table, enabled):
    table = _with_properties(
        table,
        **{"write.metadata.delete-after-commit.enabled": enabled, "write.metadata.previous-versions-max": "2"},
    )
    before = len(_metadata_files(table))
    head = table.metadata.current_snapshot_id
    for i in range(10):
        table = commit(table, (AssertRefSnapshotId(ref=f"b{i}", snapshot_id=None),), (_branch(f"b{i}", head),))
    files = _metadata_files(table)
    logged = {Path(e.metadata_file).name for e in table.metadata.metadata_log} | {Path(table.metadata_location).name}
    assert len(table.metadata.metadata_log) == 2
    if enabled == "true":
        assert files == logged, "exactly the current metadata.json and the 2 the log keeps remain"
    else:
        assert len(files) == before + 10, "nothing is deleted unless the property is enabled"


def test_a_load_reads_only_the_pointer_when_it_names_the_metadata_this_process_holds(table):
    """kafka_iceberg/catalog/metadata_cache.py: after our commit, the next load is served from the
    metadata it committed; a commit made elsewhere (pyiceberg's own append) moves the pointer, and the
    load reads the new metadata.json; a dropped table loads as None."""
    from kafka_iceberg.catalog.metadata_cache import CACHE
    from kafka_iceberg.catalog.tables import load_table

    head = table.metadata.current_snapshot_id
    committed = commit(table, (), (_branch("attempt", head),))
    loaded = load_table(table.catalog, "db.t")
    assert loaded.metadata is committed.metadata, "served from what the commit kept, no metadata.json read"
    assert loaded.metadata_location == committed.metadata_location and loaded.name() == ("db", "t")
    assert load_table(table.catalog, "db.t").metadata is committed.metadata
    other = SqlCatalog("lake", **table.catalog.properties).load_table("db.t")  # another process's commit
    other.append(pa.table({"id": pa.array([7], pa.int64()), "s": ["r7"]}))
    fresh = load_table(table.catalog, "db.t")
    assert fresh.metadata_location == other.metadata_location != committed.metadata_location
    assert fresh.metadata.current_snapshot_id == other.metadata.current_snapshot_id != head
    assert load_table(table.catalog, "db.t").metadata is fresh.metadata, "the loaded metadata is kept in turn"
    assert fresh.scan().to_arrow().num_rows == 4, "a cached table reads its data files through its FileIO"
    CACHE.clear()
    assert load_table(table.catalog, "db.t").metadata == fresh.metadata
    table.catalog.drop_table("db.t")
    assert load_table(table.catalog, "db.t") is None


def test_the_kept_metadata_hold_a_bounded_number_of_snapshots(table):
    from kafka_iceberg.catalog.metadata_cache import MetadataCache

    cache = MetadataCache(max_snapshots=8)  # the table holds 3 snapshots: an entry counts 4
    assert cache.put(("a",), "a1", table.metadata) and cache.put(("b",), "b1", table.metadata)
    assert not cache.put(("c",), "c1", table.metadata), "a third would pass the bound: not kept"
    assert cache.get(("c",), "c1") is None and cache.get(("a",), "a1") is table.metadata
    assert cache.put(("a",), "a2", table.metadata), "a table's newer metadata replaces its entry"
    assert cache.get(("a",), "a1") is None and cache.get(("a",), "a2") is table.metadata
