"""Slack alerts for failed asset checks, sensor errors and failed runs. Plain Python, no Dagster.

An :class:`Alert` names the table, the measure that tripped and its value, and links to the
table's asset page in the Dagster UI (and to the run page when a run is involved).
:class:`AlertSink` formats it and posts it to Slack with ``chat.postMessage``.

A check alert posts on a change of the check's status only (:func:`check_change`): once when it
starts failing, once when it passes again, with a link to the run.

Configuration: ``SLACK_BOT_TOKEN`` (unset or empty: alerts are only logged, WARNING),
``SLACK_CHANNEL``, ``SLACK_API_BASE_URL``, ``DAGSTER_UI_URL`` and ``SLACK_TIMEOUT_S`` (seconds),
read by :func:`kafka_iceberg.config.settings.slack_settings` (defaults: docs/configuration.md).

In Dagster, the ``lake_slack`` resource (:class:`kafka_iceberg.resources.slack.LakeSlackResource`: the
token as an ``EnvVar``, a base URL and a timeout) builds
the sink (:meth:`LakeSlackResource.sink`); plain-Python callers use :meth:`AlertSink.from_env`.
Both post with ``slack_sdk.WebClient`` (what dagster-slack builds on).

Delivery never raises: a Slack error (``SlackApiError``, HTTP 5xx, ``{"ok": false}``),
a network error (``URLError``) or a timeout is logged and :meth:`AlertSink.send` returns
``False``, so an alert failure cannot fail a run, an asset check or a sensor tick.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.error import URLError
from urllib.parse import quote

from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError, SlackClientError

from kafka_iceberg.config.models import DEFAULT_SLACK_API_BASE_URL as DEFAULT_API_BASE_URL
from kafka_iceberg.config.models import DEFAULT_SLACK_CHANNEL as DEFAULT_CHANNEL
from kafka_iceberg.config.models import DEFAULT_SLACK_TIMEOUT_S as DEFAULT_TIMEOUT_S
from kafka_iceberg.config.models import DEFAULT_UI_URL, SlackSettings
from kafka_iceberg.config.settings import slack_settings

log = logging.getLogger(__name__)

Severity = Literal["OK", "INFO", "WARN", "ERROR"]
_ICON = {"OK": ":white_check_mark:", "INFO": ":information_source:", "WARN": ":warning:", "ERROR": ":rotating_light:"}


def asset_url(ui_url: str, key_path: Sequence[str]) -> str:
    """Link to an asset's page in the Dagster UI.

    Args:
        ui_url: base URL of the Dagster UI, e.g. ``http://127.0.0.1:3000`` (a trailing
            slash is ignored).
        key_path: the asset key's parts, e.g. ``["lake", "nyc", "flights"]``.

    Returns:
        ``<ui_url>/assets/<parts joined by '/'>``, each part percent-encoded (key parts are
        normally ``[A-Za-z0-9_]``, which encode to themselves), e.g.
        ``http://127.0.0.1:3000/assets/lake/nyc/flights``.

    Raises:
        ValueError: ``key_path`` is empty.
    """
    if not key_path:
        raise ValueError("asset_url needs a non-empty asset key path")
    return ui_url.rstrip("/") + "/assets/" + "/".join(quote(str(p), safe="") for p in key_path)


def run_url(ui_url: str, run_id: str) -> str:
    """Link to a run's page in the Dagster UI: ``<ui_url>/runs/<run_id>``."""
    return ui_url.rstrip("/") + "/runs/" + quote(run_id, safe="")


def _escape(text: str) -> str:
    # Slack mrkdwn control characters (https://api.slack.com/reference/surfaces/formatting#escaping)
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


@dataclass(frozen=True)
class Alert:
    """One alert: what is wrong, with which table, by how much.

    Attributes:
        table: the Iceberg table identifier, e.g. ``nyc.flights`` (several, comma-separated,
            when a failed run touched several tables; the job name when it touched none).
        asset_key_path: the asset key's parts, e.g. ``["lake", "nyc", "flights"]``; the
            message links to that asset's page. Empty: no asset link.
        measure: name of the measure that tripped, e.g. ``duplicate_offsets``,
            ``snapshot_age_s``, ``run_status``.
        value: its value as display text, with units where it has them, e.g. ``3``,
            ``4210.0 s (threshold 3600 s)``, ``FAILURE``.
        severity: ``"WARN"`` or ``"ERROR"``; ``"OK"`` for a recovery (a status back to normal); ``"INFO"``
            for routine work worth a log line (callers log it rather than post it).
        summary: one or two lines of human explanation (shown as is, escaped for Slack).
        source: what raised it, e.g. ``check duplicate_free``, ``run failure``,
            ``sensor lag_sensor``; optional.
        run_id: a Dagster run id; when set the message also links to the run page.
        extra: further ``label: text`` lines shown in order (e.g. ``job``, ``error``).
    """

    table: str
    asset_key_path: list[str]
    measure: str
    value: str
    severity: Severity
    summary: str
    source: str = ""
    run_id: str | None = None
    extra: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.severity not in _ICON:
            raise ValueError(f"Alert severity must be 'OK', 'INFO', 'WARN' or 'ERROR', not {self.severity!r}")


@dataclass
class AlertSink:
    """Posts :class:`Alert` s to one Slack channel, or logs them when no token is set.

    Build it with :meth:`from_env`. ``token`` ``None`` (or empty) means "not configured":
    :meth:`send` logs the alert at WARNING and returns ``False``. ``timeout_s`` bounds each
    HTTP request in seconds.
    """

    token: str | None
    channel: str = DEFAULT_CHANNEL
    api_base_url: str = DEFAULT_API_BASE_URL
    ui_url: str = DEFAULT_UI_URL
    timeout_s: float = DEFAULT_TIMEOUT_S
    logger: logging.Logger = field(default=log, repr=False)

    @classmethod
    def from_settings(cls, slack: SlackSettings) -> AlertSink:
        """An AlertSink with the token, channel, API base URL, UI URL and timeout of ``slack``."""
        token = slack.token.get_secret_value().strip() if slack.token else ""
        return cls(
            token=token or None,
            channel=slack.channel,
            api_base_url=slack.api_base_url,
            ui_url=slack.ui_url,
            timeout_s=slack.timeout_s,
        )

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> AlertSink:
        """An AlertSink configured from ``env`` (default ``os.environ``) by
        :func:`kafka_iceberg.config.settings.slack_settings`: ``SLACK_BOT_TOKEN`` (no default),
        ``SLACK_CHANNEL``, ``SLACK_API_BASE_URL``, ``DAGSTER_UI_URL`` and ``SLACK_TIMEOUT_S``.
        Never raises: a ``SLACK_TIMEOUT_S`` that is not a positive number is logged at ERROR
        and replaced by the default, so a configuration slip cannot fail a run or a check.
        """
        return cls.from_settings(slack_settings(env))

    @property
    def configured(self) -> bool:
        """Whether a token is set, i.e. whether :meth:`send` will try to post."""
        return bool(self.token)

    def client(self) -> WebClient:
        """The ``slack_sdk.WebClient`` for this sink's token, API base URL and timeout.

        Raises:
            ValueError: no token is configured.
        """
        if not self.token:
            raise ValueError("no Slack token configured (SLACK_BOT_TOKEN)")
        base = self.api_base_url if self.api_base_url.endswith("/") else self.api_base_url + "/"
        return WebClient(token=self.token, base_url=base, timeout=self.timeout_s, logger=self.logger)

    def links(self, alert: Alert) -> list[tuple[str, str]]:
        """``(label, url)`` pairs for the alert: the asset page, then the run page, if known."""
        out = []
        if alert.asset_key_path:
            out.append(("asset " + "/".join(alert.asset_key_path), asset_url(self.ui_url, alert.asset_key_path)))
        if alert.run_id:
            out.append((f"run {alert.run_id}", run_url(self.ui_url, alert.run_id)))
        return out

    def format_text(self, alert: Alert) -> str:
        """The message text (Slack mrkdwn; also the notification fallback).

        Contains the severity, the table identifier, ``<measure> = <value>``, the summary,
        and each link as a bare URL, one per line; e.g.::

            :rotating_light: ERROR nyc.flights (check duplicate_free)
            duplicate_offsets = 3
            table nyc.flights has duplicates: 3 duplicate (partition, offset) records
            asset lake/nyc/flights: http://127.0.0.1:3000/assets/lake/nyc/flights
        """
        head = f"{_ICON[alert.severity]} {alert.severity} {_escape(alert.table)}"
        if alert.source:
            head += f" ({_escape(alert.source)})"
        lines = [head, f"{_escape(alert.measure)} = {_escape(alert.value)}"]
        if alert.summary:
            lines.append(_escape(alert.summary))
        for k, v in alert.extra.items():
            lines.append(f"{_escape(k)}: {_escape(v)}")
        for label, url in self.links(alert):
            lines.append(f"{_escape(label)}: {url}")
        return "\n".join(lines)

    def format_blocks(self, alert: Alert) -> list[dict[str, Any]]:
        """Block Kit blocks for the alert: a header section, fields, and a links context."""
        fields = [
            {"type": "mrkdwn", "text": f"*table*\n{_escape(alert.table)}"},
            {"type": "mrkdwn", "text": f"*{_escape(alert.measure)}*\n{_escape(alert.value)}"},
        ]
        title = f"{_ICON[alert.severity]} *{alert.severity}* {_escape(alert.table)}"
        if alert.source:
            title += f" ({_escape(alert.source)})"
        if alert.summary:
            title += "\n" + _escape(alert.summary)
        blocks: list[dict[str, Any]] = [
            {"type": "section", "text": {"type": "mrkdwn", "text": title[:3000]}},
            {"type": "section", "fields": fields},
        ]
        links = self.links(alert)
        if links:
            blocks.append(
                {
                    "type": "context",
                    "elements": [{"type": "mrkdwn", "text": " | ".join(f"<{u}|{_escape(lbl)}>" for lbl, u in links)}],
                }
            )
        return blocks

    def send(self, alert: Alert) -> bool:
        """Post ``alert`` to the channel; never raises on delivery problems.

        Returns:
            ``True`` when Slack answered ``ok``; ``False`` when no token is configured (the
            alert is logged at WARNING instead) or delivery failed (logged at ERROR): a
            ``SlackApiError`` (HTTP error status or ``{"ok": false, "error": …}``), a
            ``URLError`` (connection refused, DNS), a timeout after ``timeout_s`` seconds,
            or any other client error.
        """
        text = self.format_text(alert)
        if not self.token:
            self.logger.warning("Slack alert not sent (SLACK_BOT_TOKEN is not set):\n%s", text)
            return False
        try:
            self.client().chat_postMessage(channel=self.channel, text=text, blocks=self.format_blocks(alert))
            return True
        except SlackApiError as e:
            resp = e.response
            status = getattr(resp, "status_code", None)
            error = resp.get("error") if resp is not None and hasattr(resp, "get") else None
            self.logger.error("Slack alert to %s failed (HTTP %s, error %r):\n%s", self.channel, status, error, text)
        except (URLError, TimeoutError, ConnectionError, SlackClientError) as e:
            self.logger.error("Slack alert to %s failed (%s: %s):\n%s", self.channel, type(e).__name__, e, text)
        except Exception as e:  # noqa: BLE001 - an alert must never fail the caller
            self.logger.error(
                "Slack alert to %s failed unexpectedly (%s: %s):\n%s",
                self.channel,
                type(e).__name__,
                e,
                text,
                exc_info=True,
            )
        return False


# ---------------------------------------------------------------------------------------------
# Asset-check alerts (plain Python, so lake_assets can import them without importing sensors)
# ---------------------------------------------------------------------------------------------

_DUPLICATE_MEASURES = ("duplicate_offsets", "overlapping_snapshot_pairs", "duplicate_data_files")


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def pick_measure(check_name: str, figures: Mapping[str, Any]) -> tuple[str, str]:
    """The measure that made a check fail, and its value as display text.

    Args:
        check_name: ``duplicate_free`` or ``freshness`` (others: the first figure).
        figures: the :class:`kafka_iceberg.ops.checks.CheckOutcome` figures.

    Returns:
        ``(measure, value)``. ``duplicate_free``: the first non-zero of
        ``duplicate_offsets``, ``overlapping_snapshot_pairs``, ``duplicate_data_files``.
        ``freshness``: ``snapshot_age_s`` when it exceeds ``max_snapshot_age_s`` with lag,
        else ``valid_through_age_s`` when over ``max_valid_through_age_s`` (or missing while
        required), e.g. ``("snapshot_age_s", "4210.0 s (threshold 3600 s, lag 12 records)")``.
        ``quarantine``: ``blocked_by_schema`` when records were blocked by the table schema, else
        ``quarantine_rate`` with the counts, e.g. ``("quarantine_rate", "9.09% (5 of 55 records; threshold 1.00%)")``.
        No figures at all (the table does not exist): ``("table_exists", "false")``.
    """
    if not figures:
        return "table_exists", "false"
    if check_name == "duplicate_free":
        for name in _DUPLICATE_MEASURES:
            if (_num(figures.get(name)) or 0) > 0:
                return name, str(figures[name])
        return "duplicate_offsets", str(figures.get("duplicate_offsets", "unknown"))
    if check_name == "freshness":
        lag = _num(figures.get("lag_records")) or 0
        age, max_age = _num(figures.get("snapshot_age_s")), _num(figures.get("max_snapshot_age_s"))
        vt_age, max_vt = _num(figures.get("valid_through_age_s")), _num(figures.get("max_valid_through_age_s"))
        if age is None:
            return "ingest_snapshot", "none yet"
        if max_age is not None and age > max_age and lag > 0:
            return "snapshot_age_s", f"{age} s (threshold {max_age:g} s, lag {lag:g} records)"
        if max_vt is not None and vt_age is None:
            return "valid_through_age_s", f"none (threshold {max_vt:g} s)"
        if max_vt is not None and vt_age is not None and vt_age > max_vt:
            return "valid_through_age_s", f"{vt_age} s (threshold {max_vt:g} s)"
        return "snapshot_age_s", f"{age} s (lag {lag:g} records)"
    if check_name == "quarantine" and "read" in figures:
        schema = (figures.get("kinds") or {}).get("schema")
        if schema:
            return "blocked_by_schema", f"{schema} records"
        rate, limit = _num(figures.get("quarantine_rate")) or 0, _num(figures.get("max_quarantine_rate")) or 0
        return (
            "quarantine_rate",
            f"{rate:.2%} ({figures.get('quarantined')} of {figures.get('read')} records; threshold {limit:.2%})",
        )
    name = next(iter(figures))
    return name, str(figures[name])


def check_change(passed: bool, previous_passed: bool | None) -> Literal["failed", "recovered"] | None:
    """Whether an asset check's status changed, i.e. whether to alert: ``"failed"`` (passed -> failed,
    or a first evaluation, ``previous_passed`` ``None``, that failed), ``"recovered"`` (failed ->
    passed), else ``None`` (passed -> passed, failed -> failed, a first evaluation that passed)."""
    if not passed and previous_passed is not False:
        return "failed"
    if passed and previous_passed is False:
        return "recovered"
    return None


def alert_on_check(
    outcome_passed: bool,
    table_identifier: str,
    asset_key_path: Sequence[str],
    check_name: str,
    measure: str,
    value: Any,
    summary: str,
    sink: AlertSink | None = None,
    severity: Severity = "ERROR",
    previous_passed: bool | None = None,
    run_id: str | None = None,
) -> bool:
    """Post an alert when an asset check's status changed (see :func:`check_change`): once when
    it starts failing (at ``severity``), once when it passes again (``OK``); nothing while it
    stays passing or stays failing.

    Args:
        outcome_passed: the check's verdict.
        table_identifier: e.g. ``nyc.flights``.
        asset_key_path: the checked asset's key parts, e.g. ``["lake", "nyc", "flights"]``.
        check_name: e.g. ``duplicate_free``; shown as ``check <name>``.
        measure, value: what tripped and its value (``str(value)`` is shown; see
            :func:`pick_measure`).
        summary: the check's one-line summary.
        sink: where to post (default :meth:`AlertSink.from_env`).
        severity: ``"ERROR"`` (default) or ``"WARN"``, matching the check's severity.
        previous_passed: the previous completed evaluation's verdict (``None``: none or unknown,
            so a failure alerts).
        run_id: the Dagster run of this evaluation; the message links to its page.

    Returns:
        Whether a message was posted to Slack (``False`` without a change, when no token is
        set, or when delivery failed). Never raises for delivery problems.
    """
    change = check_change(outcome_passed, previous_passed)
    if change is None:
        return False
    sink = sink or AlertSink.from_env()
    return sink.send(
        Alert(
            table=table_identifier,
            asset_key_path=list(asset_key_path),
            measure=measure,
            value=str(value),
            severity=severity if change == "failed" else "OK",
            summary=summary if change == "failed" else f"check {check_name} passes again: {summary}",
            source=f"check {check_name}",
            run_id=run_id,
        )
    )


__all__ = [
    "Alert",
    "AlertSink",
    "alert_on_check",
    "asset_url",
    "check_change",
    "pick_measure",
    "run_url",
]
