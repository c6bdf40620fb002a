"""JSON parsed with pyarrow in the read task (kafka_iceberg/formats/arrow_json.py) classifies every record
exactly as Spark's from_json path does: same table values for good records, same problem kind and
reason for bad ones. Real Spark; the raw records are built in memory."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from kafka_iceberg.formats import arrow_json
from kafka_iceberg.formats.transform import PROBLEM, ValueColumn, classify, classify_parsed
from kafka_iceberg.kafka.reader import PieceStats
from kafka_iceberg.kafka.records import RAW_SCHEMA_DDL, no_headers, raw_batch
from tests.helpers import make_spec

COLUMNS = [
    ValueColumn("id", "bigint", True),
    ValueColumn("name", "string", False),
    ValueColumn("n", "int", False),
    ValueColumn("amount", "double", False),
    ValueColumn("ok", "boolean", False),
    ValueColumn("event_time", "timestamp", True),
]
GOOD = {"id": 1, "name": "a", "n": 7, "amount": 1.5, "ok": True, "event_time": "2023-11-14T01:00:00Z"}
VALUES = [
    json.dumps(GOOD).encode(),
    json.dumps({**GOOD, "id": 2, "event_time": "2023-11-14T01:00:00.25+01:00", "amount": 5}).encode(),
    None,  # tombstone
    b"not json",
    b"null",
    b"",
    b"[1, 2]",
    json.dumps({**GOOD, "id": 3, "extra": 1}).encode(),  # unknown field
    json.dumps({**GOOD, "id": 4, "n": 3000000000}).encode(),  # int out of range
    json.dumps({**GOOD, "id": 5, "n": 1.5}).encode(),  # not an int
    json.dumps({**GOOD, "id": 6, "name": 12}).encode(),  # a number for a string
    json.dumps({**GOOD, "id": 7, "event_time": "2023-11-14 01:00:00"}).encode(),  # another timestamp form
    json.dumps({**GOOD, "id": 8, "event_time": 1700000000}).encode(),  # a number for a timestamp
    json.dumps({**GOOD, "id": None}).encode(),  # required and null
    json.dumps({k: v for k, v in GOOD.items() if k != "event_time"}).encode(),  # required and missing
    json.dumps({**GOOD, "id": 9}, indent=2).encode(),  # pretty-printed: several lines
    b'{"id": 10, "id": 11, "event_time": "2023-11-14T01:00:00Z"}',  # a key twice
    json.dumps({**GOOD, "id": 12, "name": "x" * 400}).encode(),  # oversize
    json.dumps({**GOOD, "id": 13, "amount": "NaN"}).encode(),
    json.dumps({**GOOD, "id": 14, "name": "é\u2603\n"}).encode(),
    json.dumps({**GOOD, "id": 15}).encode() + b" ",  # trailing blank
    json.dumps({**GOOD, "id": 16}).replace(", ", ",\r ").encode(),  # CR between tokens: JSON whitespace
    json.dumps({**GOOD, "id": 17}).encode() + b"\n" + json.dumps({**GOOD, "id": 18}).encode(),  # two objects
] + [json.dumps({**GOOD, "id": 100 + i}).encode() for i in range(100)]


def _raw_batch() -> pa.RecordBatch:
    n = len(VALUES)
    return raw_batch(
        "t", 0, list(range(n)), [1_700_000_000_000 + i for i in range(n)], [b"k"] * n, VALUES, no_headers(n)
    )


def _frame(spark, batch: pa.RecordBatch, ddl: str):
    """``batch`` as a Spark DataFrame, through mapInArrow as the read task hands it over."""

    def one(_):
        yield batch

    return spark.range(1).repartition(1).mapInArrow(one, ddl)


def _rows(df) -> list:
    return [
        (
            r["offset"],
            r["j"].asDict() if r["j"] is not None and r[PROBLEM] is None else None,
            None if r[PROBLEM] is None else r[PROBLEM].asDict(),
        )
        for r in df.orderBy("offset").collect()
    ]


@pytest.mark.parametrize("unknown_fields", ["reject", "ignore"])
def test_pyarrow_and_spark_classify_every_record_alike(spark, monkeypatch, unknown_fields):
    monkeypatch.setattr(arrow_json, "FALLBACK_BLOCK", 1)  # isolate every bad record
    spec = make_spec("arrow_json", "t", unknown_fields=unknown_fields, bad_records={"max_record_bytes": 300})
    raw = _raw_batch()
    parser = arrow_json.Parser(COLUMNS, spec.bad_records.max_record_bytes, unknown_fields == "reject")
    parsed = parser.parse_batch(raw)
    claimed = parsed.column("_arrow").to_pylist()
    assert claimed[:2] == [True, True] and all(claimed[23:]), "good records around the bad ones are parsed by pyarrow"
    unusual = [i for i in [*range(2, 19), 21, 22] if not (unknown_fields == "ignore" and i == 7)]  # 7: an unknown field
    assert not any(claimed[i] for i in unusual), "pyarrow claims none of the unusual records"

    by_spark = classify(_frame(spark, raw, RAW_SCHEMA_DDL), spec, COLUMNS)
    ddl = f"{RAW_SCHEMA_DDL}, {arrow_json.j_ddl([(c.name, c.type) for c in COLUMNS])}"
    by_arrow = classify_parsed(_frame(spark, parsed, ddl), spec, COLUMNS)
    spark_rows, arrow_rows = _rows(by_spark), _rows(by_arrow)
    assert repr(arrow_rows) == repr(spark_rows)  # repr: "NaN" parses to nan on both paths, and nan != nan
    assert sum(1 for _, _, problem in spark_rows if problem is not None) >= 10


def test_piece_stats_count_what_the_task_read():
    parsed = arrow_json.Parser(COLUMNS, 300, True).parse_batch(_raw_batch())
    tally = PieceStats(0)
    tally.add(parsed)
    assert (tally.records, tally.max_offset, tally.max_timestamp_ms) == (
        len(VALUES),
        len(VALUES) - 1,
        1_700_000_000_000 + len(VALUES) - 1,
    )
    assert tally.bytes == sum(len(v or b"") + 1 for v in VALUES)
    assert tally.arrow_good == sum(parsed.column("_arrow").to_pylist())


def test_only_tables_of_supported_types_take_the_pyarrow_path():
    assert arrow_json.supported(COLUMNS)
    assert not arrow_json.supported([*COLUMNS, ValueColumn("d", "decimal(10,2)", False)])
    assert not arrow_json.supported([])
