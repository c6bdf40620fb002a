"""The CDC table of ``make demo`` (devtools/demo/cdc.py): a clear error without PostgreSQL."""

from pathlib import Path

import pytest

from devtools.demo import cdc as cdc_demo
from devtools.services import devpostgres
from kafka_iceberg.errors import CatalogUnavailableError


def test_prepare_without_postgresql_names_the_fix(tmp_path, monkeypatch):
    monkeypatch.setattr(devpostgres, "PG_BIN", Path(tmp_path / "no-postgresql" / "bin"))
    with pytest.raises(CatalogUnavailableError, match="make system-deps"):
        cdc_demo.prepare(None, "127.0.0.1:9", tmp_path)
    assert not (tmp_path / "cdc" / "captured").exists()
