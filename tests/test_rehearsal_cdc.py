"""The CDC rehearsal scenario's fast subset (``make rehearse`` runs ``cdc_kills`` full size): real
Debezium capturing a real PostgreSQL under a continuous SQL workload while the upsert sink is
SIGKILLed 3 times; after the catch-up the Iceberg table equals the PostgreSQL table, EXCEPT ALL
both ways (see :mod:`devtools.rehearsal_cdc`)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from devtools import devbroker
from devtools.rehearsal import Lake, Rehearsal, _load_scenarios, format_table
from devtools.rehearsal_cdc import cdc_kills

pytestmark = [pytest.mark.rehearsal, pytest.mark.cdc]


@pytest.fixture(scope="module")
def rehearsal():
    home = Path(tempfile.mkdtemp(prefix="lake-rehearsal-cdc-"))
    bootstrap = devbroker.start(home / "kafka", devbroker.free_port())
    yield Rehearsal(Lake(home, home / "kafka", bootstrap), seed=11)
    devbroker.stop(home / "kafka")
    shutil.rmtree(home, ignore_errors=True)


def test_cdc_kills_table_equals_postgres(rehearsal):
    assert "cdc_kills" in _load_scenarios()
    result = cdc_kills(rehearsal, n=3, planes=300)
    print("\n" + format_table([result]))
    assert result.faults == 3 and result.tally.produced > 300
    assert result.tally.in_table > 200 and result.tally.quarantined == 0
    assert (result.tally.lost, result.tally.unexpected, result.tally.duplicates) == (0, 0, 0), result.tally
    assert all(result.checks.values()), {k: v for k, v in result.checks.items() if not v}
