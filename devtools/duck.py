"""DuckDB as an independent reader of the tables: it reads Iceberg metadata files directly.

The demo's row counts and the tests' end-to-end assertions come from here, so they do not
trust the engine that wrote the data. The DuckDB extensions are loaded from their PyPI
packages (duckdb-extension-iceberg and -avro 1.5.5) with auto-install off; nothing is
downloaded at run time.
"""

from __future__ import annotations

from pathlib import Path

import duckdb


def _extension(package: str, name: str) -> str:
    module = __import__(package)
    found = sorted(Path(list(module.__path__)[0]).rglob(f"{name}.duckdb_extension"))
    if not found:
        raise FileNotFoundError(f"{name}.duckdb_extension not found in package {package}")
    return str(found[0])


def connect(s3: dict[str, str] | None = None) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection with the avro and iceberg extensions loaded offline.

    ``s3``: pyiceberg catalog properties (``s3.endpoint``, ``s3.access-key-id``,
    ``s3.secret-access-key``, ``s3.region``) for a warehouse on S3; loads the httpfs extension
    (PyPI duckdb-extension-httpfs) and creates an S3 secret from them.
    """
    con = duckdb.connect(config={"autoinstall_known_extensions": "false", "autoload_known_extensions": "false"})
    con.execute(f"LOAD '{_extension('duckdb_extension_avro', 'avro')}'")
    con.execute(f"LOAD '{_extension('duckdb_extension_iceberg', 'iceberg')}'")
    if s3 is not None:
        con.execute(f"LOAD '{_extension('duckdb_extension_httpfs', 'httpfs')}'")
        con.execute(s3_secret_sql(s3))
    return con


def s3_secret_sql(props: dict[str, str]) -> str:
    """``CREATE SECRET`` for DuckDB's S3 access from pyiceberg ``s3.*`` properties (path-style URLs
    and plain HTTP when ``s3.endpoint`` is an ``http://`` URL, as for MinIO or moto)."""
    from urllib.parse import urlparse

    parts = ["TYPE S3"]
    if props.get("s3.access-key-id"):
        parts += [f"KEY_ID '{props['s3.access-key-id']}'", f"SECRET '{props.get('s3.secret-access-key', '')}'"]
    else:
        parts.append("PROVIDER credential_chain")
    if props.get("s3.session-token"):
        parts.append(f"SESSION_TOKEN '{props['s3.session-token']}'")
    if props.get("s3.region"):
        parts.append(f"REGION '{props['s3.region']}'")
    if props.get("s3.endpoint"):
        endpoint = urlparse(props["s3.endpoint"])
        parts += [
            f"ENDPOINT '{endpoint.netloc}'",
            "URL_STYLE 'path'",
            f"USE_SSL {str(endpoint.scheme == 'https').lower()}",
        ]
    return f"CREATE OR REPLACE SECRET lake_s3 ({', '.join(parts)})"


def local_path(metadata_location: str) -> str:
    """Strip ``file:``/``file://`` from a metadata location so DuckDB can open it."""
    for prefix in ("file://", "file:"):
        if metadata_location.startswith(prefix):
            return metadata_location[len(prefix) :]
    return metadata_location


def scan_sql(metadata_location: str) -> str:
    """``iceberg_scan('<metadata.json>')`` for use in a FROM clause."""
    return f"iceberg_scan('{local_path(metadata_location)}')"


def count_rows(metadata_location: str, con: duckdb.DuckDBPyConnection | None = None) -> int:
    """Rows in the table version at ``metadata_location`` (a metadata.json path), counted by DuckDB."""
    con = con or connect()
    return int(con.execute(f"SELECT count(*) FROM {scan_sql(metadata_location)}").fetchone()[0])
