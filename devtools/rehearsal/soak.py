"""Rehearsal scenario ``soak``: a short soak (:mod:`devtools.bench.soak`) of 10 tables through the default
deployment (dagster-daemon, the ``lake_workers`` sensor, worker runs) for 6 minutes at 40 records/s in all,
sampled every minute.

Six minutes cannot tell a slow leak from noise (``make soak`` runs two hours for that: its slopes are printed
here as notes); the scenario checks what a short run can: every record exactly once; the snapshots of every
table under ``maintenance.max_snapshots`` plus the commits of one round of the worker's chore thread (a
table past its ceiling is checked, then expired, one table at a time: :data:`CHORE_ROUND_COMMITS`) and the
commits that race an expiry; its metadata files under ``write.metadata.previous-versions-max`` + 1 (plus
the same race); the catalog's ``iceberg_tables`` rows unchanged over the load; and at most
:data:`~devtools.bench.soak.EVENTS_GOAL` Dagster events per table per hour over the second half.
Registered in :data:`devtools.rehearsal.run.SCENARIO_MODULES` (``make rehearse REHEARSE_ARGS="--only soak"``).
"""

from __future__ import annotations

import argparse
import time

from devtools.rehearsal.run import Rehearsal, ScenarioResult, Tally
from kafka_iceberg.ops.maintenance import CONCURRENT_COMMITS

TABLES, MINUTES, SAMPLE_S, RATE, MAX_SNAPSHOTS = 10, 6.0, 60.0, 40, 30
METADATA_FILES = 51  # write.metadata.previous-versions-max (50, kafka_iceberg/catalog/tables.py) + the current one
CHORE_ROUND_COMMITS = TABLES * 8
"""A table's commits while the chore thread goes once round the tables past their ceiling: a check and an
expiry take about 6 s per table here (of a 30-snapshot table, on 2 cores), and a table commits about once a
second (at 92 snapshots at most per table on a61f091, where the bound was max_snapshots + 12)."""


def soak(r: Rehearsal) -> ScenarioResult:
    """The short soak in ``<rehearsal home>/soak`` (module docstring)."""
    from devtools.bench.soak import EVENTS_GOAL, run_soak

    t0 = time.monotonic()
    args = argparse.Namespace(minutes=MINUTES, sample_s=SAMPLE_S, tables=TABLES, rate=RATE, max_snapshots=MAX_SNAPSHOTS)
    summary = run_soak(args, r.lake.home / "soak")
    samples, tallies = summary["samples"], summary["tallies"].values()
    margin = CONCURRENT_COMMITS + 2  # commits of the worker that land while an expiry runs
    checks = {
        "every record exactly once": summary["exact"] == TABLES,
        f"snapshots per table <= {MAX_SNAPSHOTS} + {CHORE_ROUND_COMMITS} + {margin}": max(
            s["snapshots_max"] for s in samples
        )
        <= MAX_SNAPSHOTS + CHORE_ROUND_COMMITS + margin,
        f"metadata files per table <= {METADATA_FILES} + {margin}": max(s["metadata_files_max"] for s in samples)
        <= METADATA_FILES + margin,
        "catalog rows unchanged under load": len({s["catalog_rows"] for s in samples}) == 1,
        f"Dagster events per table per hour <= {EVENTS_GOAL}": summary["events_per_table_h"] <= EVENTS_GOAL,
    }
    tally = Tally(
        produced=sum(p for _, _, p in tallies),
        in_table=sum(d for _, d, _ in tallies),
        quarantined=0,
        lost=sum(max(0, p - d) for _, d, p in tallies),
        duplicates=sum(t - d for t, d, _ in tallies),
        mismatched=0,
        unexpected=sum(max(0, d - p) for _, d, p in tallies),
    )
    slopes = ", ".join(f"{c['figure']} {c['slope_h']:+.1f}/h {c['verdict']}" for c in summary["checks"])
    notes = f"{TABLES} tables, {MINUTES:g} min, {len(samples)} samples; second-half slopes (not checked): {slopes}"
    return ScenarioResult("Soak (short)", 0, tally, checks, notes, time.monotonic() - t0)


def register(scenarios: dict) -> None:
    """Add this module's scenarios to the rehearsal's registry."""
    scenarios["soak"] = lambda r, args: soak(r)


__all__ = ["register", "soak"]
