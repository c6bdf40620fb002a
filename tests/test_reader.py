"""``kafka_iceberg.kafka.reader.read_range`` and ``read_ranges`` against the dev broker: exactly the records of
a range, whatever its ends (inside one fetch, on a transaction marker), with headers as lists and never null,
and of several partitions' ranges read by one consumer at once."""

from __future__ import annotations

import pytest
from confluent_kafka import Producer

from kafka_iceberg.errors import ReadTimeoutError
from kafka_iceberg.kafka.consumers import ConsumerPool
from kafka_iceberg.kafka.reader import read_range, read_ranges


def _read(kafka_config, topic: str, start: int, end: int, consumers=None, partition: int = 0):
    batches = list(read_range(kafka_config.client_conf(), "t", topic, partition, start, end, 30, consumers))
    rows = [r for b in batches for r in b.to_pylist()]
    return rows


def test_a_range_yields_exactly_its_records_with_headers_as_lists(kafka_config, unique, topic_factory):
    topic = topic_factory(unique, partitions=1)
    producer = Producer(kafka_config.client_conf())
    for n in range(300):
        headers = [("h", f"v{n}".encode())] if n in (7, 150) else None
        producer.produce(
            topic,
            key=f"k{n}".encode(),
            value=f"v{n}".encode(),
            headers=headers,
            partition=0,
            timestamp=1_700_000_000_000 + n,
        )
    assert producer.flush(30) == 0

    for start, end in ((0, 300), (0, 1), (10, 11), (100, 257), (299, 300)):
        rows = _read(kafka_config, topic, start, end)
        assert [r["offset"] for r in rows] == list(range(start, end))
        assert [r["value"] for r in rows] == [f"v{n}".encode() for n in range(start, end)]
        assert all(r["topic"] == topic and r["partition"] == 0 for r in rows)
        assert [r["timestamp_ms"] for r in rows] == [1_700_000_000_000 + n for n in range(start, end)]
        assert [r["headers"] for r in rows] == [
            [{"key": "h", "value": f"v{n}".encode()}] if n in (7, 150) else [] for n in range(start, end)
        ]
    assert _read(kafka_config, topic, 5, 5) == []


def test_a_range_ending_on_a_transaction_marker_ends_without_waiting(kafka_config, unique, topic_factory):
    topic = topic_factory(unique, partitions=1)
    producer = Producer(kafka_config.client_conf(**{"transactional.id": f"tx-{unique}"}))
    producer.init_transactions(30)
    for first in (0, 10):
        producer.begin_transaction()
        for n in range(first, first + 10):
            producer.produce(topic, value=f"v{n}".encode(), partition=0)
        producer.flush(30)
        producer.commit_transaction(30)
    rows = _read(kafka_config, topic, 0, 11)  # offset 10 is the first transaction's commit marker
    assert [r["value"] for r in rows] == [f"v{n}".encode() for n in range(10)]
    rows = _read(kafka_config, topic, 0, 22)
    assert [r["value"] for r in rows] == [f"v{n}".encode() for n in range(20)]
    assert [r["offset"] for r in rows] == [*range(10), *range(11, 21)], "the markers' offsets are gaps"


def test_the_consumer_is_closed_before_the_last_batch_reaches_the_caller(
    kafka_config, unique, topic_factory, monkeypatch
):
    """The caller parses and writes the last batch after it is yielded; a consumer still open then would
    keep fetching past the range (at the log end, a loop of empty fetches on both ends)."""
    import kafka_iceberg.kafka.reader as reader

    topic = topic_factory(unique, partitions=1)
    producer = Producer(kafka_config.client_conf())
    for n in range(25_000):  # more than one consume call takes (10,000 records at most)
        producer.produce(topic, value=f"v{n}".encode(), partition=0)
        if n % 5000 == 0:
            producer.poll(0)
    assert producer.flush(30) == 0
    states: list[str] = []
    real = reader.new_consumer

    class Watched:
        def __init__(self, consumer):
            self.consumer, self.closed = consumer, False
            states.append("open")

        def __getattr__(self, name):
            return getattr(self.consumer, name)

        def close(self):
            self.closed = True
            states.append("closed")
            return self.consumer.close()

    monkeypatch.setattr(reader, "new_consumer", lambda conf, table: Watched(real(conf, table)))
    monkeypatch.setattr(reader, "CHUNK_RECORDS", 5000)  # a batch after each consume call
    seen = []
    for batch in read_range(kafka_config.client_conf(), "t", topic, 0, 0, 25_000, 30):
        seen.append((batch.num_rows, states[-1]))
    assert sum(n for n, _ in seen) == 25_000 and len(seen) >= 2
    assert seen[-1][1] == "closed", seen
    assert [s for _, s in seen[:-1]] == ["open"] * (len(seen) - 1), "the range goes on after an earlier batch"
    assert states == ["open", "closed"]


def test_a_pooled_consumer_reads_range_after_range_and_is_closed_when_a_read_fails(
    kafka_config, unique, topic_factory, monkeypatch
):
    """One consumer of the pool reads ranges of both partitions in turn, again after a range that ended on
    a transaction marker (the end-of-partition event comes again), and exactly their records each time;
    a read that fails closes its consumer instead of giving it back."""
    import kafka_iceberg.kafka.consumers as consumers

    topic = topic_factory(unique, partitions=2)
    producer = Producer(kafka_config.client_conf(**{"transactional.id": f"tx-{unique}"}))
    producer.init_transactions(30)
    for partition in (0, 1):
        producer.begin_transaction()
        for n in range(20):
            producer.produce(topic, value=f"p{partition}v{n}".encode(), partition=partition)
        producer.flush(30)
        producer.commit_transaction(30)  # offset 20 of the partition is the commit marker
    made, closed = [], []
    real = consumers.new_consumer

    def counted(conf, table):
        consumer = real(conf, table)
        made.append(consumer)
        return consumer

    monkeypatch.setattr(consumers, "new_consumer", counted)
    pool = ConsumerPool(kafka_config.client_conf())
    for partition, start, end in ((0, 0, 5), (1, 3, 21), (0, 5, 21), (0, 5, 21), (1, 0, 1), (0, 20, 21)):
        rows = _read(kafka_config, topic, start, end, pool, partition)
        expected = [n for n in range(start, min(end, 20))]
        assert [r["offset"] for r in rows] == expected, (partition, start, end)
        assert [r["value"] for r in rows] == [f"p{partition}v{n}".encode() for n in expected]
        assert all(r["partition"] == partition for r in rows)
    assert len(made) == 1, "one consumer served every range"
    assert pool.idle_count_locked() == 1

    class Closing:
        def __init__(self, consumer):
            self.consumer = consumer

        def __getattr__(self, name):
            return getattr(self.consumer, name)

        def close(self):
            closed.append(self)
            self.consumer.close()

    pool.give_back("t", Closing(pool.take("t")))
    with pytest.raises(ReadTimeoutError):  # offsets 21.. do not exist yet: no progress for 2 s
        list(read_range(kafka_config.client_conf(), "t", topic, 0, 21, 40, 2, pool))
    assert len(closed) == 1 and pool.idle_count_locked() == 0, "the failed read's consumer is closed"
    _read(kafka_config, topic, 0, 2, pool)
    assert len(made) == 2 and pool.idle_count_locked() == 1
    pool.close()
    assert pool.idle_count_locked() == 0


def test_ranges_of_several_partitions_are_read_at_once_and_a_finished_one_is_paused(
    kafka_config, unique, topic_factory, monkeypatch
):
    """One consumer reads three partitions' ranges together; each batch holds one partition's records in
    offset order, and every record of every range comes once. The shortest range ends first: its partition
    is paused, its last batch comes before the others end, and the pooled consumer then reads that
    partition again (it was resumed before it went back). Two ranges of one partition are refused."""
    import kafka_iceberg.kafka.reader as reader

    topic = topic_factory(unique, partitions=3)
    producer = Producer(kafka_config.client_conf())
    sizes = {0: 3_000, 1: 40, 2: 2_000}
    for partition, n in sizes.items():
        for i in range(n):
            producer.produce(topic, value=f"p{partition}v{i}".encode(), partition=partition)
        producer.poll(0)
    assert producer.flush(30) == 0
    monkeypatch.setattr(reader, "CHUNK_RECORDS", 500)
    pool = ConsumerPool(kafka_config.client_conf())
    ranges = [(topic, 0, 100, 3_000), (topic, 1, 0, 40), (topic, 2, 1, 2_000), (topic, 0, 5, 5)]
    batches = list(read_ranges(kafka_config.client_conf(), "t", ranges, 30, pool))
    by_partition: dict[int, list] = {}
    for b in batches:
        (partition,) = set(b.column("partition").to_pylist())
        by_partition.setdefault(partition, []).extend(b.column("offset").to_pylist())
        assert b.num_rows <= 500 + 10_000
    assert by_partition == {0: list(range(100, 3_000)), 1: list(range(40)), 2: list(range(1, 2_000))}
    order = [b.column("partition")[0].as_py() for b in batches]
    assert order.index(1) < len(order) - 1, "the short range's batch came while the others were read"
    assert pool.idle_count_locked() == 1
    rows = _read(kafka_config, topic, 10, 40, pool, partition=1)  # the same consumer, partition 1 again
    assert [r["value"] for r in rows] == [f"p1v{i}".encode() for i in range(10, 40)]
    assert pool.idle_count_locked() == 1
    with pytest.raises(ValueError, match="two ranges of one topic partition"):
        list(read_ranges(kafka_config.client_conf(), "t", [(topic, 0, 0, 5), (topic, 0, 5, 9)], 30, pool))
    pool.close()


def test_the_pool_keeps_at_most_its_bound_closing_the_least_recently_returned(kafka_config):
    """Past ``max_idle`` the consumer returned longest ago is closed; after close() a returned one is closed."""

    class Fake:
        def __init__(self, name):
            self.name, self.closed, self.unassigned = name, False, 0

        def unassign(self):
            self.unassigned += 1

        def close(self):
            self.closed = True

    pool = ConsumerPool(kafka_config.client_conf(), max_idle=2)
    a, b, c = Fake("a"), Fake("b"), Fake("c")
    pool.give_back("t1", a)
    pool.give_back("t2", b)
    pool.give_back("t3", c)
    assert a.closed and not b.closed and not c.closed and pool.idle_count_locked() == 2
    assert pool.take("t2") is b and pool.take("t3") is c and pool.idle_count_locked() == 0
    pool.give_back("t2", b)
    pool.close()
    assert b.closed
    pool.give_back("t3", c)
    assert c.closed and c.unassigned == 2 and pool.idle_count_locked() == 0
