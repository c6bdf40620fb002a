"""Driver-side schema resolution through ``confluent_kafka.schema_registry.SchemaRegistryClient``.

The driver collects the schema ids a micro-batch needs, fetches each one once (schema ids are
immutable, so a process-wide cache keeps them for good) and ships the resulting
:class:`WriterSchema` objects (small, picklable) to the Spark tasks, which never call the registry.

Authentication and TLS come from the environment, never from the table declarations:
``LAKE_SCHEMA_REGISTRY_CONFIG`` (read by :func:`kafka_iceberg.config.settings.registry_settings` into
:class:`~kafka_iceberg.config.models.RegistrySettings`) is a JSON object of ``SchemaRegistryClient``
properties, e.g. ``{"basic.auth.user.info": "user:password"}``, or Confluent Cloud's
``bearer.auth.token`` with ``bearer.auth.logical.cluster`` and ``bearer.auth.identity.pool.id``, and
``ssl.ca.location``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass

from tenacity import RetryCallState, Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from kafka_iceberg.config.models import RegistrySettings
from kafka_iceberg.config.settings import registry_settings
from kafka_iceberg.errors import LakeError
from kafka_iceberg.formats.wire import WireError, schema_id_of

SCHEMA_TYPES = {"avro": "AVRO", "protobuf": "PROTOBUF", "json_schema": "JSON"}
"""``format.type`` of a declaration -> the registry's ``schemaType``."""


class RegistryUnavailableError(LakeError):
    """The schema registry did not answer (or answered 5xx) after the retries; nothing was committed."""


class SchemaNotFoundError(LakeError):
    """The registry does not know a schema id or subject (HTTP 404)."""


@dataclass(frozen=True)
class WriterSchema:
    """A registered schema as the tasks need it: id, ``schema_type`` (``AVRO``, ``PROTOBUF``,
    ``JSON``) and the schema text (Protobuf: a base64 ``FileDescriptorProto``, the registry's
    ``format=serialized`` form)."""

    schema_id: int
    schema_type: str
    schema_str: str


def client_config(
    url: str,
    registry: RegistrySettings | None = None,
    retries: int = 3,
    retry_wait_ms: int = 200,
    timeout_s: float = 10.0,
) -> dict:
    """The ``SchemaRegistryClient`` configuration for ``url`` with the credentials of ``registry``
    (default: :func:`kafka_iceberg.config.settings.registry_settings` of the process environment)."""
    registry = registry_settings() if registry is None else registry
    conf: dict = {
        "url": url,
        "max.retries": retries,
        "retries.wait.ms": retry_wait_ms,
        "retries.max.wait.ms": max(retry_wait_ms, 2000),
        "timeout": timeout_s,
    }
    props = registry.properties()
    if "bearer.auth.token" in props:
        conf["bearer.auth.credentials.source"] = "STATIC_TOKEN"
    conf.update(props)
    return conf


_CACHE: dict[tuple[str, int], WriterSchema] = {}
_LOCK = threading.Lock()


class _Retryable(Exception):
    """A transport error or a 5xx answer of the registry: worth asking again."""


def _call(url: str, what: str, fn, attempts: int, backoff_s: float):
    """Run ``fn()``; transport errors and 5xx are retried ``attempts`` times in all (tenacity; waits of
    ``backoff_s`` seconds doubling), then raised as :class:`RegistryUnavailableError`; a 404 is
    :class:`SchemaNotFoundError`."""
    import httpx
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    def once():
        try:
            return fn()
        except SchemaRegistryError as e:
            if e.http_status_code == 404:
                raise SchemaNotFoundError(f"schema registry {url}: {what} not found ({e.error_message})") from None
            if e.http_status_code < 500:
                raise RegistryUnavailableError(f"schema registry {url} refused {what}: {e}") from None
            raise _Retryable() from e
        except (httpx.HTTPError, OSError) as e:
            raise _Retryable() from e

    def give_up(state: RetryCallState):
        last = state.outcome.exception().__cause__
        raise RegistryUnavailableError(
            f"schema registry {url} is unreachable: {what} failed {attempts} times "
            f"(last error: {type(last).__name__}: {last}); nothing was committed"
        ) from None

    return Retrying(
        retry=retry_if_exception_type(_Retryable),
        stop=stop_after_attempt(attempts),
        wait=wait_exponential(multiplier=backoff_s),
        retry_error_callback=give_up,
    )(once)


def schema_ids(values: Iterable[bytes | None]) -> set[int]:
    """The distinct schema ids of the framed ``values`` (values not in the wire format are skipped:
    the decoders report them as ``missing_magic_byte``)."""
    ids: set[int] = set()
    for v in values:
        try:
            ids.add(schema_id_of(v))
        except WireError:
            pass
    return ids


def resolve(
    url: str, ids: Iterable[int], registry: RegistrySettings | None = None, attempts: int = 3, backoff_s: float = 0.5
) -> dict[int, WriterSchema | None]:
    """Fetch each schema id once (cached for the process's life) -> {id: schema, or None if unknown}.

    A schema id the registry does not know maps to ``None``: its records are ``unknown_schema_id``
    bad records. Runs on the driver; pass the result to the tasks.

    Raises:
        RegistryUnavailableError: the registry did not answer after ``attempts`` tries (each try
            itself includes the client's own short retries).
    """
    from confluent_kafka.schema_registry import SchemaRegistryClient

    found: dict[int, WriterSchema | None] = {}
    missing = []
    with _LOCK:
        for i in ids:
            if (url, i) in _CACHE:
                found[i] = _CACHE[(url, i)]
            else:
                missing.append(i)
    if not missing:
        return found
    client = SchemaRegistryClient(client_config(url, registry))
    for i in sorted(missing):
        try:
            s = _call(url, f"schema id {i}", lambda: client.get_schema(i), attempts, backoff_s)
            if s.schema_type == "PROTOBUF" and not _is_serialized(s.schema_str):
                # .proto text: ask for the FileDescriptorProto form, as confluent's ProtobufDeserializer
                # does (a fresh client: the first one caches by id whatever the format)
                again = SchemaRegistryClient(client_config(url, registry))
                s = _call(url, f"schema id {i}", lambda: again.get_schema(i, fmt="serialized"), attempts, backoff_s)
        except SchemaNotFoundError:
            found[i] = None  # not cached: a schema registered later under this id resolves next time
            continue
        ws = WriterSchema(i, s.schema_type or "AVRO", s.schema_str)
        with _LOCK:
            _CACHE[(url, i)] = ws
        found[i] = ws
    return found


def _is_serialized(text: str) -> bool:
    import base64
    import binascii

    from google.protobuf import descriptor_pb2
    from google.protobuf.message import DecodeError

    try:
        descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(text, validate=True))
        return True
    except (binascii.Error, ValueError, DecodeError):
        return False


def latest(
    url: str, subject: str, registry: RegistrySettings | None = None, attempts: int = 3, backoff_s: float = 0.5
) -> WriterSchema:
    """The latest schema registered under ``subject``.

    Raises:
        SchemaNotFoundError: no such subject. RegistryUnavailableError: as :func:`resolve`.
    """
    from confluent_kafka.schema_registry import SchemaRegistryClient

    client = SchemaRegistryClient(client_config(url, registry))
    r = _call(
        url, f"latest version of subject {subject}", lambda: client.get_latest_version(subject), attempts, backoff_s
    )
    return resolve(url, [r.schema_id], registry, attempts, backoff_s)[r.schema_id]


def subject_name(strategy: str, topic: str, record_name: str | None = None, is_key: bool = False) -> str:
    """The subject of a topic's value (or key) schema under a subject name strategy:
    ``topic_name`` (``<topic>-value``, the default), ``record_name`` (``<record>``) or
    ``topic_record_name`` (``<topic>-<record>``).

    Raises:
        ValueError: an unknown strategy, or a record strategy without ``record_name``.
    """
    if strategy == "topic_name":
        return f"{topic}-{'key' if is_key else 'value'}"
    if strategy not in ("record_name", "topic_record_name"):
        raise ValueError(f"subject name strategy {strategy!r} is not topic_name, record_name or topic_record_name")
    if not record_name:
        raise ValueError(f"subject name strategy {strategy} needs the record's full name")
    return record_name if strategy == "record_name" else f"{topic}-{record_name}"
