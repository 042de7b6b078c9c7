"""Values on the wire: result column types and text/binary encodings, and bound parameters as SQL literals.

Formats follow the PostgreSQL type output functions (text) and ``*send`` functions (binary); type OIDs are
those of ``pg_type`` (``src/include/catalog/pg_type.dat``), stable across releases.
"""

from __future__ import annotations

import datetime as dt
import math
import re
import struct
from collections.abc import Sequence
from decimal import Decimal, InvalidOperation
from typing import Any

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
    if isinstance(v, float):
        return _float_text(v).encode()
    if isinstance(v, dt.datetime):
        return v.isoformat(sep=" ").encode()
    if isinstance(v, (bytes, bytearray, memoryview)):
        return b"\\x" + bytes(v).hex().encode()
    if isinstance(v, dt.timedelta):
        return f"{v.days} days {v.seconds} seconds {v.microseconds} microseconds".encode()
    return str(v).encode("utf-8")


def encode_binary(v: Any, oid: int) -> bytes | None:
    if v is None:
        return None
    if oid == BOOL:
        return b"\x01" if v else b"\x00"
    if oid == INT8:
        return struct.pack("!q", int(v))
    if oid == FLOAT8:
        return struct.pack("!d", float(v))
    if oid in (TEXT, NAME, VARCHAR):
        return str(v).encode("utf-8")
    if oid == DATE:
        return struct.pack("!i", (v - PG_EPOCH).days)
    if oid == INT4:
        return struct.pack("!i", int(v))
    raise RefusedError(f"binary result format is not supported for type OID {oid}; ask for text format")


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


def _numeric_binary(raw: bytes) -> str:
    """numeric_send: ndigits, weight, sign, dscale, then base-10000 digits (src/backend/utils/adt/numeric.c)."""
    if len(raw) < 8:
        raise InputError("truncated binary numeric parameter")
    ndigits, weight, sign, dscale = struct.unpack("!hhHh", raw[:8])
    if sign == 0xC000:
        return "NaN"
    if len(raw) != 8 + 2 * ndigits or ndigits < 0:
        raise InputError("malformed binary numeric parameter")
    digits = struct.unpack(f"!{ndigits}h", raw[8:])
    value = Decimal(0)
    for i, d in enumerate(digits):
        value += Decimal(d).scaleb(4 * (weight - i))
    if sign == 0x4000:
        value = -value
    return f"{value:.{max(dscale, 0)}f}"


def _decode_binary(raw: bytes, oid: int) -> str:
    try:
        if oid == INT2:
            return str(struct.unpack("!h", raw)[0])
        if oid == INT4:
            return str(struct.unpack("!i", raw)[0])
        if oid == INT8:
            return str(struct.unpack("!q", raw)[0])
        if oid == OID:
            return str(struct.unpack("!I", raw)[0])
        if oid == FLOAT4:
            return repr(struct.unpack("!f", raw)[0])
        if oid == FLOAT8:
            return repr(struct.unpack("!d", raw)[0])
        if oid == BOOL:
            return "true" if raw == b"\x01" else "false"
        if oid == DATE:
            return (PG_EPOCH + dt.timedelta(days=struct.unpack("!i", raw)[0])).isoformat()
        if oid == NUMERIC:
            return _numeric_binary(raw)
        if oid in _TEXT_OIDS:
            return raw.decode("utf-8")
    except (struct.error, UnicodeDecodeError, OverflowError) as exc:
        raise InputError(f"malformed binary parameter of type OID {oid}: {exc}") from None
    raise InputError(f"binary parameters of type OID {oid} are not supported; send them as text")


_NUMBER = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?")


def literal(raw: bytes | None, fmt: int, oid: int, position: int) -> str:
    """A bound parameter as a SQL literal. Values are validated for their declared type and quoted, so a
    parameter can never change the statement's shape."""
    if raw is None:
        return f"CAST(NULL AS {_CAST[oid]})" if oid in _CAST else "NULL"
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
