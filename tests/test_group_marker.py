"""A consistency group committed member by member with a marker tag (kafka_iceberg/batch/group_marker.py),
the path of catalogs without a multi-table transaction (REST, Glue, Hive, Nessie), forced here on the real
JDBC catalog (``per_table=True``) with real Spark, the dev broker and Debezium-shaped change events.

A crash between the members' publishes leaves one member at the new group commit: readers (``read_group``,
the ``group-shop`` tags) still see the previous one; the next micro-batch first rolls the other member
forward to its staged snapshot (recovery treats every attempt as dead and must not drop it first), moves
the tags, then commits what is new; every record is in its table once. A compaction of the member left
short (the maintenance entry point, ``run_job``) first rolls it forward: compacted before, its ``main``
would no longer lead to its staged snapshot and the group could not be completed."""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField

from devtools.demo.data import produce_topics
from kafka_iceberg.batch.context import Lake
from kafka_iceberg.batch.group_batch import run_group_batch
from kafka_iceberg.batch.group_marker import (
    MARKER_CRASH_POINTS,
    finish_group,
    group_tag,
    move_tags,
    roll_forward_group,
)
from kafka_iceberg.batch.pipeline import connect
from kafka_iceberg.batch.recovery import attempt_branch
from kafka_iceberg.catalog.group_view import read_group
from kafka_iceberg.catalog.tables import metadata_view
from kafka_iceberg.config.settings import load_settings
from kafka_iceberg.declaration.groups import group_of, member_identifiers
from kafka_iceberg.declaration.spec import parse_declarations
from kafka_iceberg.errors import LakeError
from kafka_iceberg.lake_assets.chore_jobs import ChoreEnv, maintenance_job
from kafka_iceberg.state import ancestors, group_record, group_summary, ingest_summary, overlapping_batches
from tests.test_group_batch import COLUMNS, _change, _end, _rows, _specs


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


def _grouped(table, seq: int, offsets: dict[str, int], branch: str = "main") -> None:
    """Append one row to ``table`` (on ``branch``) as group ``shop``'s commit ``seq``: ``offsets`` is every
    member's offset of partition 0 then."""
    ident = ".".join(table.name())
    summary = ingest_summary(
        topic=f"topic.{ident}", offsets={0: offsets[ident]}, batch={}, max_timestamps={}, commit_id="c", records=1
    )
    members = {i: (f"topic.{i}", {0: o}) for i, o in offsets.items()}
    summary |= group_summary("shop", seq, {"offsets": {"0": seq}}, members)
    table.append(pa.table({"id": pa.array([seq], pa.int64())}), snapshot_properties=summary, branch=branch)


def test_a_crash_among_the_tag_moves_is_finished_and_a_lost_staged_snapshot_is_named(tmp_path):
    """Without Spark or Kafka: the per-table path's tag moves and roll-forward on pyiceberg tables."""
    catalog = SqlCatalog("m", uri=f"sqlite:///{tmp_path}/c.db", warehouse=f"file://{tmp_path}/wh")
    catalog.create_namespace("shop")
    a, b = (catalog.create_table(i, Schema(NestedField(1, "id", LongType()))) for i in ("shop.a", "shop.b"))
    for table in (a, b):
        _grouped(table, 1, {"shop.a": 1, "shop.b": 1})
    settings = load_settings(env={"LAKE_HOME": str(tmp_path)})
    record = group_record(metadata_view(catalog.load_table("shop.a")).snapshots[a.metadata.current_snapshot_id])
    crashing = Lake(None, settings, None, catalog, _crash_at("group_between_tags"))
    with pytest.raises(Crash):
        move_tags(crashing, "shop", record)
    assert _tags(catalog, "group-shop", ["shop.a", "shop.b"]) == {"shop.a": _main(a), "shop.b": None}
    lake = Lake(None, settings, None, catalog)
    finished = finish_group(lake, "shop", ["shop.a", "shop.b"])  # the next micro-batch moves the rest first
    assert {i: v.refs["group-shop"] for i, v in finished.items()} == {"shop.a": _main(a), "shop.b": _main(b)}
    assert _tags(catalog, "group-shop", ["shop.a", "shop.b"]) == {"shop.a": _main(a), "shop.b": _main(b)}

    _grouped(a, 2, {"shop.a": 2, "shop.b": 2})  # published on a; b's staged write of commit 2 is lost
    with pytest.raises(LakeError, match=r"table shop\.b: group 'shop' commit 2 is published on other members"):
        finish_group(lake, "shop", ["shop.a", "shop.b"])
    assert roll_forward_group(lake, "shop", ["shop.a", "shop.b"]) == []  # a compaction leaves it to the group
    assert _tags(catalog, "group-shop", ["shop.a", "shop.b"])["shop.b"] == _main(b)  # no tag moved


def _main(table) -> int:
    return table.refresh().metadata.current_snapshot_id


def test_a_compaction_of_the_member_a_crash_left_short_first_rolls_the_group_forward(spark, settings, catalog, unique):
    """Five group commits on both members (five small data files each), then commit 6 published on
    ``lines`` and staged on an attempt branch of ``orders`` (a crash between the publishes). The scheduled
    compaction job of ``orders`` (``run_job``) rolls it forward before ``rewrite_data_files`` commits; the group's next
    micro-batch (``finish_group``) then only moves the tags, and every record is read once."""
    entries = [
        {"name": f"{unique}_{t}", "identifier": f"test.{unique}_{t}", "topic": f"{unique}.public.{t}",
         "schema": COLUMNS, "mode": "upsert", "key": ["id"], "cdc": "debezium", "consistency_group": "shop"}
        for t in ("lines", "orders")
    ]  # fmt: skip
    specs = parse_declarations({"tables": entries}, "tables.yaml")
    lines, orders = (s.identifier for s in specs)
    catalog.create_namespace_if_not_exists("test")
    a, b = (catalog.create_table(i, Schema(NestedField(1, "id", LongType()))) for i in (lines, orders))
    for seq in range(1, 6):
        for table in (a, b):
            _grouped(table, seq, {lines: seq, orders: seq})
    _grouped(a, 6, {lines: 6, orders: 6})  # published on lines
    branch = attempt_branch("mark-6", 1)
    b.manage_snapshots().create_branch(_main(b), branch).commit()
    _grouped(b, 6, {lines: 6, orders: 6}, branch=branch)  # staged on orders, not published
    staged = _staged(catalog, orders)
    assert [group_record(s)["seq"] for s in staged.values()] == [6]

    done = _run_job(spark, settings, catalog, specs, "compact", specs[1])  # the compaction its cron makes due
    assert (done["data_files_before"], done["data_files_after"]) == (6, 1)  # commit 6's data file is compacted too
    compacted = metadata_view(catalog.load_table(orders))
    assert compacted.snapshots[compacted.main].summary["operation"] == "replace"
    assert set(staged) <= {s.snapshot_id for s in ancestors(compacted.snapshots, compacted.main)}
    assert _staged(catalog, orders) == {} and _main_seqs(catalog, orders)[0] == 6

    finished = finish_group(
        Lake(spark, settings, None, catalog), "shop", [lines, orders]
    )  # the group's next micro-batch does this first
    mains = {lines: _main(a), orders: compacted.main}
    assert {i: v.refs["group-shop"] for i, v in finished.items()} == mains
    assert {i: sid for i, (_t, sid) in read_group(catalog, [lines, orders]).items()} == mains
    for ident in (lines, orders):
        rows = spark.table(f"{settings.catalog.name}.{ident}").collect()
        assert sorted(r["id"] for r in rows) == [1, 2, 3, 4, 5, 6]  # every record once
        chain = ancestors(metadata_view(catalog.load_table(ident)).snapshots, mains[ident])
        assert overlapping_batches(chain) == [] and sum(int(s.summary.get("kafka.records", 0)) for s in chain) == 6


def _run_job(spark, settings, catalog, specs, kind: str, spec) -> dict:
    """Run the maintenance job ``kind`` on ``spec``'s table as the worker run serving ``specs`` does when its cron
    ticks (a group member's compaction completes its group first); returns its observation's metadata."""
    members = member_identifiers(specs)[group_of(spec)]
    env = ChoreEnv(spark, settings, catalog, None)
    return maintenance_job(env, spec, kind, 0, members=members, after=None, run_id="r").as_metadata()
