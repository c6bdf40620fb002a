"""How a commit refused for a stale base is tried again: the table's ``commit.retry.*`` properties,
read as Iceberg's Java and pyiceberg commits read them, applied with tenacity."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, stop_after_delay, wait_exponential

from kafka_iceberg.batch.commit import StaleBaseError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CommitRetry:
    """How often and how long a commit refused for a stale base is tried again on a fresh load: the
    table's ``commit.retry.num-retries`` (retries after the first try), ``commit.retry.min-wait-ms``,
    ``commit.retry.max-wait-ms`` (the wait doubles from min to max) and ``commit.retry.total-timeout-ms``,
    with Iceberg's defaults, as Java's and pyiceberg's commits read them."""

    num_retries: int = 4
    min_wait_ms: int = 100
    max_wait_ms: int = 60_000
    total_timeout_ms: int = 1_800_000

    @classmethod
    def of(cls, properties: Mapping[str, str]) -> CommitRetry:
        """The policy a table's ``properties`` set (negative values count as 0)."""
        names = ("num-retries", "min-wait-ms", "max-wait-ms", "total-timeout-ms")
        given = {n: properties.get(f"commit.retry.{n}") for n in names}
        values = {n.replace("-", "_"): max(0, int(v)) for n, v in given.items() if v not in (None, "")}
        return cls(**values)

    def retrying(self, *exceptions: type[BaseException]) -> Retrying:
        """A tenacity ``Retrying`` that tries again on ``exceptions`` (default :class:`StaleBaseError`)
        within this policy, re-raising the last error when it runs out."""
        return Retrying(
            stop=stop_after_attempt(self.num_retries + 1) | stop_after_delay(self.total_timeout_ms / 1000),
            wait=wait_exponential(
                multiplier=self.min_wait_ms / 1000, min=self.min_wait_ms / 1000, max=self.max_wait_ms / 1000
            ),
            retry=retry_if_exception_type(exceptions or (StaleBaseError,)),
            before_sleep=lambda state: log.info(
                "commit refused (%s); try %d on a fresh load", state.outcome.exception(), state.attempt_number + 1
            ),
            reraise=True,
        )
