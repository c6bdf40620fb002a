"""Converters from decoded Python values to the values Arrow takes for a target type.

Built once per target Arrow type; a converter is ``None`` where a value passes unchanged, so a
group whose types need nothing is handed to ``pyarrow`` as decoded. Two jobs:

- every format: a multi-type union (a struct whose fields are all ``member<k>``) takes the value
  into the first member whose type accepts it; a ``uuid.UUID`` becomes its text.
- JSON (``text=True``): ISO-8601 strings become dates, times and timestamps (a string without an
  offset is UTC), base64 strings become bytes, numbers and numeric strings become decimals.

A value that does not fit raises :class:`FitError` naming the field path.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import decimal
import re
import uuid

import pyarrow as pa

from kafka_iceberg.formats.types import UNION_MEMBER

_MEMBER = re.compile(rf"{UNION_MEMBER}\d+")


class FitError(ValueError):
    """A value does not fit its column; the message names the field path and the expected type."""


def is_union(t: pa.DataType) -> bool:
    return (
        pa.types.is_struct(t)
        and t.num_fields > 1
        and all(_MEMBER.fullmatch(t.field(i).name) for i in range(t.num_fields))
    )


def _timestamp(v, tz: bool):
    if isinstance(v, str):
        try:
            v = dt.datetime.fromisoformat(v.replace("Z", "+00:00").replace("z", "+00:00"))
        except ValueError:
            raise FitError(f"{v!r} is not an ISO-8601 timestamp") from None
    if isinstance(v, dt.datetime):
        if tz and v.tzinfo is None:
            v = v.replace(tzinfo=dt.timezone.utc)
        elif not tz and v.tzinfo is not None:
            v = v.astimezone(dt.timezone.utc).replace(tzinfo=None)
    return v


def _date(v):
    if isinstance(v, str):
        try:
            return dt.date.fromisoformat(v)
        except ValueError:
            raise FitError(f"{v!r} is not an ISO-8601 date") from None
    return v


def _time(v):
    if isinstance(v, str):
        try:
            return dt.time.fromisoformat(v)
        except ValueError:
            raise FitError(f"{v!r} is not an ISO-8601 time") from None
    return v


def _binary(v):
    if isinstance(v, str):
        try:
            return base64.b64decode(v, validate=True)
        except (binascii.Error, ValueError):
            raise FitError("not base64 text") from None
    return v


def _decimal(v):
    if isinstance(v, (int, float, str)) and not isinstance(v, bool):
        try:
            return decimal.Decimal(str(v))
        except decimal.InvalidOperation:
            raise FitError(f"{v!r} is not a decimal number") from None
    return v


def _accepts(t: pa.DataType, v) -> bool:
    """Whether a non-null Python value ``v`` belongs to a union member of Arrow type ``t``."""
    if pa.types.is_boolean(t):
        return isinstance(v, bool)
    if pa.types.is_integer(t):
        return isinstance(v, int) and not isinstance(v, bool)
    if pa.types.is_floating(t):
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    if pa.types.is_string(t):
        return isinstance(v, (str, uuid.UUID))
    if pa.types.is_binary(t):
        return isinstance(v, bytes)
    if pa.types.is_decimal(t):
        return isinstance(v, decimal.Decimal)
    if pa.types.is_timestamp(t):
        return isinstance(v, dt.datetime)
    if pa.types.is_date(t):
        return isinstance(v, dt.date) and not isinstance(v, dt.datetime)
    if pa.types.is_time(t):
        return isinstance(v, dt.time)
    if pa.types.is_list(t):
        return isinstance(v, list)
    return isinstance(v, (dict, tuple))


def _union(t: pa.DataType, text: bool):
    members = [(t.field(i).name, t.field(i).type, converter(t.field(i).type, text)) for i in range(t.num_fields)]

    def conv(v):
        if isinstance(v, tuple):  # fastavro's (record name, record) for a record branch
            v = v[1]
        # first the members whose type the value has; then (JSON) text a member converts
        for exact in (True, False):
            for name, mt, mconv in members:
                if _accepts(mt, v) if exact else (text and mconv is not None and isinstance(v, str)):
                    try:
                        return {name: mconv(v) if mconv else v}
                    except FitError:
                        continue
        raise FitError(f"{type(v).__name__} value fits no branch of the union")

    return conv


def _struct(t: pa.StructType, text: bool):
    convs = [(t.field(i).name, c) for i in range(t.num_fields) if (c := converter(t.field(i).type, text))]
    if not convs:
        return None

    def conv(v):
        if isinstance(v, tuple):
            v = v[1]
        if not isinstance(v, dict):
            raise FitError(f"{type(v).__name__} is not a record")
        out = v  # decoded values are fresh per record: converted in place
        for name, c in convs:
            x = out.get(name)
            if x is not None:
                try:
                    out[name] = c(x)
                except FitError as e:
                    raise FitError(f"{name}: {e}") from None
        return out

    return conv


def converter(t: pa.DataType, text: bool = False):
    """The converter for values of Arrow type ``t``, or None when values pass unchanged."""
    if is_union(t):
        return _union(t, text)
    if pa.types.is_struct(t):
        return _struct(t, text)
    if pa.types.is_list(t):
        c = converter(t.value_type, text)
        return None if c is None else (lambda v: [None if x is None else c(x) for x in v])
    if pa.types.is_map(t):
        c = converter(t.item_type, text)
        return None if c is None else (lambda v: {k: None if x is None else c(x) for k, x in dict(v).items()})
    if not text:
        return None
    if pa.types.is_timestamp(t):
        return lambda v: _timestamp(v, t.tz is not None)
    return {"date32[day]": _date, "time64[us]": _time, "binary": _binary}.get(str(t)) or (
        _decimal if pa.types.is_decimal(t) else None
    )
