"""The snapshot ceiling of a sensor-launched streaming run's table (``maintenance.max_snapshots``,
docs/tables.md#streaming-tables-and-their-snapshots).

A streaming run (:mod:`kafka_iceberg.lake_assets.streaming`) commits up to a few times a second, and
every snapshot stays in ``metadata.json`` until expired. The commit that takes the table past its
ceiling starts :class:`StreamExpiry`'s expiry by count of the earlier runs' snapshots in a background
thread (one at a time, on the run's Spark session), and the run goes on committing: Iceberg's
``expire_snapshots`` reads every manifest list of the table (seconds to tens of seconds at 1,000
snapshots) and retries its commit when a micro-batch's lands first. It keeps the snapshots this run's
``duplicate_free`` check reads at the end of the run (and :data:`~kafka_iceberg.ops.maintenance.CONCURRENT_COMMITS` more, for the
commits that land while it reads), and the ingest state. Its ``AssetObservation`` is logged after the
next commit, or when the run's loop ends, which waits for it.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor

from dagster import AssetObservation

from kafka_iceberg.catalog.tables import load_table, metadata_view
from kafka_iceberg.declaration.spec import TableSpec
from kafka_iceberg.ops.incremental_check import snapshots_to_keep
from kafka_iceberg.ops.maintenance import CONCURRENT_COMMITS, snapshots_to_keep_state
from kafka_iceberg.ops.rota import run_job


class StreamExpiry:
    """The expiry by count of ``spec``'s table for one streaming run (``context``: its step context;
    ``spark``: its session, with the Iceberg catalog ``catalog_name``; ``pycatalog``: the pyiceberg
    catalog). Call it after each commit with ``BatchResult.snapshots``, and :meth:`close` when the run's
    loop ends."""

    def __init__(self, context, spark, catalog_name: str, pycatalog, spec: TableSpec):
        self.context, self.spark, self.catalog_name = context, spark, catalog_name
        self.pycatalog, self.spec = pycatalog, spec
        self.running: Future | None = None
        self.not_worth_it = False  # the run's own snapshots alone keep the table past its ceiling
        self._thread: ThreadPoolExecutor | None = None

    def __call__(self, snapshots: int | None) -> bool:
        """After a commit that planned on ``snapshots`` snapshots (every ref's; None: unknown): log the
        last expiry if it ended, and start one if the commit took the table past its ceiling and none
        runs. Returns whether it started one. Never raises."""
        self.collect()
        if self.running is not None or self.not_worth_it or not self.spec.maintenance.past_max_snapshots(snapshots):
            return False
        if self._thread is None:
            self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lake-expiry")
        self.running = self._thread.submit(self.expire)
        return True

    def expire(self):
        """Expire the table's snapshots by count, keeping what this run's check reads, the ingest state
        and ``retain_last``. Returns (the snapshots before, the ``MaintenanceResult``), or None when that
        would expire fewer than half of the snapshots between ``retain_last`` and the ceiling (once the
        run's own snapshots alone keep it there, later commits of the run skip it without reading the
        table). Raises what the catalog and Spark raise."""
        policy = self.spec.maintenance
        view = metadata_view(load_table(self.pycatalog, self.spec.identifier))
        keep = snapshots_to_keep(view, self.context.run_id) + CONCURRENT_COMMITS
        kept = max(keep, policy.retain_last, snapshots_to_keep_state(view))
        if len(view.snapshots) - kept < (policy.max_snapshots - policy.retain_last) // 2:
            self.not_worth_it = keep >= kept
            return None
        result = run_job(
            self.spark, self.catalog_name, self.spec, "expire_snapshots", lambda: view, keep=lambda _: keep
        )
        return len(view.snapshots), result

    def collect(self, wait: bool = False) -> None:
        """Log the expiry that ended (``wait``: wait for a running one) as an ``AssetObservation`` of the
        run's asset; a failed one is logged as a warning (the next commit past the ceiling tries again)."""
        if self.running is None or not (wait or self.running.done()):
            return
        future, self.running = self.running, None
        try:
            outcome = future.result()
        except Exception as exc:  # noqa: BLE001 - maintenance must not fail committed micro-batches
            self.context.log.warning(f"{self.spec.identifier}: expiring snapshots past max_snapshots failed: {exc}")
            return
        if outcome is not None:
            before, result = outcome
            self.context.log.info(f"{self.spec.identifier}: {before} snapshots, past max_snapshots: {result.output}")
            self.context.log_event(AssetObservation(asset_key=self.context.asset_key, metadata=result.as_metadata()))

    def close(self) -> None:
        """Wait for a running expiry, log it, and stop the thread."""
        self.collect(wait=True)
        if self._thread is not None:
            self._thread.shutdown(wait=True)


__all__ = ["StreamExpiry"]
