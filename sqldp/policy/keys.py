"""The one key check every table of a policy file goes through.

A misspelt key must not silently weaken the policy: ``weigth = 5`` that were ignored would leave the table at
weight 1, a ``knowlege`` would leave the attacker's prior at the worst case without a word. So every table of
the file — the top level, ``[defaults]``, ``[tables.T]``, its columns and their ``knowledge``, each
``[[goals]]`` entry, ``[proxy]`` and ``[analysts.NAME]`` — is checked by :func:`check_keys`, and all of them
report a problem in the same words::

    p.toml: tables.orders: unknown key 'weigth' (allowed: columns, norm, rows, weight)
    p.toml: tables.t.columns.v.knowledge: missing key 'hi' for kind 'range_uniform' (required: hi, lo)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from sqldp.errors import PolicyError


def check_keys(
    table: Any, allowed: Iterable[str], required: Iterable[str], where: str, *, what: str = ""
) -> Mapping[str, Any]:
    """Return ``table`` if it is a TOML table whose keys are all ``allowed`` and which has every ``required``
    one; else raise a one-line :class:`PolicyError` at ``where`` (the location of the table itself, as
    ``file`` or ``file: dotted.path``) naming the first offending key in sorted order. ``what`` says whose keys
    these are when the allowed set depends on it (``kind 'normal'``)."""
    if not isinstance(table, Mapping):
        raise PolicyError("must be a TOML table", where=where)
    allowed = frozenset(allowed)
    needed = sorted(required)
    whose = f" for {what}" if what else ""
    unknown = sorted((k for k in table if k not in allowed), key=str)
    if unknown:
        listed = ", ".join(sorted(allowed)) or "none"
        raise PolicyError(f"unknown key {unknown[0]!r}{whose} (allowed: {listed})", where=where)
    missing = [k for k in needed if k not in table]
    if missing:
        raise PolicyError(f"missing key {missing[0]!r}{whose} (required: {', '.join(needed)})", where=where)
    return table
