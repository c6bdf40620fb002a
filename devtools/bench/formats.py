"""Decode-rate benchmark of the Schema Registry formats (records/s), for ``make bench``.

``decode_rates(n)`` returns one row per (format, method) measured over ``n`` framed records made
in memory (no broker, no registry: the decode cost alone, to print next to the raw-consume
reference). Methods:

- ``avro per record``: fastavro ``schemaless_reader`` per body (the writer schema parsed once);
- ``avro block``: the bodies joined into one Avro container block, one fastavro reader call
  (:meth:`kafka_iceberg.formats.avro.AvroDecoder.decode_block`, the path the decoder takes);
- ``... to Arrow``: :func:`kafka_iceberg.formats.decode_values`, framed bytes to an Arrow table
  of the table schema (what a Spark task runs), for Avro, Protobuf and JSON Schema;
- ``avro to Arrow, 1 bad``: the same with one undecodable record in the group (per-record isolation);
- ``polars block``: ``polars.read_avro`` on the same block, when polars is installed.

Two record shapes: ``flat`` (a nycflights13 weather-like record, 15 primitive fields) and
``nested`` (:mod:`devtools.demo.samples`' plane: struct, list of structs, map, union, decimal,
uuid, timestamps). Run alone: ``python -m devtools.bench.formats [--records N]``. From
``scripts/bench.py``: ``from devtools.bench import formats as formats_bench; formats_bench.print_rates(
formats_bench.decode_rates(n), say)``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import io
import json
import time

from devtools.demo import samples
from kafka_iceberg.formats import WriterSchema, arrow_schema, decode_values, frame, iceberg_schema
from kafka_iceberg.formats.avro import AvroDecoder

WEATHER = {
    "type": "record",
    "name": "Weather",
    "namespace": "nycflights13",
    "fields": [
        {"name": "origin", "type": "string"},
        {"name": "year", "type": "int"},
        {"name": "month", "type": "int"},
        {"name": "day", "type": "int"},
        {"name": "hour", "type": "int"},
        *(
            {"name": n, "type": ["null", "double"], "default": None}
            for n in ("temp", "dewp", "humid", "wind_dir", "wind_speed", "wind_gust", "precip", "pressure", "visib")
        ),
        {"name": "time_hour", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    ],
}


def _weather(i: int) -> dict:
    row = {
        "origin": ["EWR", "JFK", "LGA"][i % 3],
        "year": 2013,
        "month": 1 + i % 12,
        "day": 1 + i % 28,
        "hour": i % 24,
        "time_hour": samples.T0 + dt.timedelta(hours=i),
    }
    row.update(
        {
            n: (None if i % 9 == 0 else float(i % 100) + 0.5)
            for n in ("temp", "dewp", "humid", "wind_dir", "wind_speed", "wind_gust", "precip", "pressure", "visib")
        }
    )
    return row


def _avro_bodies(schema: dict, make, n: int) -> list[bytes]:
    import fastavro

    parsed = fastavro.parse_schema(schema)
    out = []
    for i in range(n):
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, parsed, make(i))
        out.append(buf.getvalue())
    return out


REPEAT = 3


def _timed(fn) -> float:
    """The best of :data:`REPEAT` runs of ``fn``, seconds (the machine is shared: best-of damps the noise)."""
    best = float("inf")
    for _ in range(REPEAT):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _row(fmt: str, shape: str, method: str, n: int, seconds: float) -> dict:
    return {
        "format": fmt,
        "shape": shape,
        "method": method,
        "records": n,
        "seconds": round(seconds, 4),
        "records_per_s": round(n / seconds) if seconds > 0 else None,
    }


def _avro_rows(shape: str, schema: dict, make, n: int) -> list[dict]:
    import fastavro

    bodies = _avro_bodies(schema, make, n)
    writer = WriterSchema(1, "AVRO", json.dumps(schema))
    framed = [frame(1, b) for b in bodies]
    target = arrow_schema(iceberg_schema(writer))
    dec = AvroDecoder(writer.schema_str)
    parsed = fastavro.parse_schema(schema)
    rows = [
        _row(
            "avro",
            shape,
            "avro per record (schemaless_reader)",
            n,
            _timed(lambda: [fastavro.schemaless_reader(io.BytesIO(b), parsed, None) for b in bodies]),
        ),
        _row("avro", shape, "avro block (one container block)", n, _timed(lambda: dec.decode_block(bodies))),
        _row(
            "avro",
            shape,
            "avro to Arrow (decode_values)",
            n,
            _timed(lambda: decode_values(framed, {1: writer}, target, "avro")),
        ),
    ]
    one_bad = framed[: n // 2] + [frame(1, b"\x07")] + framed[n // 2 :]
    rows.append(
        _row(
            "avro",
            shape,
            "avro to Arrow, 1 bad record (isolated per record)",
            n + 1,
            _timed(lambda: decode_values(one_bad, {1: writer}, target, "avro")),
        )
    )
    rows.extend(_polars(shape, dec, bodies))
    return rows


def _polars(shape: str, dec: AvroDecoder, bodies: list[bytes]) -> list[dict]:
    try:
        import polars
    except ImportError:
        return []
    from kafka_iceberg.formats.avro import _SENTINEL
    from kafka_iceberg.formats.wire import zigzag_varint

    _, header, sync = dec._modes[False]
    data = _SENTINEL.join(bodies) + _SENTINEL
    block = header + zigzag_varint(len(bodies)) + zigzag_varint(len(data)) + data + sync
    try:
        return [
            _row(
                "avro",
                shape,
                "polars block (read_avro)",
                len(bodies),
                _timed(lambda: polars.read_avro(io.BytesIO(block))),
            )
        ]
    except Exception as e:  # noqa: BLE001 - polars fails on maps, multi-type unions, named references
        print(f"polars block ({shape}): fails: {type(e).__name__}: {str(e)[:120]}")
        return []


def decode_rates(n: int = 50_000) -> list[dict]:
    """Decode rates, one dict per (format, shape, method): ``records``, ``seconds`` (best of
    :data:`REPEAT` runs), ``records_per_s``. Single process, in memory; figures depend on the
    machine's load. Takes about 30 x n / 50,000 seconds on a quiet 2-core machine."""
    rows = _avro_rows("flat", WEATHER, _weather, n)
    rows += _avro_rows("nested", samples.AVRO_PLANE, samples.avro_plane, n)

    cls = samples.protobuf_plane_class()
    pb = WriterSchema(2, "PROTOBUF", samples.protobuf_schema_str())
    framed = [frame(2, samples.protobuf_plane(cls, i).SerializeToString(), [0]) for i in range(n)]
    target = arrow_schema(iceberg_schema(pb))
    rows.append(
        _row(
            "protobuf",
            "nested",
            "protobuf to Arrow (decode_values)",
            n,
            _timed(lambda: decode_values(framed, {2: pb}, target, "protobuf")),
        )
    )

    js = WriterSchema(3, "JSON", json.dumps(samples.JSON_PLANE))
    framed = [frame(3, samples.json_payload(i)) for i in range(n)]
    target = arrow_schema(iceberg_schema(js))
    rows.append(
        _row(
            "json_schema",
            "nested",
            "json_schema to Arrow (decode_values)",
            n,
            _timed(lambda: decode_values(framed, {3: js}, target, "json_schema")),
        )
    )
    return rows


def print_rates(rows: list[dict], say=print) -> None:
    """Print :func:`decode_rates` as an aligned table through ``say``."""
    say(f"{'format':<12} {'shape':<7} {'method':<52} {'records':>8} {'records/s':>11}")
    for r in rows:
        say(f"{r['format']:<12} {r['shape']:<7} {r['method']:<52} {r['records']:>8} {r['records_per_s']:>11,}")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="decode rates of the Schema Registry formats")
    p.add_argument("--records", type=int, default=50_000)
    print_rates(decode_rates(p.parse_args(argv).records))


if __name__ == "__main__":
    main()
