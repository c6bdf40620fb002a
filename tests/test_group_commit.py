"""The atomic commit of a consistency group (kafka_iceberg/batch/group_commit.py) on a SQLite and a
PostgreSQL catalog: a process SIGKILLed between the tables' writes or inside the catalog transaction
leaves no table of the group at the new snapshot; recovery removes what it left, and the retry
commits every table exactly once. A stale member commits none."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField

from devtools.services import devpostgres
from kafka_iceberg.batch.commit import StaleBaseError
from kafka_iceberg.batch.group_commit import GROUP_CRASH_POINTS, GroupCommitUnsupportedError, GroupMember, commit_group
from kafka_iceberg.batch.recovery import recover
from kafka_iceberg.catalog.spark import catalog_conf
from kafka_iceberg.catalog.tables import metadata_view
from kafka_iceberg.config.settings import load_settings
from kafka_iceberg.errors import CatalogUnavailableError
from kafka_iceberg.resources.catalog import IcebergCatalogResource
from kafka_iceberg.resources.reader import LakeTableReader
from kafka_iceberg.state import KEY_GROUP, group_record, group_state

ROOT = Path(__file__).resolve().parents[1]
TABLES = ["shop.orders", "shop.order_lines"]
SCHEMA = Schema(NestedField(1, "id", LongType(), required=False))


@pytest.fixture(scope="module")
def postgres_uri():
    """A private PostgreSQL server (:mod:`devtools.services.devpostgres`); yields its URI."""
    try:
        server = devpostgres.create()
    except CatalogUnavailableError as exc:
        pytest.fail(str(exc))
    yield server.uri
    server.destroy()


def _catalog(tmp_path: Path, uri: str, name: str) -> dict:
    """Create the group's two tables (one seed row each) on a fresh catalog; returns the run arguments."""
    warehouse = f"file://{tmp_path}/warehouse"
    catalog = SqlCatalog(name, uri=uri, warehouse=warehouse)
    catalog.create_namespace("shop")
    for ident in TABLES:
        catalog.create_table(ident, SCHEMA).append(pa.table({"id": pa.array([-1], pa.int64())}))
    return {"uri": uri, "name": name, "warehouse": warehouse, "identifiers": TABLES, "records": 40}


def _run(args: dict, commit_id: str, crash_at: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "LAKE_CRASH_AT"}
    if crash_at:
        env["LAKE_CRASH_AT"] = crash_at
    return subprocess.run(
        [sys.executable, "-m", "tests.group_batch", json.dumps({**args, "commit_id": commit_id})],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _unreferenced(catalog: SqlCatalog) -> set[str]:
    """Files under the group's table locations that no metadata of the table names (metadata.json
    files off the log, manifests, manifest lists and data files of no snapshot)."""
    out: set[str] = set()
    for ident in TABLES:
        table = catalog.load_table(ident)
        md = table.metadata
        known = {table.metadata_location, *(e.metadata_file for e in md.metadata_log)}
        for snap in md.snapshots:
            known.add(snap.manifest_list)
            for manifest in snap.manifests(table.io):
                known.add(manifest.manifest_path)
                known.update(
                    e.data_file.file_path for e in manifest.fetch_manifest_entry(table.io, discard_deleted=False)
                )
        root = Path(_path(table.location()))
        files = {str(p) for p in root.rglob("*") if p.is_file() and p.suffix != ".crc"}  # not Hadoop's checksums
        out |= files - {_path(k) for k in known}
    return out


def _path(location: str) -> str:
    return "/" + location.removeprefix("file:").lstrip("/")


def _group_snapshots(catalog: SqlCatalog) -> dict[str, list[int]]:
    """Per table: the ``seq`` of every snapshot that carries a group record."""
    out = {}
    for ident in TABLES:
        view = metadata_view(catalog.load_table(ident))
        out[ident] = [group_record(s)["seq"] for s in view.snapshots.values() if KEY_GROUP in s.summary]
    return out


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_a_crash_between_the_tables_or_inside_the_transaction_leaves_the_group_all_or_nothing(
    kind, tmp_path, request, spark
):
    name = f"grp{kind[:2]}"
    given = f"sqlite:///{tmp_path}/catalog.db" if kind == "sqlite" else request.getfixturevalue("postgres_uri")
    warehouse = f"file://{tmp_path}/warehouse"
    env = {
        "LAKE_HOME": str(tmp_path),
        "LAKE_CATALOG_NAME": name,
        "LAKE_CATALOG_URI": given,
        "LAKE_WAREHOUSE": warehouse,
    }
    settings = load_settings(env=env)
    uri = settings.catalog.sqlalchemy_uri
    args = _catalog(tmp_path, uri, name)
    catalog = SqlCatalog(name, uri=uri, warehouse=args["warehouse"])
    heads = {i: catalog.load_table(i).metadata.current_snapshot_id for i in TABLES}

    for n, point in enumerate(GROUP_CRASH_POINTS):
        proc = _run(args, f"crash-{n}", crash_at=point)
        assert proc.returncode == -9, proc.stderr[-3000:]
        assert {i: catalog.load_table(i).metadata.current_snapshot_id for i in TABLES} == heads
        assert _group_snapshots(catalog) == {i: [] for i in TABLES}
    left = _unreferenced(catalog)
    assert any(p.endswith(".metadata.json") for p in left), left  # the crashed commits' metadata files
    assert any(p.endswith(".parquet") for p in left), left

    for key, value in catalog_conf(settings.catalog).items():
        spark.conf.set(key, value)
    for ident in TABLES:
        report = recover(
            spark,
            catalog_name=name,
            identifier=ident,
            load_view=lambda ident=ident: metadata_view(catalog.load_table(ident)),
            is_alive=lambda attempt: False,
            clock_skew_s=0,
        )
        assert len(report.dead_attempts) == 2, report  # one attempt branch per crashed run
    assert _unreferenced(catalog) == set()

    proc = _run(args, "retry")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.splitlines()[-1]) == {"committed": 1}
    proc = _run(args, "again")  # nothing left to read: commits nothing
    assert json.loads(proc.stdout.splitlines()[-1]) == {"committed": None}
    assert _group_snapshots(catalog) == {i: [1] for i in TABLES}
    for ident in TABLES:
        table = catalog.load_table(ident)
        view = metadata_view(table)
        assert group_state(view.snapshots, view.main)["tables"][ident]["offsets"] == {"0": 40}
        ids = sorted(table.scan().to_arrow()["id"].to_pylist())
        assert ids == [-1, *range(40)]  # every record once
    reader = LakeTableReader(catalog=IcebergCatalogResource(name=name, uri=given, warehouse=warehouse))
    read = reader.group(TABLES)
    assert {i: s.snapshot_id for i, s in read.items()} == {
        i: catalog.load_table(i).metadata.current_snapshot_id for i in TABLES
    }
    assert {i: len(s.to_arrow()) for i, s in read.items()} == {i: 41 for i in TABLES}


def _seeded(tmp_path: Path):
    catalog = SqlCatalog("g", uri=f"sqlite:///{tmp_path}/c.db", warehouse=f"file://{tmp_path}/wh")
    catalog.create_namespace("shop")
    return catalog, [catalog.create_table(i, SCHEMA) for i in TABLES]


def _property(table, value: str) -> GroupMember:
    from pyiceberg.table.update import SetPropertiesUpdate

    return GroupMember(table, (), (SetPropertiesUpdate(updates={"group.test": value}),))


def test_a_stale_member_commits_no_table_and_leaves_no_metadata_file(tmp_path):
    catalog, (orders, lines) = _seeded(tmp_path)
    catalog.load_table(TABLES[1]).transaction().set_properties({"moved": "yes"}).commit_transaction()
    before = {p for p in tmp_path.rglob("*.metadata.json")}
    with pytest.raises(StaleBaseError, match="no table of the group was committed"):
        commit_group([_property(orders, "1"), _property(lines, "1")])
    assert catalog.load_table(TABLES[0]).metadata_location == orders.metadata_location
    assert "group.test" not in catalog.load_table(TABLES[1]).properties
    assert set(tmp_path.rglob("*.metadata.json")) == before


def test_a_group_commit_moves_every_row_and_a_guard_holds_an_unchanged_member(tmp_path):
    catalog, (orders, lines) = _seeded(tmp_path)
    committed = commit_group([_property(orders, "1"), GroupMember(lines)])
    assert catalog.load_table(TABLES[0]).properties["group.test"] == "1"
    assert committed[1] is lines
    catalog.load_table(TABLES[1]).transaction().set_properties({"moved": "yes"}).commit_transaction()
    with pytest.raises(StaleBaseError):  # the guard: the unchanged member moved, so the group does not commit
        commit_group([_property(committed[0], "2"), GroupMember(lines)])
    assert catalog.load_table(TABLES[0]).properties["group.test"] == "1"


def test_a_group_on_two_catalogs_is_refused(tmp_path):
    _, (orders, _) = _seeded(tmp_path)
    other = SqlCatalog("h", uri=f"sqlite:///{tmp_path}/d.db", warehouse=f"file://{tmp_path}/wh2")
    other.create_namespace("x")
    with pytest.raises(GroupCommitUnsupportedError):
        commit_group([_property(orders, "1"), _property(other.create_table("x.y", SCHEMA), "1")])


def test_a_catalog_without_one_transaction_takes_the_per_table_path_and_refuses_the_atomic_one(tmp_path):
    """A REST (or Hive, Glue) catalog cannot swap several tables at once: a group commits there member by
    member with a marker tag (kafka_iceberg/batch/group_marker.py); the one-transaction path is refused
    before it plans, branches or writes anything (the lake has no Spark, Kafka or tables to touch)."""
    from types import SimpleNamespace

    from kafka_iceberg.batch.group_batch import run_group_batch
    from kafka_iceberg.batch.group_commit import atomic_group_commit
    from kafka_iceberg.declaration.spec import parse_declarations

    cols = [{"name": "id", "type": "long", "required": True}]
    specs = parse_declarations(
        {"tables": [{"name": f"r_{t}", "identifier": f"test.r_{t}", "topic": f"shop.public.{t}", "schema": cols,
                     "mode": "upsert", "key": ["id"], "cdc": "debezium", "consistency_group": "shop"}
                    for t in ("orders", "lines")]},
        "tables.yaml",
    )  # fmt: skip
    rest = SimpleNamespace(name="rest_catalog")  # not a SqlCatalog
    assert not atomic_group_commit(rest)
    assert atomic_group_commit(_seeded(tmp_path)[0])
    with pytest.raises(GroupCommitUnsupportedError, match="not a SQL catalog"):
        run_group_batch(SimpleNamespace(catalog=rest), specs, "c1", per_table=False)
