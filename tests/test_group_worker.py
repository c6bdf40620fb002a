"""A worker serves a consistency group as one unit (kafka_iceberg/batch/units.py, kafka_iceberg/batch/worker.py):
the group waits when any member has lag, one micro-batch runs over all its members (one catalog
transaction, kafka_iceberg/batch/group_batch.py), each member is reported on its own, and ungrouped
tables are served as before. Real Spark, the dev broker and the SQLite catalog for the last test."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from devtools import duck
from devtools.demo.data import create_topic, produce, produce_topics
from kafka_iceberg.batch.group_batch import run_group_micro_batch
from kafka_iceberg.batch.mirror import GroupMirror
from kafka_iceberg.batch.pipeline import run_micro_batch
from kafka_iceberg.batch.units import next_units, units_of
from kafka_iceberg.batch.worker import TableState, Worker, WorkerPorts
from kafka_iceberg.catalog.tables import metadata_view
from kafka_iceberg.declaration.spec import parse_declarations
from kafka_iceberg.ops import metrics
from kafka_iceberg.state import group_record, group_state
from tests.helpers import event_records, make_spec

COLUMNS = [{"name": "id", "type": "long", "required": True}, {"name": "qty", "type": "long"}]


def _group_specs(unique: str, prefix: str) -> list:
    """Two upsert tables of the consistency group ``shop`` on ``<prefix>.public.{orders,lines}``."""
    entries = [
        {"name": f"{unique}_{t}", "identifier": f"test.{unique}_{t}", "topic": f"{prefix}.public.{t}",
         "schema": COLUMNS, "mode": "upsert", "key": ["id"], "cdc": "debezium", "consistency_group": "shop",
         "partition_by": []}
        for t in ("orders", "lines")
    ]  # fmt: skip
    return parse_declarations({"tables": entries}, "tables.yaml")


def test_a_group_is_one_unit_that_waits_when_any_member_has_lag():
    orders, lines = _group_specs("u", "shop")
    alone = make_spec("alone", "events.alone")
    units = units_of([orders, alone, lines])
    assert units == [(orders, lines), (alone,)]
    states = {s.identifier: TableState(s) for s in (orders, lines, alone)}
    assert next_units(states, units) == []
    states[alone.identifier] = TableState(alone, waiting_since=1.0)
    states[lines.identifier] = TableState(lines, waiting_since=2.0)  # only one member has lag: the group waits
    assert next_units(states, units) == [(alone,), (orders, lines)]
    states[orders.identifier] = TableState(orders, waiting_since=0.5)  # its longest-waiting member counts
    assert next_units(states, units) == [(orders, lines), (alone,)]
    assert next_units(states, units, paused=frozenset({orders.identifier})) == [(alone,)]
    states[lines.identifier] = TableState(lines, waiting_since=2.0, error=ValueError("set aside"))
    assert next_units(states, units) == [(alone,)]  # a member set aside sets the group aside


def test_the_worker_runs_one_micro_batch_per_group_and_reports_each_member():
    orders, lines = _group_specs("u", "shop")
    alone = make_spec("alone", "events.alone")
    marks = {t: {0: SimpleNamespace(low=0, high=3)} for t in (orders.topic, lines.topic, alone.topic)}
    offsets = {0: 3}
    groups, singles, commits, failures = [], [], [], []

    def run_group(specs):
        groups.append([s.identifier for s in specs])
        return {s.identifier: SimpleNamespace(offsets=offsets, snapshot_id=len(groups)) for s in specs}

    def run_batch(spec):
        singles.append(spec.identifier)
        return SimpleNamespace(offsets=offsets, snapshot_id=7)

    ports = WorkerPorts(
        run_batch,
        lambda topics: {t: marks[t] for t in topics},
        on_commit=lambda spec, result: commits.append((spec.identifier, result.snapshot_id)),
        on_failure=lambda spec, error: failures.append(spec.identifier),
        run_group=run_group,
    )
    served = Worker([orders, alone, lines], ports, budget_s=0).run()
    assert groups == [[orders.identifier, lines.identifier]] and singles == [alone.identifier]
    assert sorted(commits) == sorted([(orders.identifier, 1), (lines.identifier, 1), (alone.identifier, 7)])
    assert all(dict(s.offsets) == offsets and len(s.results) == 1 for s in served.values())

    def failing(specs):
        raise ValueError("refused")

    ports = WorkerPorts(run_batch, ports.watermarks, on_failure=ports.on_failure, run_group=failing)
    served = Worker([orders, alone, lines], ports, budget_s=0).run()
    assert sorted(failures) == sorted([orders.identifier, lines.identifier])  # the group is set aside whole
    assert served[alone.identifier].error is None and len(served[alone.identifier].results) == 1


def _counted(counter, table: str) -> float:
    return sum(
        s.value
        for m in counter.collect()
        for s in m.samples
        if s.labels["table"] == table and s.name.endswith("_total")
    )


def test_a_group_micro_batch_is_metered_per_member():
    orders, lines = _group_specs("metered", "shop")
    committed = {orders.identifier: SimpleNamespace(snapshot_id=1, records=3, data_bytes_added=100)}
    committed[lines.identifier] = SimpleNamespace(snapshot_id=None, records=0, data_bytes_added=0)
    assert metrics.metered_group(lambda specs: committed)([orders, lines]) == committed
    assert _counted(metrics.RECORDS, orders.identifier) == 3 and _counted(metrics.RECORDS, lines.identifier) == 0

    def refused(specs):
        raise ValueError("refused")

    with pytest.raises(ValueError, match="refused"):
        metrics.metered_group(refused)([orders, lines])
    assert [_counted(metrics.FAILURES, s.identifier) for s in (orders, lines)] == [1, 1]


def _change(row: dict, txid: str) -> tuple[bytes, bytes, int]:
    value = {"op": "c", "before": None, "after": row, "source": {}, "transaction": {"id": txid}}
    return json.dumps({"id": row["id"]}).encode(), json.dumps(value).encode(), 0


def _end(txid: str, **counts: int) -> tuple[bytes, bytes, int]:
    collections = [{"data_collection": f"public.{t}", "event_count": n} for t, n in counts.items()]
    return b"", json.dumps({"status": "END", "id": txid, "data_collections": collections}).encode(), 0


def _serve(spark, settings, kafka, catalog, specs, commit_id, mirror=None) -> tuple[dict, list]:
    """One round of a Worker over ``specs`` through the real write path (consumer groups mirrored at once,
    or noted in ``mirror``); (its end states, its commits)."""
    commits = []
    clients = {"commit_id": commit_id, "kafka": kafka, "catalog": catalog}
    ports = WorkerPorts(
        lambda spec: run_micro_batch(spark, settings, spec, **clients),
        kafka.watermarks_many,
        on_commit=lambda spec, result: commits.append((spec.identifier, result)),
        run_group=lambda members: run_group_micro_batch(spark, settings, members, **clients, mirror=mirror),
    )
    return Worker(specs, ports, budget_s=0).run(), commits


def _rows(spark, settings, spec) -> dict:
    return {r["id"]: r["qty"] for r in spark.table(f"{settings.catalog.name}.{spec.identifier}").collect()}


def test_a_worker_commits_a_group_in_one_transaction_and_an_ungrouped_table_alone(
    spark, settings, kafka, kafka_config, catalog, unique, topic_factory
):
    orders, lines = _group_specs(unique, unique)
    for topic in (orders.topic, lines.topic, f"{unique}.transaction"):
        create_topic(kafka_config, topic, 1, {"retention.ms": "-1"})
    alone = make_spec(f"{unique}_alone", topic_factory(f"{unique}_alone", partitions=2))
    produce(kafka_config, alone.topic, event_records(range(50)))
    produce_topics(
        kafka_config,
        {
            orders.topic: [_change({"id": 1, "qty": 10}, "t1"), _change({"id": 2, "qty": 5}, "t2")],
            lines.topic: [_change({"id": 1, "qty": 4}, "t1"), _change({"id": 2, "qty": 6}, "t1")],
            f"{unique}.transaction": [_end("t1", orders=1, lines=2), _end("t2", orders=1)],
        },
    )
    specs = [orders, alone, lines]
    served, commits = _serve(spark, settings, kafka, catalog, specs, f"gw1-{unique}")
    assert all(s.error is None for s in served.values())
    by_table = {i: r for i, r in commits if r.snapshot_id is not None}
    assert {i: r.records for i, r in by_table.items()} == {
        orders.identifier: 2,
        lines.identifier: 2,
        alone.identifier: 50,
    }
    assert _rows(spark, settings, orders) == {1: 10, 2: 5} and _rows(spark, settings, lines) == {1: 4, 2: 6}
    views = {s.identifier: metadata_view(catalog.load_table(s.identifier)) for s in specs}
    first = {i: group_record(views[i].snapshots[views[i].main]) for i in (orders.identifier, lines.identifier)}
    assert first[orders.identifier] == first[lines.identifier]  # one group commit: the same record in both
    assert first[orders.identifier]["seq"] == 1 and first[orders.identifier]["position"]["offsets"] == {"0": 2}
    assert {i: views[i].main for i in first} == {i: by_table[i].snapshot_id for i in first}
    assert group_state(views[alone.identifier].snapshots, views[alone.identifier].main) is None

    heads = {i: v.main for i, v in views.items()}
    _served, again = _serve(spark, settings, kafka, catalog, specs, f"gw2-{unique}")  # nothing new: no commit
    assert all(r.snapshot_id is None for _, r in again) and {i for i, _ in again} == set(heads)
    assert heads == {s.identifier: metadata_view(catalog.load_table(s.identifier)).main for s in specs}

    produce_topics(
        kafka_config,
        {lines.topic: [_change({"id": 3, "qty": 5}, "t3")], f"{unique}.transaction": [_end("t3", lines=1)]},
    )
    produce(kafka_config, alone.topic, event_records(range(50, 60)))
    assert kafka.group_offsets(lines.consumer_group, lines.topic, [0]) == {0: 2}  # mirrored by the group micro-batch
    mirror = GroupMirror(kafka, interval_s=3600)
    _served, third = _serve(spark, settings, kafka, catalog, specs, f"gw3-{unique}", mirror)
    assert {i: r.records for i, r in third if r.snapshot_id is not None} == {lines.identifier: 1, alone.identifier: 10}
    assert kafka.group_offsets(lines.consumer_group, lines.topic, [0]) == {0: 2}  # noted, not mirrored yet
    mirror.flush(final=True)
    assert kafka.group_offsets(lines.consumer_group, lines.topic, [0]) == {0: 3}
    views = {s.identifier: metadata_view(catalog.load_table(s.identifier)) for s in specs}
    record = group_record(views[lines.identifier].snapshots[views[lines.identifier].main])
    assert record["seq"] == 2 and record["position"]["offsets"] == {"0": 3}
    assert views[orders.identifier].main == heads[orders.identifier]  # a member without records only guards
    assert _rows(spark, settings, lines) == {1: 4, 2: 6, 3: 5}
    table = catalog.load_table(alone.identifier)
    sql = f"SELECT count(*), count(DISTINCT (_kafka_partition, _kafka_offset)) FROM {duck.scan_sql(table.metadata_location)}"
    assert duck.connect().execute(sql).fetchone() == (60, 60)  # exactly once


def test_a_group_waiting_for_the_rest_of_a_transaction_rests_before_it_is_served_again():
    """A fake clock: the group's first two micro-batches commit nothing (the rest of a source transaction
    is not in the topics yet); each is followed by REST_S seconds without a micro-batch of the group, and
    the run does not end idle meanwhile (idle_s is shorter than the rest)."""
    from kafka_iceberg.batch.planning import Watermarks
    from kafka_iceberg.batch.worker import REST_S, Clock

    orders, lines = _group_specs("u", "shop")
    now, starts = [0.0], []
    marks = {t: {0: Watermarks(0, 3)} for t in (orders.topic, lines.topic)}

    def run_group(specs):
        starts.append(now[0])
        now[0] += 0.1
        done = len(starts) > 2
        return {s.identifier: SimpleNamespace(offsets={0: 3 if done else 0}, committed=done) for s in specs}

    ports = WorkerPorts(lambda spec: None, lambda topics: {t: marks[t] for t in topics}, run_group=run_group)
    clock = Clock(now=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s))
    Worker([orders, lines], ports, budget_s=60, idle_s=0.5, clock=clock).run()
    assert len(starts) == 3, starts
    assert all(b - a >= REST_S for a, b in zip(starts, starts[1:])), starts
