"""The ``format:`` / ``key_format:`` part of a table declaration (see docs/tables.md#formats).

``json`` is schemaless JSON; ``avro``, ``protobuf`` and ``json_schema`` are the Confluent wire
format with the schemas in a Schema Registry. The registry URL may hold ``${VAR}`` references,
read from the environment when a batch runs (so ``tables.yaml`` stays free of deployment
details); undeclared, it is ``${LAKE_SCHEMA_REGISTRY_URL}``.
"""

from __future__ import annotations

from dataclasses import dataclass

from kafka_iceberg.config.settings import expand_env_references
from kafka_iceberg.declaration.columns import parse_columns
from kafka_iceberg.declaration.models import FormatDecl
from kafka_iceberg.errors import ConfigError
from kafka_iceberg.formats.resolver import subject_name

VALUE_FORMATS = ("json", "avro", "protobuf", "json_schema")
REGISTRY_FORMATS = ("avro", "protobuf", "json_schema")
"""Formats read through a Schema Registry (Confluent wire format); see docs/tables.md#formats."""
REGISTRY_URL_ENV = "LAKE_SCHEMA_REGISTRY_URL"
KEY_PARSED = "_kafka_key_parsed"
"""The struct column a ``key_format`` declaration parses the record key into (docs/tables.md#parsed-keys)."""


@dataclass(frozen=True)
class FormatSpec:
    """How values (or keys) are encoded: ``type`` (json, avro, protobuf, json_schema), the Schema
    Registry URL as declared (``${VAR}`` references are read when a batch runs, see
    :meth:`url`), the subject name strategy and, for the record-name strategies, the record name.
    ``columns`` (``key_format`` only): the declared key fields as (name, Spark SQL type, required);
    empty when the key subject's latest schema gives them."""

    type: str
    registry_url: str | None
    subject_strategy: str
    record_name: str | None
    columns: tuple[tuple[str, str, bool], ...]

    @property
    def uses_registry(self) -> bool:
        """Whether records are in the Confluent wire format with schemas in a registry."""
        return self.type in REGISTRY_FORMATS

    def url(self, env=None) -> str:
        """The registry URL with ``${VAR}`` replaced from ``env`` (default: the process environment,
        through :func:`kafka_iceberg.config.settings.expand_env_references`); ``${LAKE_SCHEMA_REGISTRY_URL}``
        when none was declared.

        Raises:
            ConfigError: a referenced variable is unset or empty.
        """

        raw = self.registry_url or "${%s}" % REGISTRY_URL_ENV
        return expand_env_references(raw, "format.registry_url", env).rstrip("/")

    def subject(self, topic: str, is_key: bool = False) -> str:
        """The subject of ``topic``'s values (keys with ``is_key``) under the strategy."""

        return subject_name(self.subject_strategy, topic, self.record_name, is_key=is_key)


def parse_format(decl, where: str, field: str) -> FormatSpec:
    """A ``format:`` / ``key_format:`` entry (a mapping, a type name, or None for json) as a :class:`FormatSpec`.

    Raises:
        ConfigError: an unknown type, or a record-name strategy without ``record_name``.
    """

    if decl is None:
        decl = FormatDecl()
    if isinstance(decl, str):
        if decl not in VALUE_FORMATS:
            raise ConfigError(f"{where}: {field} {decl!r} is not supported; supported: {VALUE_FORMATS}")
        decl = FormatDecl(type=decl)
    if decl.subject_strategy != FormatDecl.model_fields["subject_strategy"].default and not decl.record_name:
        raise ConfigError(f"{where}: {field}.subject_strategy {decl.subject_strategy} needs {field}.record_name")
    if decl.columns is not None and field != "key_format":
        raise ConfigError(f"{where}: {field}.schema is only for key_format; the value's columns are the table's schema")
    return FormatSpec(decl.type, decl.registry_url, decl.subject_strategy, decl.record_name, ())


def parse_key_format(decl, where: str) -> FormatSpec | None:
    """The ``key_format`` of table declaration ``decl`` (a ``TableDecl``), or None when undeclared.

    Raises:
        ConfigError: as :func:`parse_format`; a ``json`` key without ``schema``; a key field of an
            unsupported type; ``mode: upsert`` (its key comes from ``key:`` columns, docs/cdc.md).
    """
    if decl.key_format is None:
        return None
    fmt = parse_format(decl.key_format, where, "key_format")
    raw = decl.key_format if isinstance(decl.key_format, FormatDecl) else None
    declared = raw.columns if raw is not None else None
    if decl.mode == "upsert":
        raise ConfigError(f"{where}: key_format is not supported with mode: upsert (the key is the key: columns)")
    if fmt.type == "json" and not declared:
        raise ConfigError(f"{where}: key_format json needs key_format.schema (the key's fields)")
    cols = parse_columns(declared or (), f"{where} key_format")
    return FormatSpec(
        fmt.type,
        fmt.registry_url,
        fmt.subject_strategy,
        fmt.record_name,
        tuple((c.name, c.spark_type, c.required) for c in cols),
    )
