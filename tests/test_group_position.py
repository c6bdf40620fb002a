"""A consistency group's consistent position from the members' snapshot summaries
(kafka_iceberg/state.py ``group_position``): every member at the snapshot of one group commit, also
when the members were loaded at different moments or a commit is on some members only."""

from __future__ import annotations

from kafka_iceberg.state import SnapshotInfo, group_position, group_summary, ingest_summary


def _snap(sid: int, parent: int | None, seq: int | None, offsets: dict, group_offsets: dict | None = None):
    summary = {"operation": "append"}
    if offsets is not None:
        summary |= ingest_summary(
            topic="t", offsets={0: offsets[0]}, batch={}, max_timestamps={}, commit_id="c", records=1
        )
    if seq is not None:
        tables = {i: ("t", {0: o}) for i, o in group_offsets.items()}
        summary |= group_summary("shop", seq, {"transactions": {"0": seq}}, tables)
    return SnapshotInfo(sid, parent, 0, summary)


def _view(*snaps: SnapshotInfo) -> tuple[dict, int]:
    return {s.snapshot_id: s for s in snaps}, snaps[-1].snapshot_id


def test_members_loaded_at_different_moments_are_read_at_one_group_commit():
    # commit 1: orders -> 10, lines -> 20; commit 2 changes orders only (-> 11); lines keeps 20
    o1 = _snap(1, None, 1, {0: 10}, {"orders": 10, "lines": 20})
    o2 = _snap(2, 1, 2, {0: 11}, {"orders": 11, "lines": 20})
    l1 = _snap(11, None, 1, {0: 20}, {"orders": 10, "lines": 20})
    assert group_position({"orders": _view(o1, o2), "lines": _view(l1)}) == {"orders": 2, "lines": 11}
    # commit 3 changes lines (-> 21) and orders (-> 12); orders was loaded before it landed
    l3 = _snap(12, 11, 3, {0: 21}, {"orders": 12, "lines": 21})
    views = {"orders": _view(o1, o2), "lines": _view(l1, l3)}
    assert group_position(views, fallback=False) is None  # load orders again, or read commit 2 meanwhile:
    assert group_position(views) == {"orders": 2, "lines": 11}  # the newest commit both members reached
    o3 = _snap(3, 2, 3, {0: 12}, {"orders": 12, "lines": 21})
    assert group_position({"orders": _view(o1, o2, o3), "lines": _view(l1, l3)}) == {"orders": 3, "lines": 12}


def test_a_compaction_after_the_group_commit_is_read_and_an_ungrouped_table_has_no_position():
    o1 = _snap(1, None, 1, {0: 10}, {"orders": 10})
    compacted = SnapshotInfo(2, 1, 0, {"operation": "replace"})
    assert group_position({"orders": _view(o1, compacted)}) == {"orders": 2}
    assert group_position({"orders": _view(_snap(1, None, None, {0: 10}))}) is None
