"""The ``mode`` / ``key`` / ``cdc`` part of a table declaration (docs/cdc.md). No Spark."""

from __future__ import annotations

from dataclasses import dataclass

from kafka_iceberg.errors import ConfigError

CDC_MODES = ("debezium", "none")
"""``cdc:`` values: Debezium change events, or plain keyed records with tombstones."""


@dataclass(frozen=True)
class UpsertSpec:
    """A table's upsert declaration: ``key`` (its Iceberg identifier fields) and ``cdc``
    (``debezium``: Debezium envelopes; ``none``: plain upserts keyed by the Kafka key)."""

    key: tuple[str, ...]
    cdc: str
    consistency_group: str | None = None  # the group committed together (docs/cdc.md#consistency-groups)


def upsert_spec(where: str, mode: str, key, cdc: str | None, columns, group: str | None = None) -> UpsertSpec | None:
    """Validate the ``mode``/``key``/``cdc`` fields of a declaration against its ``columns``
    (``where`` names the declaration in errors, e.g. ``table planes``).

    Returns None for ``mode: append`` (the default), else the :class:`UpsertSpec`.

    Raises:
        ConfigError: unknown mode or cdc; ``key``/``cdc`` on an append table; an upsert table
            without a key, or a key column that is not a required (NOT NULL) column; a
            ``consistency_group`` (``group``) on a table without ``cdc: debezium``.
    """
    if group and (mode, cdc) != ("upsert", "debezium"):
        raise ConfigError(f"{where}: consistency_group needs mode: upsert and cdc: debezium")
    if mode not in ("append", "upsert"):
        raise ConfigError(f"{where}: mode {mode!r} is not append or upsert")
    if mode == "append":
        if key or cdc:
            raise ConfigError(f"{where}: 'key' and 'cdc' need mode: upsert")
        return None
    if cdc not in CDC_MODES:
        raise ConfigError(f"{where}: mode upsert needs cdc: {' or '.join(CDC_MODES)} (got {cdc!r})")
    required = {c.name: c.required for c in columns}
    wrong = [k for k in key or () if not required.get(k)]
    if not key or wrong or len(set(key)) != len(key):
        raise ConfigError(
            f"{where}: mode upsert needs 'key': distinct columns that are declared required: true "
            f"(not: {wrong or list(key or ())})"
        )
    return UpsertSpec(tuple(key), cdc, group)
