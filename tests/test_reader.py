"""``kafka_iceberg.kafka.reader.read_range`` against the dev broker: exactly the records of a range, whatever
its ends (inside one fetch, on a transaction marker), with headers as lists and never null."""

from __future__ import annotations

from confluent_kafka import Producer

from kafka_iceberg.kafka.reader import read_range


def _read(kafka_config, topic: str, start: int, end: int):
    batches = list(read_range(kafka_config.client_conf(), "t", topic, 0, start, end, 30))
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
    real = reader._consumer

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

    monkeypatch.setattr(reader, "_consumer", lambda conf, table: Watched(real(conf, table)))
    monkeypatch.setattr(reader, "_CHUNK", 5000)  # a batch after each consume call
    seen = []
    for batch in read_range(kafka_config.client_conf(), "t", topic, 0, 0, 25_000, 30):
        seen.append((batch.num_rows, states[-1]))
    assert sum(n for n, _ in seen) == 25_000 and len(seen) >= 2
    assert seen[-1][1] == "closed", seen
    assert [s for _, s in seen[:-1]] == ["open"] * (len(seen) - 1), "the range goes on after an earlier batch"
    assert states == ["open", "closed"]
