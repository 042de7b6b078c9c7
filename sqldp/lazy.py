"""A module imported at its first use, for the heavy ones only some paths need.

``sqldp --help`` and the analysis of a single-table query must start in well under 0.3 s of CPU; z3 alone
takes ~60 ms to import, and the modules that use it are imported by everything that analyses a query.
``z3 = lazy("z3", globals())`` binds a stand-in whose first attribute lookup imports the module and puts it
in the importer's globals in place of the stand-in, so every later ``z3.X`` is the plain module lookup.
The type checker sees the real import (``if TYPE_CHECKING: import z3``).
"""

from __future__ import annotations

import importlib
from typing import Any


class _Lazy:
    __slots__ = ("_as", "_into", "_name")

    def __init__(self, name: str, into: dict[str, Any], bound_as: str) -> None:
        self._name, self._into, self._as = name, into, bound_as

    def __getattr__(self, attr: str) -> Any:
        module = importlib.import_module(self._name)
        if self._into.get(self._as) is self:
            self._into[self._as] = module
        return getattr(module, attr)

    def __repr__(self) -> str:
        return f"<module {self._name!r}, imported at its first use>"


def lazy(name: str, into: dict[str, Any], bound_as: str | None = None) -> Any:
    """A stand-in for module ``name`` that imports it at the first attribute lookup and then replaces itself
    in ``into`` (the importer's ``globals()``) under ``bound_as`` (default: the module's last name part)."""
    return _Lazy(name, into, bound_as or name.rsplit(".", 1)[-1])
