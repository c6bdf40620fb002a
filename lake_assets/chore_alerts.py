"""Slack alerts of a worker run's chores (maintenance jobs, ``duplicate_free`` checks): one per failure
episode of a chore on a table (:mod:`kafka_iceberg.ops.chore_episodes`), not one per failure.

An episode's first failure posts a ``WARN`` naming the chore, the table, the run and the error; the
failures after it, in this run or a run that takes the table over, post nothing; the chore's first success
after them posts an ``OK`` with the count of failures and when the episode started.
"""

from __future__ import annotations

from datetime import datetime, timezone

from kafka_iceberg.catalog.tables import load_table
from kafka_iceberg.declaration.spec import TableSpec
from kafka_iceberg.lake_assets.vocabulary import table_alert
from kafka_iceberg.ops.alerts import Alert
from kafka_iceberg.ops.chore_episodes import ChoreEpisodes
from kafka_iceberg.ops.episodes import Episode
from kafka_iceberg.ops.rota import set_table_property


def worker_alert(spec: TableSpec, what: str, error: BaseException, run_id: str, severity: str) -> Alert:
    """The alert (``severity`` WARN or ERROR, linked to the table's asset and run ``run_id``) of a worker
    run's ``what`` that failed on ``spec``'s table: ``micro_batch``, ``duplicate_free`` or a maintenance job."""
    return table_alert(
        spec,
        measure=what,
        value=type(error).__name__,
        severity=severity,
        summary=f"{spec.identifier}: {what} failed in worker run {run_id}: {error}",
        source="worker",
        run_id=run_id,
    )


def recovered_alert(spec: TableSpec, what: str, episode: Episode, run_id: str) -> Alert:
    """The ``OK`` alert of chore ``what`` on ``spec``'s table that succeeded in worker run ``run_id`` after
    ``episode`` (its failures, since ``started_ms``)."""
    since = datetime.fromtimestamp(episode.started_ms / 1000, tz=timezone.utc)
    return table_alert(
        spec,
        measure=what,
        value="ok",
        severity="OK",
        summary=(
            f"{spec.identifier}: {what} works again in worker run {run_id} after {episode.failures} "
            f"failure(s) since {since:%Y-%m-%d %H:%M:%S} UTC"
        ),
        source="worker",
        run_id=run_id,
    )


class ChoreAlerts:
    """The chore alerts of one worker run: ``context`` (its ``run_id`` and ``log``), ``catalog`` (pyiceberg,
    where the episodes' table properties live; None: in memory only) and ``slack`` (its ``sink()`` posts;
    None: log only). Call :meth:`failed` and :meth:`ok` from the run's main thread."""

    def __init__(self, context, catalog, slack):
        self.context, self.slack = context, slack
        self.episodes = ChoreEpisodes(
            read_property=lambda identifier, key: load_table(catalog, identifier).properties.get(key),
            write_property=lambda identifier, key, value: set_table_property(catalog, identifier, key, value),
        )

    def failed(self, spec: TableSpec, what: str, error: BaseException, at_ms: int) -> bool:
        """Log chore ``what``'s failure on ``spec``'s table at ``at_ms`` (ms since epoch); post its alert when
        it opens an episode. Returns whether it posted."""
        run_id = self.context.run_id
        self.context.log.error(f"{spec.identifier}: {what} failed in worker run: {error}")
        if self.episodes.failed(spec.identifier, what, at_ms, run_id) is None:
            return False
        self._send(worker_alert(spec, what, error, run_id, "WARN"))
        return True

    def ok(self, spec: TableSpec, what: str, at_ms: int) -> bool:
        """Note chore ``what``'s success on ``spec``'s table; post the ``OK`` when it ends an episode.
        Returns whether it posted."""
        notice = self.episodes.succeeded(spec.identifier, what, at_ms, self.context.run_id)
        if notice is None:
            return False
        self._send(recovered_alert(spec, what, notice.episode, self.context.run_id))
        return True

    def _send(self, alert: Alert) -> None:
        if self.slack is not None:
            self.slack.sink().send(alert)


__all__ = ["ChoreAlerts", "recovered_alert", "worker_alert"]
