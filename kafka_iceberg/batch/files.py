"""Data files written by Spark tasks with pyiceberg's Parquet writer (``LAKE_WRITER=arrow``), and
their publish as one snapshot.

Records pyarrow claimed in the read task (:mod:`kafka_iceberg.formats.arrow_json`) never become Spark
rows: the read task turns them into table rows (Arrow) and writes them as Parquet data files with
the table's schema (field ids), partition spec, location provider and write properties, keeping at
most :data:`FLUSH_ROWS` rows in memory. The task reports its files (pyiceberg ``DataFile``s)
through an accumulator. The records Spark classified as good (the few pyarrow did not claim) are
written the same way by a second Spark job (:func:`write_rows`). The publish phase then commits
every file of the batch in one catalog commit (:func:`stage_publish`): one snapshot carrying the
batch's snapshot summary, on top of the attempt branch's head, with the target ref moved to it and
the attempt branch removed. Spark's writer needs three commits for the same (append to the branch,
fast-forward, drop); the state contract is the same.

An attempt whose commit fails deletes the files it wrote (:func:`discard`); the files of an
attempt killed before its commit are orphans under the table location, and recovery deletes them
like those of Spark's writer (:mod:`kafka_iceberg.batch.recovery`).

Where pyiceberg's writer differs from Spark's: a read task writes one file per table partition it
saw (no shuffle), so a large batch has more, smaller files (compaction rewrites them); and a list
of structs that is null would be written as an empty list (pyiceberg's projection rebuilds such a
list from its offsets), which is why the reader gives a record without headers an empty list.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from kafka_iceberg.batch.commit import commit

log = logging.getLogger(__name__)

FLUSH_ROWS = 250_000
"""Table rows a task holds before it writes them out (bounds a task's memory, not the file size)."""

_FILE_DDL = "file BINARY"
_MERGE_ENABLED = "commit.manifest-merge.enabled"


def data_files(metadata, rows: pa.Table, io) -> list:
    """pyiceberg's writer: ``rows`` (Arrow, the table's columns by name) as Parquet data files of
    the table described by ``metadata`` (a pyiceberg ``TableMetadata``), split by its partition
    spec and ``write.target-file-size-bytes``, written through ``io``; returns the ``DataFile`` s.

    This wraps pyiceberg's private ``_dataframe_to_data_files`` (what ``Table.append`` writes
    with), once; tests/test_arrow_writer.py pins it. A fresh write uuid per call keeps a retried
    task from reusing a file name.
    """
    from pyiceberg.io.pyarrow import _dataframe_to_data_files

    return list(_dataframe_to_data_files(metadata, rows, io, uuid.uuid4()))


class FileWriter:
    """Turns parsed batches into table rows and writes them as data files, in a Spark task.

    Picklable: built on the driver from the loaded pyiceberg table (``table``), with the table's
    value ``columns`` (``ValueColumn``) and ``kafka_columns`` (declared name -> table column).
    """

    def __init__(self, table, columns: Sequence, kafka_columns: Mapping[str, str]):
        from pyiceberg.io.pyarrow import schema_to_pyarrow

        # what the writer reads (schema, spec, properties, location, format version), not the history:
        # a table's snapshot list grows with every commit and would travel with every task
        self.metadata = table.metadata.model_copy(
            update={
                "snapshots": [],
                "snapshot_log": [],
                "metadata_log": [],
                "refs": {},
                "statistics": [],
                "partition_statistics": [],
            }
        )
        self.io_properties = dict(table.io.properties)
        self.schema = schema_to_pyarrow(table.schema(), include_field_ids=False)
        self.value_columns = [c.name for c in columns]
        self.kafka_columns = dict(kafka_columns)

    def rows(self, batch) -> pa.Table:
        """Table rows of a parsed batch (raw record columns plus ``j``) in the table's Arrow schema."""
        j = batch.column("j")
        ts = pc.multiply(pc.cast(batch.column("timestamp_ms"), pa.int64()), 1000)
        kafka = {
            "topic": batch.column("topic"),
            "partition": batch.column("partition"),
            "offset": batch.column("offset"),
            "timestamp": ts.cast(pa.timestamp("us", tz="UTC")),
            "key": batch.column("key"),
            "headers": batch.column("headers"),
        }
        arrays = {name: j.field(name) for name in self.value_columns}
        arrays.update({column: kafka[declared] for declared, column in self.kafka_columns.items()})
        return pa.Table.from_arrays([arrays[f.name].cast(f.type) for f in self.schema], schema=self.schema)

    def write(self, rows: pa.Table) -> list:
        """Write ``rows`` as data files (:func:`data_files`); returns their ``DataFile`` s.

        Raises:
            OSError (or the FileIO's own error): the warehouse cannot be written; the Spark task
            fails, and with it the attempt, which the next run retries.
        """
        if rows.num_rows == 0:
            return []
        return data_files(self.metadata, rows, self.io())

    def io(self):
        """The table's FileIO, from the properties the driver loaded (no catalog call)."""
        from pyiceberg.io import load_file_io

        return load_file_io(self.io_properties, self.metadata.location)

    def sink(self) -> Sink:
        """A new :class:`Sink` for one task."""
        return Sink(self)


class Sink:
    """One read task's claimed rows: :meth:`take` keeps them (writing every :data:`FLUSH_ROWS`),
    :meth:`close` writes the rest and returns every ``DataFile`` the task wrote."""

    def __init__(self, writer: FileWriter):
        self.writer, self.pending, self.held, self.files = writer, [], 0, []

    def take(self, parsed: pa.RecordBatch) -> pa.RecordBatch:
        """Keep the rows pyarrow claimed (``_arrow``); return the batch of the other records."""
        claimed = parsed.column("_arrow")
        if claimed.null_count == 0 and pc.all(claimed).as_py():
            rest = parsed.slice(0, 0)
            mine = parsed
        else:
            claimed = pc.fill_null(claimed, False)
            mine, rest = parsed.filter(claimed), parsed.filter(pc.invert(claimed))
        if mine.num_rows:
            self.pending.append(self.writer.rows(mine))
            self.held += mine.num_rows
            if self.held >= FLUSH_ROWS:
                self._flush()
        return rest

    def _flush(self) -> None:
        if self.pending:
            self.files += self.writer.write(pa.concat_tables(self.pending))
        self.pending, self.held = [], 0

    def close(self) -> list:
        """Write what is held; returns the task's ``DataFile`` s."""
        self._flush()
        return self.files


def write_rows(spark, writer: FileWriter, rows) -> list:
    """Write a Spark DataFrame of table rows as data files, one writing task per Spark partition;
    returns their ``DataFile`` s (collected to the driver, pickled)."""
    import pickle

    def task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        batches = [b for b in batches if b.num_rows]
        if batches:
            table = pa.Table.from_batches(batches).select(writer.schema.names).cast(writer.schema)
            for f in writer.write(table):
                yield pa.RecordBatch.from_pydict({"file": [pickle.dumps(f)]})

    return [pickle.loads(r["file"]) for r in rows.mapInArrow(task, _FILE_DDL).collect()]


def file_writer(lake, spec, columns: Sequence) -> FileWriter:
    """The :class:`FileWriter` of ``spec``'s table, from the table as this micro-batch last loaded it
    (``prepare``'s load: no schema change happens on this path), loaded only if it was not."""
    table = lake.loaded.get(spec.identifier) or lake.load(spec.identifier)
    return FileWriter(table, columns, {k: spec.kafka_column(k) for k in spec.kafka_columns})


def discard(io, files: Sequence) -> None:
    """Delete ``files`` (``DataFile`` s no snapshot references: their attempt failed before its
    commit) through the FileIO ``io``, best effort: one that cannot be deleted is logged and left
    to orphan-file removal (:mod:`kafka_iceberg.batch.recovery`, :mod:`kafka_iceberg.ops.maintenance`)."""
    for f in files:
        try:
            io.delete(f.file_path)
        except Exception as exc:  # noqa: BLE001 - best effort, see the docstring
            log.warning("data file %s of a failed attempt was not deleted (%s); orphan removal will", f.file_path, exc)


@dataclass(frozen=True)
class StagedPublish:
    """A commit :func:`stage_publish` prepared and :meth:`commit` sends: ``snapshot_id`` is known before it lands."""

    snapshot_id: int
    table: object  # the pyiceberg Table, with its whole history, the commit applies to (its base)
    requirements: tuple
    updates: tuple

    def commit(self):
        """Commit on the base (:func:`kafka_iceberg.batch.commit.commit`); returns the table as
        committed (a pyiceberg ``Table``).

        Raises:
            CommitFailedException: a requirement failed (the ref or the branch moved, or the branch is
                gone); StaleBaseError (a subclass): the table moved since the base was loaded.
            ValueError: the updates do not apply to the base (e.g. a newer sequence number).
            Whatever the catalog raises when it is unavailable.
        """

        return commit(self.table, self.requirements, self.updates)


def stage_publish(
    table, files: Sequence, summary: Mapping[str, str], *, branch: str, branch_base: int, ref: str, ref_base: int | None
) -> StagedPublish:
    """Prepare one catalog commit that appends ``files`` (pyiceberg ``DataFile`` s) as one snapshot
    carrying ``summary`` whose parent is ``branch_base`` (the attempt ``branch``'s head), points
    ``ref`` at it (keeping its retention settings) and removes ``branch``; the catalog refuses it unless ``branch`` is still at
    ``branch_base`` and ``ref`` at ``ref_base`` (None: ``ref`` must not exist). Writes the manifests
    and the manifest list; commits nothing. ``table``: the table as this micro-batch last loaded or
    committed it, the commit's base (:mod:`kafka_iceberg.batch.commit`: the requirements are checked
    against it, and the catalog's pointer moves only while it still names it).

    Manifests are merged as Iceberg's Java ``MergeAppend`` (Spark's writer) does:
    ``commit.manifest-merge.enabled`` defaults to true there (pyiceberg's default is false),
    ``commit.manifest.min-count-to-merge`` 100. The snapshot is produced on a copy of the metadata
    without the table's history (:func:`_without_history`): pyiceberg deep-copies the whole metadata
    at every step of a transaction, which at 1,000 snapshots costs about 0.6 s per commit. The commit
    applies the updates to the base's full metadata. pyiceberg's own commit retries are not used: a
    retry on a moved ``ref`` would append the batch twice.
    """
    from pyiceberg.table.refs import SnapshotRefType
    from pyiceberg.table.update import (
        AddSnapshotUpdate,
        AssertRefSnapshotId,
        AssertTableUUID,
        RemoveSnapshotRefUpdate,
        SetSnapshotRefUpdate,
    )

    slim = _without_history(table, branch)
    tx = slim.transaction()
    with tx.update_snapshot(snapshot_properties=dict(summary), branch=branch).merge_append() as append:
        for f in files:
            append.append_data_file(f)
    staged = staged_updates(tx)
    snapshot_id = next(u.snapshot.snapshot_id for u in staged if isinstance(u, AddSnapshotUpdate))
    kept = table.metadata.refs.get(ref)  # its retention settings stay, as Java's fast-forward keeps them
    retention = {k: getattr(kept, k, None) for k in ("max_ref_age_ms", "max_snapshot_age_ms", "min_snapshots_to_keep")}
    updates = (
        *staged,
        SetSnapshotRefUpdate(ref_name=ref, type=SnapshotRefType.BRANCH, snapshot_id=snapshot_id, **retention),
        RemoveSnapshotRefUpdate(ref_name=branch),
    )
    requirements = (
        AssertTableUUID(uuid=slim.metadata.table_uuid),
        AssertRefSnapshotId(ref=branch, snapshot_id=branch_base),
        AssertRefSnapshotId(ref=ref, snapshot_id=ref_base),
    )
    return StagedPublish(snapshot_id, table, requirements, updates)


def staged_updates(tx) -> tuple:
    """The table updates a pyiceberg ``Transaction`` staged and has not committed. Wraps its private
    ``_updates`` once (pyiceberg keeps only the first ``AssertRefSnapshotId`` of a transaction, so a
    commit that requires two refs builds its own requirements); tests/test_arrow_writer.py pins it."""
    return tuple(tx._updates)


def _without_history(table, branch: str):
    """``table`` with metadata that keeps only the snapshots at ``branch`` and ``main`` (and refs
    to them); everything an append reads (schema, specs, properties, sequence number, the parent's
    manifest list and summary) is kept. Without a ``commit.manifest-merge.enabled`` property the
    copy says true (Java's default, see :func:`stage_publish`)."""
    from pyiceberg.table import Table

    md = table.metadata
    refs = {name: ref for name, ref in md.refs.items() if name in (branch, "main")}
    heads = {ref.snapshot_id for ref in refs.values()}
    properties = {_MERGE_ENABLED: "true", **md.properties}  # Java's default; only this commit reads it
    slim = md.model_copy(
        update={
            "snapshots": [s for s in md.snapshots if s.snapshot_id in heads],
            "refs": refs,
            "properties": properties,
            "snapshot_log": [],
            "metadata_log": [],
            "statistics": [],
            "partition_statistics": [],
        }
    )
    return Table(table.name(), slim, table.metadata_location, table.io, table.catalog)
