"""The ``run_liveness`` sensor: every 30 s, runs of this host whose worker process died are marked
failed and their concurrency-pool slots freed, and so are the slots of runs that already ended
(:func:`kafka_iceberg.lake_assets.liveness.reap_dead_runs`). Every run also checks when it starts and while it
waits; this sensor covers the time when no run of the table is executing (so the lag sensor does
not see a dead run as in progress). Runs on other hosts: Dagster's run monitoring (dagster.yaml).
"""

from dagster import DefaultSensorStatus, SensorEvaluationContext, SkipReason, sensor

from kafka_iceberg.lake_assets.liveness import reap_dead_runs


@sensor(
    name="run_liveness",
    minimum_interval_seconds=30,
    default_status=DefaultSensorStatus.RUNNING,
    description="Marks failed the runs whose worker process died on this host and frees their pool slots.",
)
def run_liveness_sensor(context: SensorEvaluationContext):
    reaped = reap_dead_runs(context.instance)
    if reaped:
        context.log.warning(f"dead or ended runs reaped (marked failed / pool slots freed): {', '.join(reaped)}")
    return SkipReason(f"reaped {len(reaped)} run(s)" if reaped else "every in-progress run of this host is alive")


__all__ = ["run_liveness_sensor"]
