"""Values on the wire: result column types and text/binary encodings, and bound parameters as SQL literals.

Formats follow the PostgreSQL type output functions (text) and ``*send`` functions (binary); type OIDs are
those of ``pg_type`` (``src/include/catalog/pg_type.dat``), stable across releases.
"""

from __future__ import annotations

import datetime as dt
import functools
import math
import re
import struct
from collections.abc import Sequence
from decimal import Decimal, InvalidOperation
from typing import Any

import psycopg
from psycopg.abc import Dumper, Loader
from psycopg.pq import Format

from sqldp.errors import InputError, RefusedError

BOOL, BYTEA, NAME, INT8, INT2, INT4, TEXT, OID = 16, 17, 19, 20, 21, 23, 25, 26
FLOAT4, FLOAT8, UNKNOWN, INET, BPCHAR, VARCHAR = 700, 701, 705, 869, 1042, 1043
DATE, TIME, TIMESTAMP, TIMESTAMPTZ, INTERVAL, NUMERIC, UUID = 1082, 1083, 1114, 1184, 1186, 1700, 2950
TYPE_SIZE = {BOOL: 1, INT2: 2, INT4: 4, INT8: 8, FLOAT4: 4, FLOAT8: 8, DATE: 4, TIME: 8, TIMESTAMP: 8, TIMESTAMPTZ: 8}
PG_EPOCH = dt.date(2000, 1, 1)


def infer_type(values: Sequence[Any]) -> int:
    """The type OID of one result column from its Python values (the runner hands back Python objects).
    Noisy aggregates are floats and so ``float8``; exact public answers keep their own type."""
    oid = TEXT
    for v in values:
        if v is None:
            continue
        if isinstance(v, bool):
            return BOOL
        if isinstance(v, int):
            oid = INT8
            continue
        if isinstance(v, float):
            return FLOAT8
        if isinstance(v, Decimal):
            return NUMERIC
        if isinstance(v, dt.datetime):
            return TIMESTAMPTZ if v.tzinfo is not None else TIMESTAMP
        if isinstance(v, dt.date):
            return DATE
        if isinstance(v, dt.time):
            return TIME
        if isinstance(v, dt.timedelta):
            return INTERVAL
        if isinstance(v, (bytes, bytearray, memoryview)):
            return BYTEA
        return TEXT
    return oid


def _float_text(x: float) -> str:
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "Infinity" if x > 0 else "-Infinity"
    text = repr(x)  # shortest round-trip digits, as float8out with extra_float_digits ≥ 1 (the default)
    return text[:-2] if text.endswith(".0") else text


def encode_text(v: Any, oid: int) -> bytes | None:
    if v is None:
        return None
    if isinstance(v, bool):
        return b"t" if v else b"f"
    if oid in (FLOAT8, FLOAT4):
        return _float_text(float(v)).encode()
    if oid in (INT2, INT4, INT8) and isinstance(v, float | Decimal) and v == int(v):
        return str(int(v)).encode()
    if isinstance(v, float):
        return _float_text(v).encode()
    if isinstance(v, dt.datetime):
        return v.isoformat(sep=" ").encode()
    if isinstance(v, (bytes, bytearray, memoryview)):
        return b"\\x" + bytes(v).hex().encode()
    if isinstance(v, dt.timedelta):
        return f"{v.days} days {v.seconds} seconds {v.microseconds} microseconds".encode()
    return str(v).encode("utf-8")


_INT_RANGE = {INT2: (-(1 << 15), 1 << 15), INT4: (-(1 << 31), 1 << 31), INT8: (-(1 << 63), 1 << 63), OID: (0, 1 << 32)}


def _coerce(v: Any, oid: int) -> Any:
    """The Python value psycopg's dumper for ``oid`` takes: the runner hands back ints for BIGINT keys and
    Decimals for NUMERIC, and a column described as numeric or integer upstream keeps that type here."""
    if oid in (INT2, INT4, INT8, OID):
        if isinstance(v, float | Decimal) and v != int(v):
            raise ValueError("not an integer")
        lo, hi = _INT_RANGE[oid]
        if not lo <= int(v) < hi:  # psycopg's integer dumpers would wrap around silently
            raise ValueError("out of range")
        return int(v)
    if oid in (FLOAT4, FLOAT8):
        return float(v)
    if oid == NUMERIC:
        return v if isinstance(v, Decimal) else Decimal(repr(v)) if isinstance(v, float) else Decimal(v)
    if oid in (TEXT, VARCHAR, BPCHAR, NAME, UNKNOWN):
        return v if isinstance(v, str) else (encode_text(v, TEXT) or b"").decode("utf-8")
    return v


@functools.cache
def _dumper(oid: int, py_type: type) -> Dumper:
    # BPCHAR and UNKNOWN have no binary dumper in psycopg; their binary form is the text's (bpcharsend)
    cls = psycopg.adapters.get_dumper_by_oid(TEXT if oid in (BPCHAR, UNKNOWN) else oid, Format.BINARY)
    return cls(py_type)


def encode_binary(v: Any, oid: int) -> bytes | None:
    """The binary form of a result value (the type's ``*send`` function), by psycopg's dumper for ``oid``."""
    if v is None:
        return None
    try:
        value = _coerce(v, oid)
        py_type: type = type(value)  # type[Any] would not pass as Hashable to the cache (mypy issue #11470)
        data = _dumper(oid, py_type).dump(value)  # None only for SQL NULL, which was answered above
    except (psycopg.ProgrammingError, ValueError, TypeError, ArithmeticError, struct.error, OverflowError):
        data = None
    if data is None:
        raise RefusedError(
            f"binary result format is not supported for this value of type OID {oid}; ask for text format"
        )
    return bytes(data)


# -- parameters -----------------------------------------------------------------------------------

_INT_OIDS = {INT2, INT4, INT8, OID}
_TEXT_OIDS = {0, TEXT, VARCHAR, BPCHAR, NAME, UNKNOWN}
_CAST = {
    INT2: "smallint",
    INT4: "integer",
    INT8: "bigint",
    FLOAT4: "real",
    FLOAT8: "double precision",
    NUMERIC: "numeric",
    DATE: "date",
    TIMESTAMP: "timestamp",
    TIMESTAMPTZ: "timestamptz",
    TIME: "time",
    BOOL: "boolean",
}


def _quote(text: str) -> str:
    if "\0" in text:
        raise InputError("a parameter contains a NUL character")
    return "'" + text.replace("'", "''") + "'"


@functools.cache
def _loader(oid: int) -> Loader:
    cls = psycopg.adapters.get_loader(oid, Format.BINARY)
    if cls is None:  # not reached for the OIDs _decode_binary lets through; reported as a malformed parameter
        raise TypeError(f"psycopg has no binary loader for OID {oid}")
    return cls(oid)


def _decode_binary(raw: bytes, oid: int) -> str:
    """A binary parameter (the type's ``*recv`` form) as text for a literal, by psycopg's loader for ``oid``."""
    if oid in _TEXT_OIDS:
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise InputError("not valid UTF-8") from None
    if oid not in _CAST and oid != OID:
        raise InputError(f"binary parameters of type OID {oid} are not supported; send them as text")
    # psycopg's C loaders trust the length: a short buffer would be read past its end, so check it first
    size = 4 if oid == OID else TYPE_SIZE.get(oid)
    if size is not None and len(raw) != size:
        raise InputError(f"binary parameter of type OID {oid} must be {size} bytes, got {len(raw)}")
    if oid == NUMERIC and (len(raw) < 8 or len(raw) != 8 + 2 * struct.unpack("!h", raw[:2])[0]):
        raise InputError("malformed binary numeric parameter")
    try:
        value = _loader(oid).load(raw)
    except (psycopg.Error, struct.error, ValueError, TypeError, ArithmeticError, OverflowError) as exc:
        raise InputError(f"malformed binary parameter of type OID {oid}: {' '.join(str(exc).split())[:80]}") from None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, dt.date | dt.time):
        return value.isoformat()
    return str(value)


_NUMBER = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?")


def null_literal(oid: int) -> str:
    """A typed NULL standing for a parameter whose value is not known yet (describing a statement)."""
    return f"CAST(NULL AS {_CAST[oid]})" if oid in _CAST else "NULL"


def literal(raw: bytes | None, fmt: int, oid: int, position: int) -> str:
    """A bound parameter as a SQL literal. Values are validated for their declared type and quoted, so a
    parameter can never change the statement's shape."""
    if raw is None:
        return null_literal(oid)
    try:
        text = _decode_binary(raw, oid) if fmt == 1 else raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(f"parameter ${position} is not valid UTF-8") from None
    except InputError as exc:
        raise InputError(f"parameter ${position}: {exc.message}") from None
    if oid in _INT_OIDS:
        if not re.fullmatch(r"[+-]?\d+", text.strip()):
            raise InputError(f"parameter ${position} is not an integer: {text[:40]!r}")
        return str(int(text))
    if oid in (FLOAT4, FLOAT8, NUMERIC):
        t = text.strip()
        if t.lower() in ("nan", "infinity", "-infinity", "inf", "-inf"):
            return f"CAST({_quote(t)} AS {_CAST[oid]})"
        if not _NUMBER.fullmatch(t):
            raise InputError(f"parameter ${position} is not a number: {text[:40]!r}")
        try:
            Decimal(t)
        except InvalidOperation:
            raise InputError(f"parameter ${position} is not a number: {text[:40]!r}") from None
        return t if oid == NUMERIC else f"CAST({t} AS {_CAST[oid]})"
    if oid == BOOL:
        low = text.strip().lower()
        if low in ("t", "true", "y", "yes", "on", "1"):
            return "TRUE"
        if low in ("f", "false", "n", "no", "off", "0"):
            return "FALSE"
        raise InputError(f"parameter ${position} is not a boolean: {text[:40]!r}")
    if oid in _CAST:
        return f"CAST({_quote(text)} AS {_CAST[oid]})"
    if oid in _TEXT_OIDS:
        return _quote(text)
    raise InputError(f"parameter ${position} has type OID {oid}, which sqldp does not bind; cast it in the query")
