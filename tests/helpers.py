"""Helpers shared by the tests: declared test tables, test events, and table inspection."""

from __future__ import annotations

import json
from pathlib import Path

from kafka_iceberg.catalog.tables import load_table, metadata_view
from kafka_iceberg.declaration.spec import TableSpec, parse_table_spec

EVENT_SCHEMA = [
    {"name": "id", "type": "long", "required": True},
    {"name": "name", "type": "string"},
    {"name": "amount", "type": "double"},
    {"name": "event_time", "type": "timestamp", "required": True},
]
BASE_TS_MS = 1_700_000_000_000


def spec_dict(name: str, topic: str, **overrides) -> dict:
    """A table declaration over :data:`EVENT_SCHEMA`, shaped like a tables.yaml entry."""
    raw = {
        "name": name,
        "identifier": f"test.{name}",
        "topic": topic,
        "schema": EVENT_SCHEMA,
        "partition_by": ["days(event_time)"],
        "kafka_columns": ["topic", "partition", "offset", "timestamp", "key", "headers"],
        "max_records_per_partition": 1000,
        "freshness": {"max_snapshot_age": "1h", "max_valid_through_age": "none"},
    }
    raw.update(overrides)
    return raw


def make_spec(name: str, topic: str, **overrides) -> TableSpec:
    """The validated :class:`TableSpec` of :func:`spec_dict`."""
    return parse_table_spec(spec_dict(name, topic, **overrides))


def event(i: int) -> dict:
    """The i-th test event (unique ``id`` = i)."""
    return {
        "id": i,
        "name": f"name-{i}",
        "amount": round(i * 1.5, 2),
        "event_time": f"2023-11-{14 + i % 3:02d}T{i % 24:02d}:00:00Z",
    }


def event_records(ids, ts0: int = BASE_TS_MS):
    """Keyed JSON records ``(key, value, timestamp_ms)`` for events ``ids``."""
    for i in ids:
        yield str(i).encode(), json.dumps(event(i)).encode(), ts0 + i


def table_rows(spark, settings, spec: TableSpec) -> list:
    """All rows of the table (as Spark Rows), read through the catalog."""
    return spark.table(f"{settings.catalog.name}.{spec.identifier}").collect()


def current_view(catalog, spec: TableSpec):
    return metadata_view(load_table(catalog, spec.identifier))


def current_table(catalog, spec: TableSpec):
    """``spec``'s pyiceberg table as the catalog has it now (what ``duplicate_free`` reads)."""
    return load_table(catalog, spec.identifier)


def data_files_on_disk(settings, spec: TableSpec) -> set[str]:
    """Parquet files under the table's data directory (local warehouse only)."""
    root = Path(settings.catalog.warehouse[len("file://") :]) / Path(*spec.identifier.split("."))
    return {str(p) for p in (root / "data").rglob("*.parquet")}


def live_delete_files(spark, qualified_table: str) -> int:
    """Delete files (position and equality) of the table's current snapshot, from the ``delete_files``
    metadata table (a count independent of the snapshot summary the maintenance jobs report)."""
    return int(spark.sql(f"SELECT count(*) AS n FROM {qualified_table}.delete_files").collect()[0]["n"])


def referenced_data_files(spark, settings, spec: TableSpec) -> set[str]:
    """Data files referenced by any snapshot of the table (the all_data_files metadata table)."""
    rows = spark.sql(f"SELECT file_path FROM {settings.catalog.name}.{spec.identifier}.all_data_files").collect()
    # Spark's writer records file:/path, pyiceberg's (tables parsed by pyarrow) file:///path
    return {"/" + r["file_path"].removeprefix("file:").lstrip("/") for r in rows}


def delete_records(kafka_config, topic: str, partition: int, before_offset: int) -> None:
    """Delete every record of ``topic``/``partition`` below ``before_offset`` (Kafka's DeleteRecords),
    moving its log start offset there, as retention would."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(kafka_config.client_conf())
    for fut in admin.delete_records([TopicPartition(topic, partition, before_offset)]).values():
        fut.result(timeout=30)


def new_database(server, prefix: str = "db") -> str:
    """Create a new database (a unique name starting with ``prefix``) owned by ``lake`` on the
    :mod:`devtools.services.devpostgres` ``server``; returns its ``postgresql://`` URI.

    Raises:
        subprocess.CalledProcessError: ``createdb`` failed.
    """
    import os
    import subprocess
    import uuid

    from devtools.services import devpostgres

    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    subprocess.run(
        [str(devpostgres.PG_BIN / "createdb"), "-h", "127.0.0.1", "-p", str(server.port), "-U", "lake", name],
        check=True,
        env={**os.environ, "PGPASSWORD": "lakepw"},
    )
    return f"postgresql://lake:lakepw@127.0.0.1:{server.port}/{name}"


def rehearsal_on_own_broker(prefix: str, seed: int):
    """A ``devtools.rehearsal.run.Rehearsal`` on a dev broker of its own under a new temporary home
    (a generator for module-scoped fixtures: yields it, then stops the broker and removes the home)."""
    import shutil
    import tempfile

    from devtools.rehearsal.run import Lake, Rehearsal
    from devtools.services import devbroker

    home = Path(tempfile.mkdtemp(prefix=prefix))
    bootstrap = devbroker.start(home / "kafka", devbroker.free_port())
    try:
        yield Rehearsal(Lake(home, home / "kafka", bootstrap), seed=seed)
    finally:
        devbroker.stop(home / "kafka")
        shutil.rmtree(home, ignore_errors=True)
