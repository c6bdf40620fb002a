"""Slack as a Dagster resource, through dagster-slack.

:class:`LakeSlackResource` subclasses ``dagster_slack.SlackResource`` (whose only field is the
token, and whose client always talks to ``https://slack.com/api/``) with the Web API base
URL, a timeout, the channel and the Dagster UI base for links, so the recording HTTP server
of the tests (and a proxy, in production) can stand in for Slack. The token is an ``EnvVar``:
the Resources page of the UI shows the variable's name, never its value.

The sensors and asset checks take it as the ``lake_slack`` resource (ResourceKeys) and post through
:meth:`LakeSlackResource.sink` (a :class:`kafka_iceberg.ops.alerts.AlertSink`, which never raises).
"""

from dagster import EnvVar
from dagster_slack import SlackResource
from pydantic import Field
from slack_sdk import WebClient

from kafka_iceberg.config.models import SlackSettings
from kafka_iceberg.config.settings import slack_settings
from kafka_iceberg.ops.alerts import DEFAULT_API_BASE_URL, DEFAULT_CHANNEL, DEFAULT_TIMEOUT_S, DEFAULT_UI_URL, AlertSink


class LakeSlackResource(SlackResource):
    """dagster-slack's ``SlackResource`` plus ``base_url`` (Slack Web API base), ``timeout_s``
    (seconds per HTTP request), ``channel`` and ``ui_url`` (base of asset and run links).

    ``token`` may be empty: alerts are then only logged (WARNING), as without ``SLACK_BOT_TOKEN``.
    """

    token: str | None = Field(None, description="Slack bot token (xoxb-…); set it with EnvVar('SLACK_BOT_TOKEN').")
    base_url: str = Field(DEFAULT_API_BASE_URL, description="Slack Web API base URL (SLACK_API_BASE_URL).")
    timeout_s: float = Field(
        DEFAULT_TIMEOUT_S, gt=0, description="Seconds one HTTP request may take (SLACK_TIMEOUT_S)."
    )
    channel: str = Field(DEFAULT_CHANNEL, description="Channel name or id alerts go to (SLACK_CHANNEL).")
    ui_url: str = Field(DEFAULT_UI_URL, description="Base URL of the Dagster UI for links (DAGSTER_UI_URL).")

    @classmethod
    def _is_dagster_maintained(cls) -> bool:
        return False

    def get_client(self) -> WebClient:
        """A ``slack_sdk.WebClient`` with this resource's token, base URL and timeout.

        Raises:
            ValueError: no token is set.
        """
        return self.sink().client()

    def sink(self) -> AlertSink:
        """The :class:`~kafka_iceberg.ops.alerts.AlertSink` that formats and posts alerts with this resource's settings."""
        return AlertSink(
            token=self.token or None,
            channel=self.channel,
            api_base_url=self.base_url,
            ui_url=self.ui_url,
            timeout_s=self.timeout_s,
        )

    @classmethod
    def from_settings(cls, slack: SlackSettings) -> "LakeSlackResource":
        """The resource configured from ``slack`` (:attr:`kafka_iceberg.config.settings.Settings.slack`), with
        the token as ``EnvVar("SLACK_BOT_TOKEN")`` (no token when the variable is unset or empty)."""
        return cls(
            token=EnvVar("SLACK_BOT_TOKEN") if AlertSink.from_settings(slack).configured else None,
            base_url=slack.api_base_url,
            timeout_s=slack.timeout_s,
            channel=slack.channel,
            ui_url=slack.ui_url,
        )

    @classmethod
    def from_env(cls, env: dict | None = None) -> "LakeSlackResource":
        """:meth:`from_settings` on :func:`kafka_iceberg.config.settings.slack_settings` of ``env`` (default: the process's)."""
        return cls.from_settings(slack_settings(env))


__all__ = ["LakeSlackResource"]
