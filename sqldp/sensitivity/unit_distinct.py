"""COUNT(DISTINCT unit key) under a privacy unit: a global bound of 1 per group the unit can reach.

Under a unit (:mod:`sqldp.sensitivity.units`) neighbouring databases differ by one unit u with every row that
references it. R2T truncates contributions that add up; a distinct count does not add up over units, so R2T
is not used. But when every join row belongs to one unit (the unit keys of all private uses are provably equal
under θ's equalities, as :func:`sqldp.sensitivity.units.plan_units` decides) and the counted expression is that
unit key (a column in its θ-class), the count is the number of units that own at least one join row:

* removing u removes every row that references it, hence every join row u owns, and no other join row (each
  join row's private rows are of its own unit; public rows do not change); so the set of unit keys present
  loses u at most: |ΔCOUNT(DISTINCT key)| ≤ 1 (ungrouped);
* grouped, u's join rows may fall in several groups and each such group's count moves by at most 1, so the
  histogram moves by at most the number of groups u can reach in ℓ1. Where every group key reads only columns
  of a use of the unit's own table on its key (``GROUP BY u.segment`` with u's key in the unit key's θ-class),
  all of u's join rows share u's one row there, hence one group: ℓ1 ≤ 1. Other group keys are refused: a unit
  may reach every group (docs/units.md).

The bound depends on the query, the schema and the policy only: Laplace at 1/ε (Dwork et al. 2006).
"""

from __future__ import annotations

from sqlglot import exp

from sqldp.catalog import Catalog
from sqldp.errors import RefusedError
from sqldp.form import AnalysisForm, ColumnRef
from sqldp.policy import Policy
from sqldp.sensitivity.disjoint import DisjointSet
from sqldp.sensitivity.rows import equality_classes
from sqldp.sensitivity.unit_bounds import UnitBoundPlan
from sqldp.sensitivity.units import plan_units

SOURCE = "COUNT(DISTINCT unit key): one unit moves it by at most 1 (docs/units.md)"


def distinct_plan(form: AnalysisForm, catalog: Catalog, policy: Policy) -> UnitBoundPlan:
    """The plan of COUNT(DISTINCT e) under a unit where e is the unit key of every join row (module docstring);
    refused otherwise, with the reason."""
    agg = form.aggregates[0]
    arg = agg.arg
    if agg.kind != "count" or not isinstance(arg, exp.Column) or not arg.table:
        raise RefusedError(
            "COUNT(DISTINCT …) under a privacy unit is answered for the unit's key only (one unit moves the count "
            "of distinct unit keys by at most 1); distinct values of other columns do not add up over units"
        )
    raced = plan_units(form, catalog, policy)
    if raced.unit_key is None or len(raced.units) != 1 or form.semijoins:
        raise RefusedError(
            "COUNT(DISTINCT unit key) needs every join row to belong to one unit (no self-join, no second unit, "
            "no semi-join)"
        )
    key, counted = raced.unit_key, ColumnRef(arg.table, arg.name)
    classes = equality_classes(form.conjuncts)
    if not _same(counted, key, classes):
        raise RefusedError(
            f"COUNT(DISTINCT {arg.sql(dialect='postgres')}) under unit {raced.units[0].name}: the counted column is "
            f"not the unit's key {key} of every join row (by the query's equalities); one unit may then move it by "
            "more than 1"
        )
    unit = raced.units[0]
    if form.group_by and not _one_group(form, unit.table, unit.key, key, classes):
        raise RefusedError(
            f"COUNT(DISTINCT {arg.sql(dialect='postgres')}) per group under unit {unit.name}: one unit's rows may "
            f"fall in several groups; answered where the group keys are columns of the unit's table {unit.table} "
            "joined on its key (one group per unit), docs/units.md"
        )
    terms = {unit.name: {"sensitivity": 1.0, "weight": 1.0, "method": SOURCE}}
    return UnitBoundPlan(form, agg, 1.0, terms, True, (), source=SOURCE, unit=unit, join_rows=1.0, raced=None)


def _same(a: ColumnRef, b: ColumnRef, classes: DisjointSet[ColumnRef]) -> bool:
    """``a`` and ``b`` are equal on every join row: the same column, or one θ-class."""
    return a == b or (a in classes and b in classes and classes.connected(a, b))


def _one_group(form: AnalysisForm, table: str, column: str, key: ColumnRef, classes: DisjointSet[ColumnRef]) -> bool:
    """Every group key reads only columns of uses of the unit's table whose key column is the unit key of the
    join rows (in its θ-class): one row per unit there, so one group per unit."""
    owned = set()
    for u in form.uses:
        ref = ColumnRef(u.alias, column)
        if u.table == table and _same(ref, key, classes):
            owned.add(u.alias)
    return all(c.table in owned for g in form.group_by for c in g.find_all(exp.Column)) and all(
        any(True for _ in g.find_all(exp.Column)) for g in form.group_by
    )
