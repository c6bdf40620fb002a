"""Where a consistency group's micro-batch ends (kafka_iceberg/cdc/transactions.py): at a source
transaction boundary taken from Debezium's transaction topic; no transaction is split. Synthetic
events, and the same events produced to and read back from the dev broker."""

from __future__ import annotations

import json

import pytest
from confluent_kafka import Consumer, TopicPartition

from devtools.demo.data import produce_topics
from kafka_iceberg.cdc.transactions import TransactionEnd, change_transaction, parse_end, plan_group_cut
from kafka_iceberg.errors import LakeError

ORDERS, LINES = ("shop.public.orders", 0), ("shop.public.order_lines", 0)


def _end(txid: str, offset: int, **counts: int) -> TransactionEnd:
    return TransactionEnd(txid, 0, offset, {f"public.{k}": v for k, v in counts.items()})


def _scan(events: dict) -> dict:
    return {tp: (evs[0][0] if evs else 0, (evs[-1][0] + 1) if evs else 0) for tp, evs in events.items()}


def test_the_cut_keeps_whole_transactions_and_waits_for_one_whose_events_are_not_all_read():
    ends = [_end("t1", 1, orders=1, order_lines=2), _end("t2", 3, orders=1, order_lines=1), _end("t3", 5, orders=1)]
    changes = {
        ORDERS: [(0, "t1"), (1, "t2"), (2, "t3")],
        LINES: [(0, "t1"), (1, "t1")],  # t2's line is not read yet (the topic's high watermark is behind)
    }
    cut = plan_group_cut("shop", ends, changes, _scan(changes), {0: 0})
    assert cut.transactions == ("t1",)
    assert cut.ends == {ORDERS: 1, LINES: 2}
    assert cut.position == {0: 2}  # after t1's END
    assert cut.waiting_for == "t2"

    changes[LINES].append((2, "t2"))
    cut = plan_group_cut("shop", ends, changes, _scan(changes), {0: 0})
    assert cut.transactions == ("t1", "t2", "t3")
    assert cut.ends == {ORDERS: 3, LINES: 3}
    assert (cut.position, cut.waiting_for) == ({0: 6}, None)


def test_an_event_whose_end_is_not_read_yet_is_left_for_the_next_batch():
    changes = {ORDERS: [(10, None), (11, "t1"), (12, "t9")], LINES: [(4, "t1")]}  # a snapshot read at 10
    cut = plan_group_cut("shop", [_end("t1", 7, orders=1, order_lines=1)], changes, _scan(changes), {0: 7})
    assert cut.ends == {ORDERS: 12, LINES: 5}
    assert cut.position == {0: 8}
    nothing = plan_group_cut("shop", [], changes, _scan(changes), {0: 7})
    assert nothing.ends == {ORDERS: 11, LINES: 4}  # only the snapshot read, before every transaction
    assert (nothing.transactions, nothing.position) == ((), {0: 7})


def test_events_out_of_source_commit_order_are_refused():
    changes = {ORDERS: [(0, "t2"), (1, "t1")]}
    with pytest.raises(LakeError, match="not in source commit order"):
        plan_group_cut("shop", [_end("t1", 0, orders=1)], changes, _scan(changes), {0: 0})


def test_the_envelopes_with_and_without_the_schema_wrapper_are_read():
    end = {"status": "END", "id": "571:5", "event_count": 3, "data_collections": [
        {"data_collection": "public.orders", "event_count": 1},
        {"data_collection": "public.order_lines", "event_count": 2},
    ]}  # fmt: skip
    assert parse_end({"schema": {}, "payload": end}, 0, 9) == TransactionEnd(
        "571", 0, 9, {"public.orders": 1, "public.order_lines": 2}
    )  # a PostgreSQL id <xid>:<lsn> is known by its xid
    assert parse_end({"status": "BEGIN", "id": "571:5"}, 0, 8) is None
    assert change_transaction({"op": "c", "transaction": {"id": "571:7", "total_order": 2}}) == "571"
    assert change_transaction({"op": "r", "transaction": None}) is None
    assert change_transaction(None) is None


def _change(txid: str, order: int) -> bytes:
    return json.dumps({"op": "c", "after": {"id": order}, "transaction": {"id": txid, "total_order": order}}).encode()


def _read(kafka_config, topic: str) -> list[tuple[int, dict]]:
    consumer = Consumer(kafka_config.client_conf(**{"group.id": "unused", "enable.auto.commit": False}))
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        _, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        out = []
        while not out or out[-1][0] < high - 1:
            msg = consumer.poll(10)
            assert msg is not None and msg.error() is None, msg and msg.error()
            out.append((msg.offset(), json.loads(msg.value())))
        return out
    finally:
        consumer.close()


def test_change_events_on_the_dev_broker_are_cut_at_a_transaction_boundary(kafka_config, topic_factory, unique):
    # topic_factory names topics events.<name>: Debezium's <prefix>.<schema>.<table> with prefix events
    names = {t: topic_factory(f"{unique}.{t}", partitions=1) for t in ("orders", "order_lines", "transaction")}
    orders, lines, tx = names["orders"], names["order_lines"], names["transaction"]
    ends = [
        {"status": "BEGIN", "id": "t1"},
        {"status": "END", "id": "t1", "data_collections": [
            {"data_collection": f"{unique}.orders", "event_count": 1},
            {"data_collection": f"{unique}.order_lines", "event_count": 2}]},
        {"status": "BEGIN", "id": "t2"},
        {"status": "END", "id": "t2", "data_collections": [
            {"data_collection": f"{unique}.orders", "event_count": 1},
            {"data_collection": f"{unique}.order_lines", "event_count": 1}]},
    ]  # fmt: skip
    produce_topics(
        kafka_config,
        {
            orders: [(b"1", _change("t1", 1), 0), (b"2", _change("t2", 4), 0)],
            lines: [(b"1", _change("t1", 2), 0), (b"2", _change("t1", 3), 0)],  # t2's line not yet written
            tx: [(b"", json.dumps(e).encode(), 0) for e in ends],
        },
    )
    read_ends = [e for o, v in _read(kafka_config, tx) if (e := parse_end(v, 0, o))]
    changes = {(t, 0): [(o, change_transaction(v)) for o, v in _read(kafka_config, t)] for t in (orders, lines)}
    scanned = {tp: (0, evs[-1][0] + 1) for tp, evs in changes.items()}
    cut = plan_group_cut("events", read_ends, changes, scanned, {0: 0})
    assert cut.transactions == ("t1",)
    assert cut.ends == {(orders, 0): 1, (lines, 0): 2}
    assert (cut.position, cut.waiting_for) == ({0: 2}, "t2")


def test_a_postgresql_transaction_is_known_by_its_xid_whatever_lsn_each_event_carries():
    """Debezium's PostgreSQL connector (3.6.3, as captured from a real PostgreSQL) writes transaction ids
    ``<xid>:<lsn>`` with each event's own LSN: the END, and every change event, of one transaction differ."""
    end = {"status": "END", "id": "734:30740168", "event_count": 3,
           "data_collections": [{"data_collection": "public.orders", "event_count": 1},
                                {"data_collection": "public.order_lines", "event_count": 2}]}  # fmt: skip
    ends = [parse_end(end, 0, 1)]
    events = [{"op": "c", "after": {}, "transaction": {"id": f"734:{lsn}", "total_order": n}}
              for n, lsn in enumerate((30731976, 30732248, 30732520), 1)]  # fmt: skip
    changes = {
        ORDERS: [(0, change_transaction(events[0]))],
        LINES: [(0, change_transaction(events[1])), (1, change_transaction(events[2]))],
    }
    cut = plan_group_cut("shop", ends, changes, _scan(changes), {0: 0})
    assert (cut.transactions, cut.waiting_for, cut.ends) == (("734",), None, {ORDERS: 1, LINES: 2})
    assert change_transaction({"transaction": {"id": "3E11FA47-71CA-11E1-9E33-C80AA9429562:23"}}).endswith(":23")
