"""What every ``lake`` subcommand shares: exit codes, error lines, the error log, ``--json``
output, ``--version`` and confirmations (the commands themselves are in
:mod:`kafka_iceberg.lake_assets.cli`)."""

from __future__ import annotations

import json
import logging
import sys
import tempfile
import time
import traceback
from importlib import metadata
from pathlib import Path

from kafka_iceberg.config.settings import load_settings
from kafka_iceberg.errors import (
    BrokerUnavailableError,
    CatalogUnavailableError,
    ConfigError,
    DataLossError,
    LakeError,
    OffsetsAheadError,
    TopicNotFoundError,
)

DISTRIBUTION = "kafka-iceberg-lake"
OK, FINDING, BAD_INPUT, UNREACHABLE, INTERRUPTED = 0, 1, 2, 3, 130
BAD_INPUT_ERRORS: tuple[type[BaseException], ...] = (ConfigError, DataLossError, OffsetsAheadError, TopicNotFoundError)
UNREACHABLE_NAMES = frozenset({"RegistryUnavailableError"})
"""Unreachable-component errors matched by name: importing their module would load the formats package."""


def version() -> str:
    """The installed version of :data:`DISTRIBUTION` (``unknown`` when it is not installed)."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "unknown"


def is_unreachable(exc: BaseException | None) -> bool:
    """True when ``exc`` or an error it was raised from means a component did not answer: the
    broker, the catalog or the schema registry (their ``*UnavailableError``, or a connection
    error or timeout from a client library)."""
    while exc is not None:
        if isinstance(exc, (BrokerUnavailableError, CatalogUnavailableError, ConnectionError, TimeoutError)):
            return True
        if type(exc).__name__ in UNREACHABLE_NAMES:
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def exit_code_for(exc: BaseException) -> int:
    """3 for an unreachable component, 2 for bad input, 1 for anything unexpected."""
    if is_unreachable(exc):
        return UNREACHABLE
    if isinstance(exc, (*BAD_INPUT_ERRORS, LakeError)):
        return BAD_INPUT
    return FINDING


def error_log_dir() -> Path:
    """``$LAKE_HOME/logs``, or the system's temporary directory when the settings do not load."""
    try:
        return load_settings().lake_home / "logs"
    except Exception:  # noqa: BLE001 - the settings may be what failed
        return Path(tempfile.gettempdir())


def write_error_log(exc: BaseException) -> Path | None:
    """Write ``exc``'s traceback to a new ``lake-error-<ms>.log``; returns its path (None if unwritable)."""
    text = "".join(traceback.format_exception(exc))
    for directory in (error_log_dir(), Path(tempfile.gettempdir())):
        try:
            directory.mkdir(parents=True, exist_ok=True)
            path = directory / f"lake-error-{int(time.time() * 1000)}.log"
            path.write_text(f"lake {' '.join(sys.argv[1:])}\n{text}")
            return path
        except OSError:
            continue
    return None


def fail(exc: BaseException, code: int, as_json: bool = False, debug: bool = False) -> int:
    """Print ``exc`` as one line on stderr (``lake: <kind>: <message>``) and return ``code``.

    An unexpected error (code 1) also writes its traceback to a log file named on the line;
    ``debug`` (``lake --debug``) prints every traceback. With ``as_json``, stdout gets
    ``{"error": <kind>, "message": ..., "exit_code": code[, "log": path]}`` too.
    """
    if debug:
        traceback.print_exception(exc)
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    kind = {UNREACHABLE: "unreachable", BAD_INPUT: "bad input", INTERRUPTED: "interrupted"}.get(code, "error")
    log = write_error_log(exc) if code == FINDING else None
    if log is not None:
        first = f"{type(exc).__name__}: {first} (traceback in {log})"
    print(f"lake: {kind}: {first}", file=sys.stderr)
    if as_json:
        emit({"error": kind, "message": first, "exit_code": code, **({"log": str(log)} if log else {})})
    return code


def log_warnings_as_lines() -> None:
    """Print the product's warnings (``kafka_iceberg`` loggers, such as a catalog retry) on stderr
    as ``lake: warning: <message>`` lines, so the last stderr line is still the command's outcome."""
    product = logging.getLogger("kafka_iceberg")
    if not any(isinstance(h, _StderrLines) for h in product.handlers):
        product.addHandler(_StderrLines(logging.WARNING))


class _StderrLines(logging.Handler):
    """Writes ``lake: warning: <message>`` to the ``sys.stderr`` of the moment (tests swap it)."""

    def emit(self, record: logging.LogRecord) -> None:
        print(f"lake: warning: {record.getMessage()}", file=sys.stderr)


def emit(payload: dict) -> None:
    """One JSON line on stdout."""
    print(json.dumps(payload, default=str), flush=True)


def confirm(question: str, assume_yes: bool) -> bool:
    """Ask ``question`` on the terminal (``[y/N]``); ``assume_yes`` answers yes without asking.

    Raises:
        ConfigError: no terminal to ask on (stdin is not a TTY) and not ``assume_yes``.
    """
    if assume_yes:
        return True
    if not sys.stdin.isatty():
        raise ConfigError("confirmation needed and stdin is not a terminal: pass --yes to confirm")
    answer = input(f"{question} [y/N] ")
    return answer.strip().lower() in ("y", "yes")
