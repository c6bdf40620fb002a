"""A consistency group committed member by member with a marker tag (kafka_iceberg/batch/group_marker.py),
the path of catalogs without a multi-table transaction (REST, Glue, Hive, Nessie), forced here on the real
JDBC catalog (``per_table=True``) with real Spark, the dev broker and Debezium-shaped change events.

A crash between the members' publishes leaves one member at the new group commit: readers (``read_group``,
the ``group-shop`` tags) still see the previous one; the next micro-batch first rolls the other member
forward to its staged snapshot (recovery treats every attempt as dead and must not drop it first), moves
the tags, then commits what is new; every record is in its table once."""

from __future__ import annotations

import pytest

from devtools.demo.data import produce_topics
from kafka_iceberg.batch.group_batch import run_group_batch
from kafka_iceberg.batch.group_marker import MARKER_CRASH_POINTS, group_tag
from kafka_iceberg.batch.pipeline import connect
from kafka_iceberg.catalog.group_view import read_group
from kafka_iceberg.catalog.tables import metadata_view
from kafka_iceberg.state import ancestors, group_record, overlapping_batches
from tests.test_group_batch import _change, _end, _rows, _specs


class Crash(Exception):
    """Stands for the process dying at a crash point (nothing after it runs)."""


def _crash_at(point: str):
    assert point in MARKER_CRASH_POINTS

    def hook(name: str) -> None:
        if name == point:
            raise Crash(name)

    return hook


def _main_seqs(catalog, ident: str) -> list[int]:
    view = metadata_view(catalog.load_table(ident))
    return [r["seq"] for s in ancestors(view.snapshots, view.main) if (r := group_record(s)) is not None]


def test_a_crash_between_the_members_publishes_is_rolled_forward_by_the_next_micro_batch(
    spark, settings, kafka, kafka_config, catalog, unique
):
    specs, topics = _specs(kafka_config, unique)
    lines, orders = sorted(s.identifier for s in specs)  # publish order: identifier order
    tx = f"{unique}.transaction"
    produce_topics(
        kafka_config,
        {
            topics["orders"]: [_change({"id": 1, "qty": 10}, "t1", 1)],
            topics["lines"]: [_change({"id": 1, "qty": 4}, "t1", 2), _change({"id": 2, "qty": 6}, "t1", 3)],
            tx: [_end("t1", "public", orders=1, lines=2)],
        },
    )
    first = run_group_batch(connect(spark, settings, kafka, catalog), specs, "mark-1", per_table=True)
    assert first.seq == 1 and set(first.snapshots) == {lines, orders}
    tag = group_tag("shop")
    assert _tags(catalog, tag, [lines, orders]) == first.snapshots

    produce_topics(
        kafka_config,
        {
            topics["orders"]: [_change({"id": 2, "qty": 5}, "t2", 4)],
            topics["lines"]: [_change({"id": 3, "qty": 5}, "t2", 5)],
            tx: [_end("t2", "public", orders=1, lines=1)],
        },
    )
    crashing = connect(spark, settings, kafka, catalog, _crash_at("group_between_publishes"))
    with pytest.raises(Crash):
        run_group_batch(crashing, specs, "mark-2", per_table=True)
    assert (_main_seqs(catalog, lines), _main_seqs(catalog, orders)) == ([2, 1], [1])  # half-published
    read = read_group(catalog, [lines, orders])
    assert {i: sid for i, (_t, sid) in read.items()} == first.snapshots  # the previous group commit
    assert _tags(catalog, tag, [lines, orders]) == first.snapshots
    by_tag = spark.sql(f"SELECT id FROM {settings.catalog.name}.{lines} VERSION AS OF '{tag}'").collect()
    assert sorted(r["id"] for r in by_tag) == [1, 2]  # line 3 is published on main, not at the tag
    staged = _staged(catalog, orders)
    assert [group_record(s)["seq"] for s in staged.values()] == [2]  # orders' write of commit 2, unpublished

    produce_topics(
        kafka_config,
        {topics["orders"]: [_change({"id": 1, "qty": 11}, "t3", 6, op="u")], tx: [_end("t3", "public", orders=1)]},
    )
    lake = connect(spark, settings, kafka, catalog)
    third = run_group_batch(lake, specs, "mark-3", is_alive=lambda attempt: False, per_table=True)
    assert third.seq == 3 and set(third.snapshots) == {orders}  # lines has nothing in t3
    assert (_main_seqs(catalog, lines), _main_seqs(catalog, orders)) == ([2, 1], [3, 2, 1])
    orders_view = metadata_view(catalog.load_table(orders))
    assert set(staged) <= {s.snapshot_id for s in ancestors(orders_view.snapshots, orders_view.main)}  # rolled forward
    mains = {i: metadata_view(catalog.load_table(i)).main for i in (lines, orders)}
    assert mains[orders] == third.snapshots[orders]
    assert _tags(catalog, tag, [lines, orders]) == mains  # lines: at commit 2's snapshot (its offsets in 3)
    assert {i: sid for i, (_t, sid) in read_group(catalog, [lines, orders]).items()} == mains
    assert _rows(spark, settings, specs) == {"orders": {1: 11, 2: 5}, "lines": {1: 4, 2: 6, 3: 5}}
    for ident, produced in ((lines, 3), (orders, 3)):
        view = metadata_view(catalog.load_table(ident))
        chain = ancestors(view.snapshots, view.main)
        assert overlapping_batches(chain) == []
        assert sum(int(s.summary.get("kafka.records", 0)) for s in chain) == produced  # each record once
        assert _staged(catalog, ident) == {}  # no attempt branch left


def _tags(catalog, tag: str, idents: list[str]) -> dict[str, int | None]:
    out = {}
    for ident in idents:
        ref = catalog.load_table(ident).metadata.refs.get(tag)
        out[ident] = None if ref is None else ref.snapshot_id
    return out


def _staged(catalog, ident: str) -> dict:
    view = metadata_view(catalog.load_table(ident))
    return {sid: view.snapshots[sid] for name, sid in view.refs.items() if name.startswith("ingest_")}
