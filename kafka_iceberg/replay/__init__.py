"""Replay a table's Kafka offset range into a new table or an Iceberg branch, and validate it.

Plain Python (no Dagster); the CLI (``python -m kafka_iceberg.lake_assets.cli replay``) and the Dagster
job ``replay`` (``lake_assets/replay.py``) both call :func:`run_replay`.

A replay reads, per partition, the half-open offset range ``[start, end)`` of the original
table's topic again and writes it, in bounded micro-batches, to one of two targets:

* **a new table** (``into``): same schema and partitioning as the original, its own
  identifier, a consumer group that is never committed. Each micro-batch goes through
  the write path's phases (:func:`kafka_iceberg.batch.pipeline.run_batch`) with a range plan,
  so the replay is exactly-once and crash-recoverable like ingestion: the target's
  committed offsets live in its own snapshot summaries, and a rerun of the same replay
  continues from them.
* **a branch of the original** (``branch``): the branch ``replay_<name>`` is created at an
  existing snapshot S of ``main``'s ancestry (``from_snapshot``); S's committed offsets are the
  start, and the range is appended on the branch, so the branch is the table rebuilt from S.
  Each micro-batch uses the write path's attempt protocol (an ``ingest_<ms>_<commit id>``
  attempt branch, then ``fast_forward`` of the replay branch), so ingestion's recovery treats
  a crashed replay attempt like any other dead attempt, and never touches ``replay_*`` branches.

Every replay snapshot carries ``kafka.replay-of`` (:data:`KEY_REPLAY_OF`) in its summary:
JSON ``{"original", "topic", "from_snapshot", "start", "end"}`` (offsets per partition). A
target that holds another replay, or data that is not a replay, is refused; a target that
holds the same replay is resumed.

:func:`validate_replay` compares the original with the replay over the same
``(partition, offset)`` range with Spark (counts per partition, ``EXCEPT ALL`` both ways).

Units: offsets are Kafka offsets (the half-open ``[start, end)`` convention of
``kafka.batch``), record counts are records, timestamps are ms since epoch.

The package: :mod:`.request` (the request and its parsing), :mod:`.range` (the offsets),
:mod:`.run` (running it through the write path's phases), :mod:`.validate` (the comparison).
"""

from kafka_iceberg.replay.range import ReplayRange, replay_params, replay_table_spec, resolve_range
from kafka_iceberg.replay.request import (
    REPLAY_BRANCH_PREFIX,
    ReplayDataLossError,
    ReplayError,
    ReplayRequest,
    parse_offsets,
    parse_time_ms,
    replay_branch_name,
)
from kafka_iceberg.replay.run import ReplayResult, default_target, run_replay
from kafka_iceberg.replay.validate import (
    PartitionComparison,
    ReplayMismatchError,
    TableVersion,
    ValidationReport,
    validate_replay,
)
from kafka_iceberg.state import KEY_REPLAY_OF, recorded_replay

__all__ = [
    "KEY_REPLAY_OF",
    "REPLAY_BRANCH_PREFIX",
    "PartitionComparison",
    "ReplayDataLossError",
    "ReplayError",
    "ReplayMismatchError",
    "ReplayRange",
    "ReplayRequest",
    "ReplayResult",
    "TableVersion",
    "ValidationReport",
    "default_target",
    "parse_offsets",
    "parse_time_ms",
    "recorded_replay",
    "replay_branch_name",
    "replay_params",
    "replay_table_spec",
    "resolve_range",
    "run_replay",
    "validate_replay",
]
