"""``[[goals]]``: what an attacker must not learn, for the guessing-advantage conversion (NR §3.3.10).

A goal names one or more sensitive attributes, each guessed within a precision radius (or exactly), combined
as AND (guess all), OR (guess at least one) or EACH (every attribute protected on its own), or the membership
of one row of a table. An attribute's prior is its column's ``knowledge`` (:mod:`sqldp.policy.priors`; none →
the worst case). Syntax (docs/advantage.md)::

    [[goals]]
    attributes = { "t.time" = 2.0, "t.faculty" = "exact" }   # radius per attribute, or "exact"
    combine = "and"            # "and" (default) | "or" | "each"
    advantage = 0.05           # optional: else defaults.advantage or --advantage
    search = "simplified"      # or "a": also try the restricted attacker space
    strict = true              # with search = "a": X̂′ = g(a − r) − g(r) (sound) rather than g(a) − g(r)

    [[goals]]
    membership = "t"           # guessing whether one row is in table t
    prior = 0.5                # optional: Pr_pre[row ∈ t]; omitted = worst case

The conversion of a goal into ε is :mod:`sqldp.advantage`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from sqldp.errors import PolicyError
from sqldp.policy.keys import check_keys
from sqldp.policy.priors import UNKNOWN, Knowledge
from sqldp.policy.tables import TablePolicy
from sqldp.policy.values import fraction

Combine = Literal["and", "or", "each"]
GOAL_KEYS = {"attributes", "combine", "advantage", "membership", "prior", "search", "strict", "name"}


@dataclass(frozen=True)
class Attribute:
    table: str
    column: str
    radius: float | None  # None: an exact guess
    prior: Knowledge = UNKNOWN

    @property
    def name(self) -> str:
        return f"{self.table}.{self.column}"


@dataclass(frozen=True)
class Goal:
    """One [[goals]] entry (or an inline goal of ``sqldp epsilon``)."""

    attributes: tuple[Attribute, ...] = ()
    combine: Combine = "and"
    advantage: float | None = None
    membership: str | None = None  # a table: "is this row in the database?"
    membership_prior: float | None = None  # None: unknown, worst case
    search: Literal["simplified", "a"] = "simplified"
    strict: bool = True
    name: str = ""

    def describe(self) -> str:
        if self.membership is not None:
            return self.name or f"membership of a row of {self.membership}"
        parts = [f"{a.name}{' exactly' if a.radius is None else f' ±{a.radius:g}'}" for a in self.attributes]
        return self.name or f" {self.combine.upper()} ".join(parts)


def parse_goals(raw: Any, tables: Mapping[str, TablePolicy], where: str) -> list[Goal]:
    """The ``goals`` array at ``where``; attributes take their prior from the parsed ``tables``."""
    if not isinstance(raw, list):
        raise PolicyError("must be an array of tables ([[goals]])", where=where)
    return [_goal(g, tables, f"{where}[{i}]") for i, g in enumerate(raw)]


def _goal(g: Any, tables: Mapping[str, TablePolicy], where: str) -> Goal:
    if not isinstance(g, dict):
        raise PolicyError("must be a table", where=where)
    check_keys(g, GOAL_KEYS, (), where)
    adv = g.get("advantage")
    if adv is not None:
        adv = fraction(adv, f"{where}.advantage")
    name = g.get("name", "")
    if not isinstance(name, str):
        raise PolicyError("must be a string", where=f"{where}.name")
    search = g.get("search", "simplified")
    if search not in ("simplified", "a"):
        raise PolicyError(f"must be 'simplified' or 'a', got {search!r}", where=f"{where}.search")
    strict = g.get("strict", True)
    if not isinstance(strict, bool):
        raise PolicyError("must be true or false", where=f"{where}.strict")
    if ("membership" in g) == ("attributes" in g):
        raise PolicyError("a goal needs exactly one of 'attributes' or 'membership'", where=where)
    if "membership" in g:
        for key in ("combine", "search", "strict"):
            if key in g:
                raise PolicyError("not allowed with 'membership'", where=f"{where}.{key}")
        table = g["membership"]
        if not isinstance(table, str) or not table:
            raise PolicyError("must be a table name", where=f"{where}.membership")
        prior = fraction(g["prior"], f"{where}.prior") if "prior" in g else None
        return Goal(advantage=adv, membership=table.lower(), membership_prior=prior, name=name)
    if "prior" in g:
        raise PolicyError(
            "only for membership goals; attribute priors come from the column's knowledge", where=f"{where}.prior"
        )
    combine = g.get("combine", "and")
    if combine not in ("and", "or", "each"):
        raise PolicyError(f"must be 'and', 'or' or 'each', got {combine!r}", where=f"{where}.combine")
    attrs_raw = g["attributes"]
    if not isinstance(attrs_raw, dict) or not attrs_raw:
        raise PolicyError('must be a table such as { "t.time" = 2.0 }', where=f"{where}.attributes")
    attrs = []
    seen: set[tuple[str, str]] = set()
    for ref, radius in attrs_raw.items():
        w = f"{where}.attributes.{ref}"
        table, dot, column = str(ref).lower().partition(".")
        if not dot or not table or not column or "." in column:
            raise PolicyError("must name a column as 'table.column'", where=w)
        if (table, column) in seen:  # PostgreSQL folds unquoted names: "T.Time" is "t.time"
            raise PolicyError("names a column given already (names compare in lower case)", where=w)
        seen.add((table, column))
        attrs.append(Attribute(table, column, _radius(radius, w), _knowledge(tables, table, column)))
    if search == "a" and combine != "and":
        raise PolicyError("the restricted-space search is implemented for AND goals only", where=f"{where}.search")
    return Goal(tuple(attrs), combine, adv, search=search, strict=strict, name=name)


def _knowledge(tables: Mapping[str, TablePolicy], table: str, column: str) -> Knowledge:
    """What the policy says the attacker knows of the column; nothing (the worst case) if it says nothing."""
    t = tables.get(table)
    c = t.columns.get(column) if t is not None else None
    return c.knowledge if c is not None and c.knowledge is not None else UNKNOWN


def _radius(v: Any, where: str) -> float | None:
    if v == "exact":
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise PolicyError(f'must be a precision radius > 0 or "exact", got {v!r}', where=where)
    return float(v)
