"""Tables from topic patterns: a ``tables:`` entry with ``topic_pattern:`` becomes one table per
matching topic. Plain Python: no Kafka client, no Dagster.

The topic names come from the caller (the code location lists them with
:meth:`kafka_iceberg.kafka.admin.KafkaMetadata.list_topics` when it loads), so the set of tables
changes only when the declarations are loaded again (a reload of the code location), never during
a run. Each matching topic gets a plain table declaration (a dict shaped like a ``tables:`` entry
with its own ``topic``, ``name`` and ``identifier``), validated like any other by
:mod:`kafka_iceberg.declaration.spec`.

Template fields of ``name``, ``identifier`` and ``description`` (Python ``{field}`` syntax):

* every named group of ``topic_pattern`` (``(?P<schema>[^.]+)`` gives ``{schema}``), lowercased,
  with every character other than ``a-z``, ``0-9`` and ``_`` replaced by ``_``;
* ``{topic_table}``: the whole topic name treated the same way (``shop.public.Orders-v2`` ->
  ``shop_public_orders_v2``);
* ``{topic}``: the topic name as it is (for ``description``).

A rendered name, or part of an identifier, that would start with a digit gets a leading ``_``. Topics named by :data:`INTERNAL_TOPICS`
or by the entry's ``exclude:`` never match; nor does a topic that another entry declares with its
own ``topic:`` (that declaration wins).
"""

from __future__ import annotations

import logging
import re
import string
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from kafka_iceberg.declaration.models import IDENTIFIER, TablePatternDecl, describe
from kafka_iceberg.errors import ConfigError

log = logging.getLogger(__name__)

INTERNAL_TOPICS = (
    r"_.*",  # __consumer_offsets, __transaction_state, _schemas, __debezium-heartbeat.<prefix>
    r"(.+[._-])?(schema[-_]?history|schema[-_]?changes|db[-_]?history)([._-].+)?",  # Debezium schema history
    r"(.+[._-])?debezium[-_]heartbeat([._-].+)?",  # Debezium heartbeats under a custom prefix
    r"[^.]+\.transaction",  # Debezium's transaction metadata topic, <topic.prefix>.transaction
    r"(.+[._-])?connect[-_](configs|offsets|status)",  # Kafka Connect's own topics
)
"""Topics no pattern matches (each a regular expression over the whole topic name)."""

_FIXED_FIELDS = ("topic", "topic_table")
_TEMPLATED = ("name", "identifier", "description")


def identifier_part(value: str) -> str:
    """``value`` lowercased, every character other than ``a-z``, ``0-9``, ``_`` replaced by ``_``
    (``Orders-v2`` -> ``orders_v2``)."""
    return re.sub(r"[^a-z0-9_]", "_", value.lower())


def _no_leading_digit(rendered: str) -> str:
    """``rendered`` with ``_`` before each dot-separated part that starts with a digit."""
    return ".".join(f"_{p}" if p[:1].isdigit() else p for p in rendered.split("."))


def is_pattern(raw: Any) -> bool:
    """True for a ``tables:`` entry that declares ``topic_pattern:``."""
    return isinstance(raw, dict) and "topic_pattern" in raw


@dataclass(frozen=True)
class TopicPattern:
    """A validated ``topic_pattern:`` entry. ``raw``: the entry as declared (templates unrendered)."""

    raw: dict[str, Any]
    regex: re.Pattern
    exclude: tuple[re.Pattern, ...]

    @property
    def where(self) -> str:
        """How errors and logs name the entry: ``table pattern '<topic_pattern>'``."""
        return f"table pattern {self.regex.pattern!r}"

    def matches(self, topic: str) -> bool:
        """True when the whole ``topic`` matches and no exclusion does."""
        return bool(self.regex.fullmatch(topic)) and not any(x.fullmatch(topic) for x in self.exclude)

    def fields(self, topic: str) -> dict[str, str]:
        """The template fields of a matching ``topic`` (see the module docstring)."""
        m = self.regex.fullmatch(topic)
        groups = {k: identifier_part(v or "") for k, v in (m.groupdict() if m else {}).items()}
        return {**groups, "topic": topic, "topic_table": identifier_part(topic)}

    def table(self, topic: str) -> tuple[dict[str, Any], dict[str, Any]]:
        """The declaration of a matching ``topic`` as (own fields, base): ``topic`` and the rendered
        ``name``, ``identifier`` and ``description``, over the entry's other fields (merged over the
        file's defaults) as the base. Crons in the base are spread, never pinned (:mod:`kafka_iceberg.schedules.spread`)."""
        fields = self.fields(topic)
        base = {k: v for k, v in self.raw.items() if k not in ("topic_pattern", "exclude", *_TEMPLATED)}
        own = {k: self.raw[k].format_map(fields) for k in _TEMPLATED if isinstance(self.raw.get(k), str)}
        own["name"], own["identifier"] = _no_leading_digit(own["name"]), _no_leading_digit(own["identifier"])
        own["topic"] = topic
        own.setdefault("description", f"Topic {topic}, from topic pattern {self.regex.pattern!r}.")
        return own, base


def _compile(expr: str, where: str, what: str) -> re.Pattern:
    try:
        return re.compile(expr)
    except re.error as exc:
        raise ConfigError(f"{where}: {what} {expr!r} is not a regular expression: {exc}") from None


def _check_templates(pattern: TopicPattern) -> None:
    """Every template field is known, and a sample rendering gives a valid name and identifier."""
    known = set(pattern.regex.groupindex) | set(_FIXED_FIELDS)
    for key in _TEMPLATED:
        template = pattern.raw.get(key)
        if not isinstance(template, str):
            continue
        try:
            used = {f for _, f, _, _ in string.Formatter().parse(template) if f is not None}
        except ValueError as exc:
            raise ConfigError(f"{pattern.where}: {key} template {template!r}: {exc}") from None
        unknown = sorted(used - known)
        if unknown:
            raise ConfigError(
                f"{pattern.where}: {key} template {template!r} uses unknown fields {unknown}; "
                f"known: {sorted(known)} (the pattern's named groups, topic, topic_table)"
            )
    sample = {k: "x" for k in known}
    name, identifier = pattern.raw["name"].format_map(sample), pattern.raw["identifier"].format_map(sample)
    parts = identifier.split(".")
    if not IDENTIFIER.match(name) or len(parts) < 2 or not all(IDENTIFIER.match(p) for p in parts):
        raise ConfigError(
            f"{pattern.where}: name {pattern.raw['name']!r} must render a lower_snake_case name and identifier "
            f"{pattern.raw['identifier']!r} a namespace.table (a template may add only letters, digits, _ and .)"
        )


def parse_pattern(raw: dict[str, Any], defaults: dict[str, Any]) -> TopicPattern:
    """Validate a ``topic_pattern:`` entry merged over ``defaults`` (``tags`` merge).

    Raises:
        ConfigError: naming the pattern and the field at fault: an invalid regular expression, a
            template field that is neither a named group nor ``topic``/``topic_table``, a template
            that cannot render a valid name or identifier, or any field the models refuse.
    """
    where = f"table pattern {raw.get('topic_pattern')!r}"
    merged = {**defaults, **raw}
    if isinstance(defaults.get("tags"), dict) and isinstance(raw.get("tags"), dict):
        merged["tags"] = {**defaults["tags"], **raw["tags"]}
    try:
        decl = TablePatternDecl.model_validate(merged)
    except ValidationError as exc:
        raise ConfigError(describe(exc, merged, where)) from None
    exclude = [*INTERNAL_TOPICS, *(decl.exclude or ())]
    pattern = TopicPattern(
        merged,
        _compile(decl.topic_pattern, where, "topic_pattern"),
        tuple(_compile(x, where, "exclude entry") for x in exclude),
    )
    _check_templates(pattern)
    return pattern


def _claim(owners: dict[str, str], key: str, value: str, who: str) -> None:
    if value in owners and owners[value] != who:
        raise ConfigError(f"{key} {value!r} is declared twice: by {owners[value]} and by {who}")
    owners[value] = who


def expand_entries(
    entries: list[Any], defaults: dict[str, Any], list_topics: Callable[[], Iterable[str] | None] | None
) -> list[tuple[Any, dict[str, Any]]]:
    """The ``tables:`` entries as (declaration, defaults it is merged over) pairs: a plain entry with
    the file's ``defaults``, and in place of each ``topic_pattern:`` entry one pair per matching topic
    (in topic-name order; :meth:`TopicPattern.table`). ``list_topics``
    is called once, only when a pattern is declared; when it is None or returns None (the topics
    are unknown, e.g. the broker is down) patterns are validated and give no tables.

    Raises:
        ConfigError: an invalid pattern (:func:`parse_pattern`); two entries giving the same table
            name or identifier, or two patterns matching the same topic (the message names both).
    """
    patterns = {i: parse_pattern(raw, defaults) for i, raw in enumerate(entries) if is_pattern(raw)}
    topics = sorted(set(list_topics() or ())) if patterns and list_topics is not None else None
    declared = {raw.get("topic") for raw in entries if isinstance(raw, dict) and not is_pattern(raw)}
    out: list[tuple[Any, dict[str, Any]]] = []
    owners: dict[str, dict[str, str]] = {"topic": {}, "name": {}, "identifier": {}}
    for i, raw in enumerate(entries):
        if i not in patterns:
            out.append((raw, defaults))
            for key in owners:  # clashes between plain tables are reported by load_table_specs
                if isinstance(raw, dict) and isinstance(raw.get(key), str):
                    owners[key].setdefault(raw[key], f"table {raw.get('name')!r}")
            continue
        pattern = patterns[i]
        matched = [t for t in topics or () if t not in declared and pattern.matches(t)]
        if topics is not None and not matched:
            log.warning(
                "%s matches none of the %d topics on the cluster: no tables from it", pattern.where, len(topics)
            )
        for topic in matched:
            own, base = pattern.table(topic)
            for key in owners:
                _claim(owners[key], key, own[key], f"{pattern.where} (topic {topic!r})")
            out.append((own, base))
    return out
