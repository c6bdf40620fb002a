"""The CDC table of ``make demo`` (devtools/cdc_demo.py): a clear error without PostgreSQL."""

from pathlib import Path

import pytest

from devtools import cdc_demo, devpostgres
from kafka_iceberg.errors import CatalogUnavailableError


def test_prepare_without_postgresql_names_the_fix(tmp_path, monkeypatch):
    monkeypatch.setattr(devpostgres, "PG_BIN", Path(tmp_path / "no-postgresql" / "bin"))
    with pytest.raises(CatalogUnavailableError, match="make system-deps"):
        cdc_demo.prepare(None, "127.0.0.1:9", tmp_path)
    assert not (tmp_path / "cdc" / "captured").exists()
