"""Where a Dagster run's wall time goes, from its event log (for the freshness benchmark).

Per run, from the timestamps of its events (seconds):

- ``queue``: RUN_ENQUEUED -> RUN_DEQUEUED, or RUN_STARTING when there is none (the run queue's
  dequeue loop and the pool);
- ``launch``: RUN_DEQUEUED -> RUN_STARTING (the launcher);
- ``python_start``: RUN_STARTING -> RUN_START (a new Python process imports the code location);
- ``spark_start``: RESOURCE_INIT_STARTED -> RESOURCE_INIT_SUCCESS (the in-process executor
  initialises the resources once per run; the SparkSession dominates it);
- per micro-batch: ``recover_s``, ``plan_s``, ``read_s``, ``write_s``, ``publish_s`` (and the
  rest of ``phase_*``) from each materialization's metadata;
- ``checks``: STEP_START -> STEP_SUCCESS/FAILURE of the asset-check steps;
- ``wall``: RUN_START -> RUN_SUCCESS/FAILURE.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from devtools.bench.common import say

_PUBLISH = ("branch_s", "publish_s", "cleanup_s", "group_commit_s")


def _first(events, kind: str, step: str | None = None):
    for e in events:
        if (
            e.dagster_event_type is not None
            and e.dagster_event_type.value == kind
            and (step is None or e.step_key == step)
        ):
            return e.timestamp
    return None


def _span(a, b) -> float | None:
    return b - a if a is not None and b is not None else None


def run_breakdown(instance, run) -> dict:
    """The figures of the module docstring for one run (None where an event is missing)."""
    events = instance.all_logs(run.run_id)
    table_step = next(
        (
            e.step_key
            for e in events
            if e.dagster_event_type is not None and e.dagster_event_type.value == "ASSET_MATERIALIZATION"
        ),
        None,
    )
    # a run the queue hands over at once has no DEQUEUED event: it goes from ENQUEUED to STARTING
    dequeued = _first(events, "PIPELINE_DEQUEUED") or _first(events, "PIPELINE_STARTING")
    out = {
        "queue": _span(_first(events, "PIPELINE_ENQUEUED"), dequeued),
        "launch": _span(dequeued, _first(events, "PIPELINE_STARTING")),
        "python_start": _span(_first(events, "PIPELINE_STARTING"), _first(events, "PIPELINE_START")),
        "spark_start": _span(_first(events, "RESOURCE_INIT_STARTED"), _first(events, "RESOURCE_INIT_SUCCESS")),
        "wall": _span(
            _first(events, "PIPELINE_START"), _first(events, "PIPELINE_SUCCESS") or _first(events, "PIPELINE_FAILURE")
        ),
        "status": run.status.value,
        "commits": 0,
        "batches": [],
    }
    checks = 0.0
    for e in events:
        kind = e.dagster_event_type.value if e.dagster_event_type is not None else ""
        if kind == "ASSET_MATERIALIZATION":
            md = e.dagster_event.event_specific_data.materialization.metadata
            out["batches"].append({k[len("phase_") :]: v.value for k, v in md.items() if k.startswith("phase_")})
            out["commits"] += 1
        elif kind == "STEP_START" and e.step_key and e.step_key != table_step:
            end = _first([x for x in events if x.timestamp >= e.timestamp], "STEP_SUCCESS", e.step_key) or _first(
                [x for x in events if x.timestamp >= e.timestamp], "STEP_FAILURE", e.step_key
            )
            checks += (end - e.timestamp) if end else 0.0
    out["checks"] = checks
    return out


def _med(values) -> str:
    values = [v for v in values if v is not None]
    return f"{statistics.median(values):6.2f}" if values else "     -"


def print_runs(home: Path) -> list[dict]:
    """Print one line per run and the medians of :func:`run_breakdown`; returns the breakdowns."""
    from dagster import DagsterInstance

    instance = DagsterInstance.from_config(str(home))
    runs = sorted(instance.get_runs(), key=lambda r: r.run_id)
    rows = [run_breakdown(instance, r) for r in runs]
    rows.sort(key=lambda r: r["wall"] or 0)
    batches = [b for r in rows for b in r["batches"]]
    say(
        f"runs launched: {len(rows)} ({sum(1 for r in rows if r['status'] == 'SUCCESS')} succeeded), "
        f"micro-batches committed: {len(batches)} ({len(batches) / max(1, len(rows)):.1f} per run)"
    )
    say("per run (median s):   queue  launch  python_start  spark_start  checks   wall")
    say(
        f"                      {_med(r['queue'] for r in rows)}  {_med(r['launch'] for r in rows)}  "
        f"{_med(r['python_start'] for r in rows)}        {_med(r['spark_start'] for r in rows)}       "
        f"{_med(r['checks'] for r in rows)}  {_med(r['wall'] for r in rows)}"
    )
    say("per micro-batch (median s): recover  plan   read   write  publish(branch+ff+cleanup+group)")
    say(
        f"                            {_med(b.get('recover_s') for b in batches)}  {_med(b.get('plan_s') for b in batches)} "
        f"{_med(b.get('read_s') for b in batches)} {_med(b.get('write_s') for b in batches)}  "
        f"{_med(sum(b.get(k, 0.0) for k in _PUBLISH) for b in batches)}"
    )
    instance.dispose()
    return rows


__all__ = ["print_runs", "run_breakdown"]
