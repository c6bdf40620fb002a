"""Leak counts: what dead write attempts left in a table and its dead-letter table that no reader
of ``main`` sees. Used by the rehearsal and the tests; reads through pyiceberg only (no Spark).

Four kinds, per table (see docs/operations.md, "What a killed micro-batch leaves behind"):

* ``unreachable_snapshots``: snapshots that no ref (branch or tag) reaches;
* ``orphan_files``: data and delete files under the table's data location that no manifest of any
  snapshot lists;
* ``stale_branches``: refs other than ``main`` (attempt branches ``ingest_<ms>_<run>``, and the
  ``dead_<branch>`` tags of a recovery that stopped before deleting their orphan files);
* ``unpublished_dead_letter_rows``: rows of dead-letter snapshots that are neither on the
  dead-letter table's ``main`` nor pointed at (``kafka.dead-letter``) by a snapshot of the table's
  ``main``: quarantined records of an attempt that never published.

The bound (checked by :meth:`Leaks.beyond_bound`): once every attempt that left something is
dead (``attempt_timeout_s`` of ``LAKE_DEV_HOOKS`` old, or its Dagster run ended) and one micro-batch of the table
has run recovery after that, every count is 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlparse

from kafka_iceberg.catalog.tables import load_table, metadata_view
from kafka_iceberg.state import KEY_DEAD_LETTER_OF, ancestors, dead_letter_ref


@dataclass(frozen=True)
class TableLeaks:
    """What one table holds beyond what its refs need (ids, file locations, branch names)."""

    identifier: str
    unreachable_snapshots: tuple[int, ...] = ()
    orphan_files: tuple[str, ...] = ()
    stale_branches: tuple[str, ...] = ()

    @property
    def total(self) -> int:
        """Snapshots + files + branches (a count of things, not records)."""
        return len(self.unreachable_snapshots) + len(self.orphan_files) + len(self.stale_branches)


@dataclass(frozen=True)
class Leaks:
    """Leak counts of a table and its dead-letter table (``dead_letters`` None when it has none)."""

    table: TableLeaks
    dead_letters: TableLeaks | None = None
    unpublished_dead_letter_rows: int = 0  # records

    @property
    def unreachable_snapshots(self) -> int:
        return sum(len(t.unreachable_snapshots) for t in self._tables())

    @property
    def orphan_files(self) -> int:
        return sum(len(t.orphan_files) for t in self._tables())

    @property
    def stale_branches(self) -> int:
        return sum(len(t.stale_branches) for t in self._tables())

    @property
    def total(self) -> int:
        """Snapshots + files + branches + dead-letter rows over both tables."""
        return sum(t.total for t in self._tables()) + self.unpublished_dead_letter_rows

    def beyond_bound(self, recovered: bool = True) -> int:
        """How much exceeds the documented bound. ``recovered``: a micro-batch has run recovery since
        every attempt that could have left something was dead; then the bound is 0 of everything.
        Before that, anything may remain (the bound does not apply yet): returns 0."""
        return self.total if recovered else 0

    def describe(self) -> str:
        """One line: the non-zero counts, e.g. ``1 unreachable snapshot(s), 2 orphan file(s)``."""
        parts = [
            (self.unreachable_snapshots, "unreachable snapshot(s)"),
            (self.orphan_files, "orphan file(s)"),
            (self.stale_branches, "branch(es) left"),
            (self.unpublished_dead_letter_rows, "unpublished dead-letter row(s)"),
        ]
        return ", ".join(f"{n} {what}" for n, what in parts if n) or "none"

    def _tables(self) -> list[TableLeaks]:
        return [self.table] + ([self.dead_letters] if self.dead_letters is not None else [])


def _reachable(view) -> set[int]:
    out: set[int] = set()
    for head in view.refs.values():
        out.update(s.snapshot_id for s in ancestors(view.snapshots, head))
    return out


def referenced_files(table) -> set[str]:
    """Locations of every data and delete file listed by a manifest of any snapshot of ``table``
    (a pyiceberg Table), including entries marked deleted (an older snapshot still reads them)."""
    io = table.io
    seen_manifests: set[str] = set()
    files: set[str] = set()
    for snapshot in table.metadata.snapshots:
        for manifest in snapshot.manifests(io):
            if manifest.manifest_path in seen_manifests:
                continue
            seen_manifests.add(manifest.manifest_path)
            for entry in manifest.fetch_manifest_entry(io, discard_deleted=False):
                files.add(entry.data_file.file_path)
    return files


def data_location(table) -> str:
    """Where ``table`` writes data and delete files: ``write.data.path`` or ``<location>/data``."""
    return table.properties.get("write.data.path") or f"{table.metadata.location.rstrip('/')}/data"


def list_files(table, location: str) -> list[str]:
    """Every file under ``location`` (recursive, without hidden files): local paths, or ``s3://bucket/key``
    URIs. Lists through the table's FileIO's filesystem (pyarrow for local and S3; fsspec when the
    table uses FsspecFileIO)."""
    from pyarrow.fs import FileSelector, FileType

    parsed = urlparse(location)
    scheme = parsed.scheme or "file"
    io = table.io
    root = f"{parsed.netloc}{parsed.path}" if scheme != "file" else parsed.path
    if hasattr(io, "fs_by_scheme"):  # PyArrowFileIO
        fs = io.fs_by_scheme(scheme, parsed.netloc)
        infos = fs.get_file_info(FileSelector(root, recursive=True, allow_not_found=True))
        paths = [i.path for i in infos if i.type == FileType.File]
    else:  # FsspecFileIO
        fs = io.get_fs(scheme)
        paths = fs.find(root) if fs.exists(root) else []
    out = []
    for path in paths:
        if _hidden(path[len(root) :] if path.startswith(root) else path):
            continue
        if scheme == "file":
            out.append(path)
        else:  # pyarrow and fsspec list object stores as "bucket/key"
            out.append(
                f"{scheme}://{path}"
                if path.startswith(f"{parsed.netloc}/")
                else f"{scheme}://{parsed.netloc}/{path.lstrip('/')}"
            )
    return out


def _hidden(relative: str) -> bool:
    """Hidden paths (a part starting with ``.`` or ``_``, such as Hadoop's ``.x.parquet.crc``
    checksums), which Iceberg's orphan-file action skips too."""
    return any(part.startswith((".", "_")) for part in relative.split("/") if part)


def _normalise(location: str) -> str:
    """``location`` without its scheme (``file:``, ``s3://`` and ``s3a://`` spell the same file)."""
    parsed = urlparse(location)
    return parsed.path if parsed.scheme in ("", "file") else f"{parsed.netloc}{parsed.path}"


def table_leaks(catalog, identifier: str) -> TableLeaks | None:
    """The :class:`TableLeaks` of one table, or None when it does not exist."""
    table = load_table(catalog, identifier)
    if table is None:
        return None
    view = metadata_view(table)
    reachable = _reachable(view)
    referenced = {_normalise(f) for f in referenced_files(table)}
    listed = list_files(table, data_location(table))
    return TableLeaks(
        identifier,
        tuple(sorted(s for s in view.snapshots if s not in reachable)),
        tuple(sorted(f for f in listed if _normalise(f) not in referenced)),
        tuple(sorted(r for r in view.refs if r != "main")),
    )


def unpublished_dead_letter_rows(catalog, identifier: str, dead_letter_identifier: str) -> int:
    """Records in dead-letter snapshots (of ``identifier``) that the dead-letter table's ``main`` does
    not reach and that no snapshot of the table's ``main`` points at: quarantined records of an
    attempt that never published. 0 when either table is missing."""
    table, dead = load_table(catalog, identifier), load_table(catalog, dead_letter_identifier)
    if table is None or dead is None:
        return 0
    view, dead_view = metadata_view(table), metadata_view(dead)
    pointed = {
        int(ref["snapshot-id"]) for s in ancestors(view.snapshots, view.main) if (ref := dead_letter_ref(s)) is not None
    }
    published = {s.snapshot_id for s in ancestors(dead_view.snapshots, dead_view.main)}
    return sum(
        int(s.summary.get("added-records", 0))
        for sid, s in dead_view.snapshots.items()
        if KEY_DEAD_LETTER_OF in s.summary and sid not in published and sid not in pointed
    )


def count_leaks(catalog, identifier: str, dead_letter_identifier: str | None = None) -> Leaks:
    """Count the leaks of table ``identifier`` and its dead-letter table (default
    ``<identifier>_dead_letter``; skipped when it does not exist).

    Raises:
        LakeError: the table does not exist. CatalogUnavailableError: the catalog cannot be read.
    """
    from kafka_iceberg.errors import LakeError

    main = table_leaks(catalog, identifier)
    if main is None:
        raise LakeError(f"table {identifier} does not exist")
    dlq_id = dead_letter_identifier or f"{identifier}_dead_letter"
    dlq = table_leaks(catalog, dlq_id)
    rows = unpublished_dead_letter_rows(catalog, identifier, dlq_id) if dlq is not None else 0
    return Leaks(main, dlq, rows)


__all__ = [
    "Leaks",
    "TableLeaks",
    "count_leaks",
    "data_location",
    "list_files",
    "referenced_files",
    "table_leaks",
    "unpublished_dead_letter_rows",
]
