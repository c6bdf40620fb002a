"""Data files written by Spark tasks with pyiceberg's Parquet writer (the tables parsed by pyarrow,
:func:`kafka_iceberg.batch.read.arrow_parsed`), and their publish as one snapshot.

Records pyarrow claimed in the read task (:mod:`kafka_iceberg.formats.arrow_json`) never become Spark
rows: the read task turns them into table rows (Arrow) and writes them as Parquet data files with
the table's schema (field ids), partition spec, location provider and write properties, keeping at
most :data:`FLUSH_ROWS` rows in memory. The task reports its files (pyiceberg ``DataFile``s)
through an accumulator. The records Spark classified as good (the few pyarrow did not claim) are
written the same way by a second Spark job (:func:`write_rows`). The publish phase then commits
every file of the batch in one catalog commit (:func:`kafka_iceberg.batch.commit.stage_publish`): one snapshot carrying the
batch's snapshot summary, on top of the attempt branch's head, with the target ref moved to it and
the attempt branch removed. Spark's writer, which serves the other tables, needs three commits for
the same (append to the branch, fast-forward, drop); the state contract is the same.

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

import pyarrow as pa
import pyarrow.compute as pc

log = logging.getLogger(__name__)

FLUSH_ROWS = 250_000
"""Table rows a task holds before it writes them out (bounds a task's memory, not the file size)."""

_FILE_DDL = "file BINARY"


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


def file_writer(table, spec, columns: Sequence) -> FileWriter:
    """The :class:`FileWriter` of ``spec``'s table from ``table`` (the pyiceberg ``Table`` the attempt's
    branch commit returned: no schema change happens on this path)."""
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
