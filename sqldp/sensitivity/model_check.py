"""Global sensitivity by model checking (NR §3.3.13): how many rows of a join–filter–project query one row
of a table can change, decided from the schema's uniqueness constraints by an SMT solver, without data.

NR is the NAPLES final report (Cybernetica AS, "Novel Tools for Analyzing Privacy Leakages", AFRL-RI-RS-TR-
2021-123, 2021). For a query Q = (J, F, P) over uses J of tables, the derivative w.r.t. table t is the
multiset of result rows that removing one row y of t removes (NR §3.3.13.4). Its largest size over all
databases and rows y is the *global* sensitivity of Q w.r.t. t: a bound that holds for every database, so
a count over Q needs no smoothing and plain Laplace/geometric noise at S/ε suffices.

Φ_{Q,N} (NR §3.3.13.4) says "N distinct product rows satisfy F and each contains y at some use of t":
variables for N rows of every use, the row y, one uninterpreted function per uniqueness constraint and
dependent column (the key determines the row), and a function g whose values on the N rows are distinct.
Lemma 3.108 and Theorem 3.109: when every table has a uniqueness constraint (case 1), or only t lacks one
and is used once (case 2), Φ_{Q,N} is satisfiable iff the sensitivity is at least N; when another table has
none (case 4), or t has none and is used twice (case 3), the sensitivity is 0 or ∞, decided by Φ_{Q,1}.

Ψ_{Q,N} (NR §3.3.13.7) is the set-semantics variant: the N *output* rows (the projections P) are distinct.
It bounds SELECT DISTINCT (Theorem 3.110, exact when t is used once) and GROUP BY, where the number of groups
one row can change is Ψ over the group keys (Theorem 3.111).

A table used k times (§3.3.13.6, "fast"): the sum of the sensitivities w.r.t. each use as if it were a
table of its own (never below the exact value); the exact method of §3.3.13.4 keeps all uses in one
formula and is tried within the remaining time.

Soundness of the translation (every part keeps "the bound is an upper bound"):
* A filter sqldp cannot translate (functions, float arithmetic, string order under a collation) is
  replaced by a fresh Boolean per row: it admits every database the filter admits, so N only grows.
* Translated exactly: dates as days since 2000-01-01, DATE constants ± intervals, EXTRACT(YEAR) (the year Y
  with Jan 1 of Y ≤ d < Jan 1 of Y + 1, a monotone step function of the day), EXTRACT(MONTH / DAY) (calendar
  arithmetic by constant divisions), SUBSTRING with literal bounds (z3's str.substr), CASE over NOT NULL
  columns (nested If). ``s LIKE 'p'`` is an uninterpreted predicate of s per pattern: LIKE is one such
  predicate, so the bound stays an upper bound, never called exact.
* NULLs are not modelled. Comparisons, arithmetic, AND, OR and NOT are monotone in Kleene's three-valued
  logic (unknown ≤ true, false), so a row that passes F with NULLs passes it with the NULLs replaced by fresh
  values; replacing them keeps distinct rows distinct (EXTRACT, SUBSTRING and LIKE are strict, so they keep
  this). Constructs that are not monotone (IS NULL, COALESCE, CASE over a nullable column) are untranslatable
  and become free Booleans. A UNIQUE constraint on a nullable column allows repeated
  NULLs, so only PRIMARY KEY and UNIQUE over NOT NULL columns are uniqueness constraints here.
* The N search returns (smallest N proven unsatisfiable) − 1; a check the solver cannot finish within the
  search's budget counts as satisfiable, so running out only makes the bound larger (∞ when no N below the cap
  is proven). The budget counts z3's resource units (:class:`Budget`), not seconds: the same on every machine.
"""

from __future__ import annotations

import datetime as dt
import math
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from sqlglot import exp

from sqldp.catalog import Catalog, Table
from sqldp.lazy import lazy

if TYPE_CHECKING:
    import z3
else:  # ~60 ms to import: only when a formula is built (a query with one table needs none)
    z3 = lazy("z3", globals())

Semantics = Literal["bag", "set"]
# the largest N tried; a query that still has N + 1 rows in its derivative is reported unbounded (NR §4.3.6.3
# stopped at 10; keys give answers far above that, e.g. a 50-day window of daily rows)
DEFAULT_CAP = 64
# The search's budget per (query, table), in reference seconds: z3 resource units (its ``rlimit``, a count of the
# solver's own steps) at UNITS_PER_SECOND, never a wall clock. The same query, schema and policy then get the same
# bound on any machine under any load; a wall-clock limit gave the same self-join noise scales 27, 31 or 56 in
# fresh processes on a busy machine. UNITS_PER_SECOND is what this z3 spent per second on the TPC-H checks on the
# project's 2-core machine (benchmarks/results/model_check.md): a budget, not a promise of time.
DEFAULT_TIMEOUT = 5.0
UNITS_PER_SECOND = 3_000_000
_EPOCH = dt.date(2000, 1, 1)


class Budget:
    """What one sensitivity search may still spend, in z3 resource units (:data:`UNITS_PER_SECOND`). Shared by
    the checks of one search and the searches it runs for its parts; a check gets what is left as its
    ``rlimit`` and is charged what z3 counts it spent (z3's ``rlimit count`` is the context's running total)."""

    def __init__(self, units: int) -> None:
        self.left = units

    @classmethod
    def of(cls, seconds: float) -> Budget:
        return cls(int(max(0.0, seconds) * UNITS_PER_SECOND))

    def check(self, solver: z3.Solver) -> z3.CheckSatResult:
        """``solver.check()`` within what is left (unknown when nothing is), charged its resource units."""
        if self.left <= 0:
            return z3.unknown
        solver.set("rlimit", self.left)
        before = _units(solver)
        result = solver.check()
        self.left -= max(1, _units(solver) - before)
        return result


def _units(solver: z3.Solver) -> int:
    try:
        return int(solver.statistics().get_key_value("rlimit count"))
    except z3.Z3Exception:  # no step counted yet
        return 0


@dataclass(frozen=True)
class Use:
    alias: str
    table: str


@dataclass(frozen=True)
class SPJ:
    """A join–filter–project query (NR §3.3.13.1): uses J, conjuncts of F, projections P (for set semantics)."""

    uses: tuple[Use, ...]
    conditions: tuple[exp.Expr, ...]
    projections: tuple[exp.Expr, ...] = ()
    semantics: Semantics = "bag"


@dataclass(frozen=True)
class GlobalSensitivity:
    """The global sensitivity of a query w.r.t. one table: how many result rows one row of it can change."""

    table: str
    value: float  # a whole number or math.inf
    exact: bool  # the query really reaches ``value`` on some database (else: an upper bound)
    method: str  # "keys", "smt", "smt-fast" (§3.3.13.6), "duplicates" (Thm 3.109 cases 3–4), "cap"
    seconds: float
    approximated: tuple[str, ...] = ()  # filters replaced by free Booleans (the bound stays an upper bound)
    witness: Witness | None = field(default=None, compare=False)  # a database reaching ``value`` (when exact)
    timed_out: bool = False  # the time limit ended the search: ``value`` is what was proven by then (∞ if nothing)

    def to_json(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "sensitivity": self.value if math.isfinite(self.value) else "inf",
            "exact": self.exact,
            "method": self.method,
            "seconds": round(self.seconds, 4),
            "approximated": list(self.approximated),
            "timed_out": self.timed_out,
        }


@dataclass(frozen=True)
class Witness:
    """A database from a satisfying model of Φ_{Q,N}: ``rows`` per table (dicts of the columns the formula
    constrains; other columns are free), ``removed`` the row y whose removal changes ``n`` result rows.

    Values: int, fractions.Fraction (NUMERIC: on the column's grid), datetime.date (an int, days since
    2000-01-01, beyond Python's years 1–9999), bool, str. Strings are compared for equality only, so any
    one-to-one renaming that keeps the query's literals is a witness too (solver strings may hold characters
    PostgreSQL refuses, such as NUL)."""

    n: int
    rows: Mapping[str, tuple[Mapping[str, Any], ...]]
    removed: Mapping[str, Any]


class _Untranslatable(Exception):
    pass


def keys_of(table: Table) -> list[tuple[str, ...]]:
    """The table's uniqueness constraints that forbid repeated rows (NR §3.2.1.1, Dis_r)."""
    keys = []
    if table.primary_key:
        keys.append(tuple(table.primary_key))
    for cols in table.unique:
        if all(not table.columns[c].nullable for c in cols) and tuple(cols) not in keys:
            keys.append(tuple(cols))
    return keys


def _sort(kind: str, ctx: z3.Context) -> z3.SortRef:
    if kind in ("integer", "date"):
        return z3.IntSort(ctx)
    if kind == "numeric":
        return z3.RealSort(ctx)
    if kind == "boolean":
        return z3.BoolSort(ctx)
    return z3.StringSort(ctx)


class _Formula:
    """Φ_{Q,N} / Ψ_{Q,N} for one query, one table of interest and one N."""

    def __init__(
        self, query: SPJ, catalog: Catalog, positions: Sequence[int], key_of: dict[str, list[tuple[str, ...]]]
    ) -> None:
        self.query, self.catalog, self.n = query, catalog, 0
        self.positions = positions  # the uses of J that hold the table of interest
        self.key_of = key_of
        # a context of its own: formulas left in a shared context slow the solver down run after run
        self.ctx = z3.Context()
        # constraints by row: built once per search, each N's solver takes the first N rows (rebuilding the
        # rows for every N cost more than solving them)
        self.pending: list[z3.BoolRef] = []
        self.base: list[z3.BoolRef] = []
        self.rows: list[z3.BoolRef] = []
        self.vars: dict[tuple[Any, ...], z3.ExprRef] = {}
        self.approximated: list[str] = []
        self.fresh = 0
        self.table_of = {u.alias: catalog.table(u.table) for u in query.uses}
        self.funcs: dict[tuple[str, tuple[str, ...], str], z3.FuncDeclRef] = {}
        self.outputs: dict[str, z3.FuncDeclRef] = {}  # untranslatable output columns
        self.predicates: dict[str, z3.FuncDeclRef] = {}  # LIKE patterns (:meth:`_like`)
        self.years: dict[tuple[int, str], z3.ArithRef] = {}  # EXTRACT(YEAR …) per row (:meth:`_year`)
        self.string_code: z3.FuncDeclRef | None = None  # strings' places in the rows' order (:meth:`_code`)
        self.string_decode: z3.FuncDeclRef | None = None

    # -- variables ----------------------------------------------------------------------------------

    def var(self, row: Any, alias: str, column: str) -> z3.ExprRef:
        """x[n, j, k] (row = n) or y[k] (row = "y", alias = the table's name)."""
        key = (row, alias, column)
        if key not in self.vars:
            table = self.table_of[alias] if row != "y" else self.catalog.table(alias)
            col = table.column(column)
            self.vars[key] = v = z3.Const(f"x_{row}_{alias}_{column}", _sort(col.kind, self.ctx))
            self.pending.extend(_domain(col, v))
        return self.vars[key]

    def columns(self, table: Table) -> list[str]:
        """The columns whose values identify a row: a key's (the rest depend on it), or all of them."""
        keys = self.key_of[table.name]
        return list(keys[0]) if keys else list(table.columns)

    # -- constraints ---------------------------------------------------------------------------------

    def start(self) -> None:
        """The parts of Φ that do not grow with N: y's own key dependencies."""
        q = self.query
        self.target = q.uses[self.positions[0]].table
        self.mentioned: dict[str, set[str]] = {}
        for e in (*q.conditions, *q.projections):
            for c in e.find_all(exp.Column):
                self.mentioned.setdefault(c.table, set()).add(c.name)
        self.last: list[z3.ExprRef] | None = None
        self.fixed = (
            _determined(q, self.key_of, self.table_of, q.uses[self.positions[0]].alias)
            if len(self.positions) == 1
            else set()
        )
        y_table = self.catalog.table(self.target)
        for use in q.uses:
            if use.table == self.target:
                self._dependencies(y_table, use.alias, "y", self.target)
                break
        self.base, self.pending = self.pending, []

    def add_row(self) -> None:
        """Row N + 1 of Φ_{Q,N+1} (NR §3.3.13.4): Φ_{N+1} is Φ_N and the new row's constraints, so one solver
        checks N = 1, 2, … incrementally and keeps what it learnt."""
        q, r = self.query, self.n
        self.n += 1
        for u in q.uses:  # every row's identity, so that a model names whole rows
            for c in self.columns(self.table_of[u.alias]):
                self.var(r, u.alias, c)
        for cond in q.conditions:
            self.pending.append(self.boolean(cond, r))
        # the row contains y at one of the table's uses (second constraint)
        y_table = self.catalog.table(self.target)
        self.pending.append(
            z3.Or(
                *(
                    z3.And(
                        *(
                            self.var(r, q.uses[j].alias, c) == self.var("y", self.target, c)
                            for c in self.columns(y_table)
                        )
                    )
                    for j in self.positions
                )
            )
        )
        # the key determines the row (third constraint)
        for u in q.uses:
            self._dependencies(self.table_of[u.alias], u.alias, r, u.alias)
        # distinct rows, of the product (bag) or of the output (set): here in strictly increasing lexicographic
        # order, which is the distinctness of NR's g and leaves one of the N! orders of a model to search
        # (symmetry breaking: 10× to 100× faster than g); numbers first, whose order the solver decides fastest.
        # Values that every derivative row shares (``self.fixed``, :func:`_determined`) cannot tell rows apart
        # and are left out: the same formula up to equivalence, with less for the solver to order.
        if q.semantics == "bag":
            values = [
                self.var(r, u.alias, c)
                for u in q.uses
                for c in self.columns(self.table_of[u.alias])
                if (u.alias, c) not in self.fixed
            ]
        else:
            values = [self.output(p, r) for p in q.projections if not self._fixed_output(p)]
        ordered = [self._code(v) if z3.is_string(v) else _orderable(v) for v in sorted(values, key=z3.is_string)]
        if self.last is not None:
            # no value left to differ in: one derivative row at most (Φ_{Q,2} is unsatisfiable)
            self.pending.append(_lex_less(self.last, ordered) if ordered else z3.BoolVal(False, self.ctx))
        self.last = ordered
        self.rows.append(z3.And(*self.pending))
        self.pending = []

    def _code(self, v: z3.ExprRef) -> z3.ArithRef:
        """A string's place in the rows' order: an integer code with an inverse (so distinct strings get
        distinct codes), ordered as integers. Any finite set of strings has such a code, so this orders the rows
        as the strings' own order would, and z3 decides integer order far faster than str.< (TPC-H Q7's
        nation names, 2-3× faster)."""
        if self.string_code is None:
            self.string_code = z3.Function("code", v.sort(), z3.IntSort(self.ctx))
            self.string_decode = z3.Function("decode", z3.IntSort(self.ctx), v.sort())
        assert self.string_decode is not None
        c = self.string_code(v)
        self.pending.append(self.string_decode(c) == v)
        return c

    def solver(self, n: int) -> z3.Solver:
        """A fresh solver for Φ_{Q,n} (n ≤ the rows built)."""
        solver = z3.Solver(ctx=self.ctx)
        solver.set("random_seed", 0)  # the same answer and time for the same formula
        solver.add(*self.base, *self.rows[:n])
        return solver

    def _fixed_output(self, p: exp.Expr) -> bool:
        """An output that is the same on every derivative row: a translatable term (pure arithmetic, no
        volatile function) over columns every derivative row shares."""
        columns = list(p.find_all(exp.Column))
        if not columns or any((c.table, c.name) not in self.fixed for c in columns):
            return False
        try:
            self.term(p, 0)
        except _Untranslatable:
            return False
        return True

    def _dependencies(self, table: Table, alias: str, row: Any, var_alias: str) -> None:
        """x[·, ℓ] = f[T, K, ℓ](x[·, K]) for the columns the formula reads, for every key K of T."""
        deps = set(self.mentioned.get(alias, ())) | {c for k in self.key_of[table.name] for c in k}
        for key in self.key_of[table.name]:
            for col in sorted(deps - set(key)):
                f = self._function(table, key, col)
                self.pending.append(self.var(row, var_alias, col) == f(*(self.var(row, var_alias, k) for k in key)))

    def _function(self, table: Table, key: tuple[str, ...], col: str) -> z3.FuncDeclRef:
        name = (table.name, key, col)
        if name not in self.funcs:
            sorts = [_sort(table.column(k).kind, self.ctx) for k in key]
            result = _sort(table.column(col).kind, self.ctx)
            self.funcs[name] = z3.Function(f"f_{table.name}_{'_'.join(key)}_{col}", *sorts, result)
        return self.funcs[name]

    # -- SQL → z3 ------------------------------------------------------------------------------------

    def boolean(self, e: exp.Expr, r: int) -> z3.BoolRef:
        try:
            return self._boolean(e, r)
        except _Untranslatable as why:
            # a free Boolean admits every database the filter admits: the bound stays an upper bound
            if str(why) not in self.approximated:
                self.approximated.append(str(why))
            self.fresh += 1
            return z3.Bool(f"free_{self.fresh}", self.ctx)

    def _boolean(self, e: exp.Expr, r: int) -> z3.BoolRef:
        if isinstance(e, exp.Paren):
            return self.boolean(e.this, r)
        if isinstance(e, exp.And):
            return z3.And(self.boolean(e.this, r), self.boolean(e.expression, r))
        if isinstance(e, exp.Or):
            return z3.Or(self.boolean(e.this, r), self.boolean(e.expression, r))
        if isinstance(e, exp.Not):
            # NOT of a free Boolean is free: translate the inside strictly, so that NOT keeps its meaning
            return z3.Not(self._boolean(e.this, r))
        if isinstance(e, exp.Boolean):
            return z3.BoolVal(bool(e.this), self.ctx)
        if isinstance(e, exp.Between):
            pad = self._padded(e.this, e.args["low"], e.args["high"])
            x = self.term(e.this, r, pad)
            return z3.And(
                self._compare(exp.GTE, x, self.term(e.args["low"], r, pad)),
                self._compare(exp.LTE, x, self.term(e.args["high"], r, pad)),
            )
        if isinstance(e, exp.In) and not e.args.get("query"):
            pad = self._padded(e.this, *e.expressions)
            x = self.term(e.this, r, pad)
            return z3.Or(*(self._compare(exp.EQ, x, self.term(v, r, pad)) for v in e.expressions))
        if isinstance(e, (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE)):
            pad = self._padded(e.this, e.expression)
            return self._compare(type(e), self.term(e.this, r, pad), self.term(e.expression, r, pad))
        if isinstance(e, exp.Column) and self._kind(e) == "boolean":
            return self.term(e, r)
        if isinstance(e, (exp.Like, exp.ILike)) and isinstance(e.expression, exp.Literal) and e.expression.is_string:
            return self._like(e, r)
        raise _Untranslatable(e.sql(dialect="postgres"))

    def _like(self, e: exp.Like | exp.ILike, r: int) -> z3.BoolRef:
        """``s [I]LIKE 'pattern'`` as an uninterpreted predicate of s, one per (operator, pattern): LIKE is one
        such function, so every database the filter admits is a model (sound); and one value gets one answer on
        every row, which a fresh Boolean per row would not keep. Not exact (the solver may pick a function no
        pattern has), said so. Strict in NULL as LIKE is, so the NULL argument of the module docstring holds."""
        s = self.term(e.this, r)
        if not z3.is_string(s):
            raise _Untranslatable(e.sql(dialect="postgres"))
        name = f"{type(e).__name__.lower()} {e.expression.this!r}"
        if name not in self.predicates:
            self.predicates[name] = z3.Function(f"like_{len(self.predicates)}", s.sort(), z3.BoolSort(self.ctx))
        self._approximate(f"{e.sql(dialect='postgres')} (an uninterpreted predicate of the value)")
        return self.predicates[name](s)

    def _approximate(self, why: str) -> None:
        if why not in self.approximated:
            self.approximated.append(why)

    def _compare(self, op: type, a: z3.ExprRef, b: z3.ExprRef) -> z3.BoolRef:
        a, b = _coerce(a, b)
        if z3.is_string(a) and op not in (exp.EQ, exp.NEQ):
            raise _Untranslatable("an order of strings (it follows the collation)")
        if a.sort() != b.sort():
            raise _Untranslatable("a comparison of different types")
        table: dict[type, Callable[[Any, Any], Any]] = {
            exp.EQ: lambda x, y: x == y,
            exp.NEQ: lambda x, y: x != y,
            exp.GT: lambda x, y: x > y,
            exp.GTE: lambda x, y: x >= y,
            exp.LT: lambda x, y: x < y,
            exp.LTE: lambda x, y: x <= y,
        }
        return table[op](a, b)

    def output(self, e: exp.Expr, r: int) -> z3.ExprRef:
        """An output column of row r; one the translation does not cover is an uninterpreted function of the
        row's identity (its uses' keys): any function the SQL computes is one of them, so the bound may only grow
        (said so), and one row still has one output."""
        try:
            return self.term(e, r)
        except _Untranslatable as why:
            if str(why) not in self.approximated:
                self.approximated.append(str(why))
            ident = [self.var(r, u.alias, c) for u in self.query.uses for c in self.columns(self.table_of[u.alias])]
            name = e.sql(dialect="postgres")
            if name not in self.outputs:
                self.outputs[name] = z3.Function(
                    f"out_{len(self.outputs)}", *(v.sort() for v in ident), z3.IntSort(self.ctx)
                )
            return self.outputs[name](*ident)

    def _kind(self, c: exp.Column) -> str:
        return self.table_of[c.table].column(c.name).kind

    def _padded(self, *sides: exp.Expr) -> bool:
        """Whether a comparison is between CHAR(n) values, which PostgreSQL compares without trailing blanks:
        then a literal loses its trailing blanks (CHAR values are modelled without them, :func:`_domain`).
        CHAR against VARCHAR or TEXT columns is not translated (which of the two rules applies depends on
        PostgreSQL's choice of operator)."""
        kinds = {
            _bpchar(self.table_of[c.table].column(c.name).type_sql)
            for side in sides
            for c in [side.unnest()]
            if isinstance(c, exp.Column) and self._kind(c) == "text"
        }
        if len(kinds) > 1:
            raise _Untranslatable("a comparison of CHAR(n) with VARCHAR or TEXT")
        return kinds == {True}

    def term(self, e: exp.Expr, r: int, pad: bool = False) -> z3.ExprRef:
        if isinstance(e, exp.Paren):
            return self.term(e.this, r, pad)
        if isinstance(e, exp.Column):
            column = self.table_of[e.table].column(e.name)
            if column.kind == "other" or (column.kind == "numeric" and not _exact_numeric(column.type_sql)):
                # floating-point arithmetic rounds; real arithmetic would decide some filters wrongly
                raise _Untranslatable(f"{e.sql(dialect='postgres')} ({column.type_sql})")
            return self.var(r, e.table, e.name)
        if isinstance(e, exp.Literal):
            if e.is_string:
                return z3.StringVal(e.this.rstrip(" ") if pad else e.this, self.ctx)
            text = e.this
            return z3.IntVal(int(text), self.ctx) if text.lstrip("-").isdigit() else z3.RealVal(text, self.ctx)
        if isinstance(e, exp.Neg):
            return -self.term(e.this, r)
        if isinstance(e, exp.Placeholder):
            # a released value of an earlier workflow step (NR §3.2.1.1; :mod:`model_check_workflow`): one number
            # for every row, unknown here, so one variable the solver may choose (the largest derivative over all)
            return z3.Real(f"released_{e.name}", self.ctx)
        days = _date_constant(e)
        if days is not None:
            return z3.IntVal(days, self.ctx)
        if isinstance(e, (exp.Add, exp.Sub, exp.Mul)):
            a, b = _coerce(self.term(e.this, r), self.term(e.expression, r))
            if z3.is_string(a) or a.sort() != b.sort():
                raise _Untranslatable(e.sql(dialect="postgres"))
            if isinstance(e, exp.Add):
                return a + b
            if isinstance(e, exp.Sub):
                return a - b
            return a * b
        if isinstance(e, exp.Extract) and self._is_date(e.expression):
            part = e.this.name.upper()
            if part == "YEAR":
                return self._year(e, r)
            if part in ("MONTH", "DAY"):
                return _civil(self.term(e.expression, r))[part]
        if isinstance(e, exp.Substring):
            return self._substring(e, r)
        if isinstance(e, exp.Case):
            return self._case(e, r)
        raise _Untranslatable(e.sql(dialect="postgres"))

    def _year(self, e: exp.Extract, r: int) -> z3.ArithRef:
        """EXTRACT(YEAR FROM d): the proleptic year Y with Jan 1 of Y ≤ d < Jan 1 of Y + 1 (:func:`_january_1`),
        a variable per row and expression, defined by its two bounds; PostgreSQL calls year 0 (1 BC) −1. Exact,
        and easier for the solver than the day → year arithmetic of :func:`_civil`: two bounds on d, each linear
        in Y and three floor divisions of Y, decide "three distinct years in two calendar years" at once where
        the era arithmetic ran out of 5 s (TPC-H Q7 w.r.t. supplier)."""
        key = (r, e.sql(dialect="postgres"))
        if key not in self.years:
            d = self.term(e.expression, r)
            y = z3.Int(f"year_{len(self.years)}", self.ctx)
            self.years[key] = z3.If(y <= 0, y - 1, y)
            self.pending += [_january_1(y) <= d, d < _january_1(y + 1)]
            # implied bounds: a conjunct that bounds the date by constants bounds its year (the solver would
            # derive them through the floor divisions, slowly); the years of the constants, from Python's dates
            lo, hi = _date_bounds(e.expression, self.query.conditions)
            if lo is not None:
                self.pending.append(y >= (_EPOCH + dt.timedelta(days=lo)).year)
            if hi is not None:
                self.pending.append(y <= (_EPOCH + dt.timedelta(days=hi)).year)
        return self.years[key]

    def _is_date(self, e: exp.Expr) -> bool:
        e = e.unnest()
        if isinstance(e, exp.Column):
            return self._kind(e) == "date"
        return _date_constant(e) is not None

    def _substring(self, e: exp.Substring, r: int) -> z3.ExprRef:
        """``SUBSTRING(s FROM a FOR b)`` with literal a ≥ 1, b ≥ 0: the characters a … a + b − 1 of s (fewer when
        s is shorter), which is z3's str.substr(s, a − 1, b) exactly. A CHAR(n) value is read as text without its
        trailing blanks, as PostgreSQL's bpchar → text cast does and as :func:`_domain` models it."""
        s = self.term(e.this, r)
        start, length = e.args.get("start"), e.args.get("length")
        if not (
            z3.is_string(s)
            and isinstance(start, exp.Literal)
            and isinstance(length, exp.Literal)
            and all(not x.is_string and x.this.isdigit() for x in (start, length))
        ):
            raise _Untranslatable(e.sql(dialect="postgres"))
        a, b = int(start.this), int(length.this)
        if a < 1:
            raise _Untranslatable(e.sql(dialect="postgres"))
        return z3.SubString(s, a - 1, b)

    def _case(self, e: exp.Case, r: int) -> z3.ExprRef:
        """``CASE WHEN c1 THEN v1 … ELSE v0 END`` as nested If, when no column it reads can be NULL: CASE is not
        monotone in Kleene's logic (an unknown condition takes the ELSE branch, a fresh value in place of the
        NULL might not), so the NULL argument of the module docstring needs NOT NULL here. A condition the
        translation cannot read is a free Boolean (:meth:`boolean`): the value is then one of the branches, as it
        is in SQL, so the bound stays an upper bound."""
        columns = list(e.find_all(exp.Column))
        if e.args.get("this") is not None or e.args.get("default") is None:
            raise _Untranslatable(e.sql(dialect="postgres"))
        if any(self.table_of[c.table].column(c.name).nullable for c in columns):
            raise _Untranslatable(f"{e.sql(dialect='postgres')} (reads a nullable column)")
        value = self.term(e.args["default"], r)
        for branch in reversed(e.args["ifs"]):
            then = self.term(branch.args["true"], r)
            then, value = _coerce(then, value)
            if then.sort() != value.sort():
                raise _Untranslatable(e.sql(dialect="postgres"))
            value = z3.If(self.boolean(branch.this, r), then, value)
        return value


def _orderable(v: z3.ExprRef) -> z3.ExprRef:
    """A value under a strict total order z3 knows (strings by code points, false < true)."""
    return z3.If(v, z3.IntVal(1, v.ctx), z3.IntVal(0, v.ctx)) if z3.is_bool(v) else v


def _lex_less(a: Sequence[z3.ExprRef], b: Sequence[z3.ExprRef]) -> z3.BoolRef:
    if len(a) == 1:
        return a[0] < b[0]
    return z3.Or(a[0] < b[0], z3.And(a[0] == b[0], _lex_less(a[1:], b[1:])))


def _exact_numeric(type_sql: str) -> bool:
    head = type_sql.upper()
    return head.startswith(("DECIMAL", "NUMERIC"))


def _bpchar(type_sql: str) -> bool:
    """CHAR(n) (PostgreSQL's bpchar): blank-padded, compared without trailing blanks."""
    return type_sql.upper().split("(")[0].strip() in ("CHAR", "CHARACTER", "BPCHAR", "NCHAR")


_INT_BITS = {"SMALLINT": 16, "INT2": 16, "SMALLSERIAL": 16, "BIGINT": 64, "INT8": 64, "BIGSERIAL": 64}


def _domain(column: Any, v: z3.ExprRef) -> list[z3.BoolRef]:
    """The values PostgreSQL stores in ``column``: integers in their type's range, NUMERIC(p, s) on its grid of
    10^−s below 10^(p−s), strings of at most n characters for (VAR)CHAR(n), CHAR values without trailing blanks
    (PostgreSQL drops them), dates within PostgreSQL's range. Every database satisfies these, so adding them
    keeps the bound an upper bound; without them a model could need values no table can hold (a 2^40 in an
    INTEGER, 1/3 in a DECIMAL(15,2)), and "exact" and the witness would claim a database that does not exist."""
    head = column.type_sql.upper().split("(")[0].strip()
    args = [int(a) for a in re.findall(r"\d+", column.type_sql.partition("(")[2])]
    if column.kind == "integer":
        bits = _INT_BITS.get(head, 32)
        known = [v >= column.bounds[0], v <= column.bounds[1]] if column.bounds is not None else []
        return [v >= -(2 ** (bits - 1)), v < 2 ** (bits - 1), *known]
    if column.kind == "date":
        # PostgreSQL's dates: 4713-11-24 BC (Julian day 0) … 5874897-12-31, as days since 2000-01-01
        return [v >= -2451545, v <= 2145031948]
    if column.kind == "numeric" and _exact_numeric(column.type_sql) and args:
        precision, scale = args[0], args[1] if len(args) > 1 else 0
        grid = v * (10**scale)
        # (NUMERIC also holds NaN, which is left out: NR models numbers only; see the module docstring)
        return [z3.IsInt(grid), grid < 10**precision, grid > -(10**precision)]
    if column.kind == "text":
        out = []
        if args and head in ("CHAR", "CHARACTER", "BPCHAR", "NCHAR", "VARCHAR", "CHARACTER VARYING", "NVARCHAR"):
            out.append(z3.Length(v) <= args[0])
        if _bpchar(column.type_sql):
            out.append(z3.Not(z3.SuffixOf(z3.StringVal(" ", v.ctx), v)))
        return out
    return []


# days from 0000-03-01 (proleptic Gregorian) to 2000-01-01, the model's day 0
_MARCH_0 = 730425


def _date_bounds(e: exp.Expr, conditions: Sequence[exp.Expr]) -> tuple[int | None, int | None]:
    """Constant bounds lo ≤ e ≤ hi (days) that top-level conjuncts put on the column ``e``, within Python's years
    (None where there is none): ``e BETWEEN a AND b``, ``e >= a``, ``e > a``, ``e <= b``, ``e < b``."""
    e = e.unnest()
    if not isinstance(e, exp.Column):
        return None, None
    lo: int | None = None
    hi: int | None = None

    def const(x: exp.Expr) -> int | None:
        try:
            days = _date_constant(x.unnest())
        except _Untranslatable:
            return None
        return days if days is not None and -730_000 < days < 2_900_000 else None  # Python's years 1 … 9999

    def is_e(x: exp.Expr) -> bool:
        x = x.unnest()
        return isinstance(x, exp.Column) and (x.table, x.name) == (e.table, e.name)

    for cond in conditions:
        for part in _split(cond):
            bounds: list[tuple[str, int | None]] = []
            if isinstance(part, exp.Between) and is_e(part.this):
                bounds = [("lo", const(part.args["low"])), ("hi", const(part.args["high"]))]
            elif isinstance(part, (exp.GTE, exp.GT, exp.LTE, exp.LT)):
                a, b = part.this, part.expression
                upper = isinstance(part, (exp.LTE, exp.LT))
                if is_e(a):
                    bounds = [("hi" if upper else "lo", const(b))]
                elif is_e(b):
                    bounds = [("lo" if upper else "hi", const(a))]
            for side, v in bounds:
                if v is None:
                    continue
                if side == "lo":
                    lo = v if lo is None else max(lo, v)
                else:
                    hi = v if hi is None else min(hi, v)
    return lo, hi


def _january_1(year: z3.ArithRef) -> z3.ArithRef:
    """Jan 1 of a proleptic Gregorian year as days since 2000-01-01: 365 a year and a leap day for every leap
    year in between, the leap years up to x being ⌊x/4⌋ − ⌊x/100⌋ + ⌊x/400⌋ (floor division, so for every x)."""
    x = year - 1
    return 365 * (year - 2000) + x / 4 - x / 100 + x / 400 - 484


def _civil(days: z3.ArithRef) -> dict[str, z3.ArithRef]:
    """EXTRACT(YEAR / MONTH / DAY) of a date given as days since 2000-01-01, exactly as PostgreSQL computes it
    (proleptic Gregorian calendar; year 0 is 1 BC, which PostgreSQL calls −1). Integer division by constants
    only (linear integer arithmetic: z3 decides it), after H. Hinnant's "chrono-Compatible Low-Level Date
    Algorithms" (days_from_civil's inverse): 400-year eras of 146,097 days, years counted from March so the
    leap day ends a year. z3's ``/`` on integers with a positive divisor is floor division, as the era needs.
    Exact, so a sensitivity over it is the true one; the year is a step function of the day, monotone."""
    z = days + _MARCH_0
    era = z / 146097
    doe = z - era * 146097  # day of the era, 0 … 146096
    yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365  # year of the era, 0 … 399
    doy = doe - (365 * yoe + yoe / 4 - yoe / 100)  # day of the March-based year, 0 … 365
    mp = (5 * doy + 2) / 153  # March-based month, 0 … 11
    day = doy - (153 * mp + 2) / 5 + 1
    month = z3.If(mp < 10, mp + 3, mp - 9)
    year = yoe + era * 400 + z3.If(month <= 2, 1, 0)
    return {"YEAR": z3.If(year <= 0, year - 1, year), "MONTH": month, "DAY": day}


def _coerce(a: z3.ExprRef, b: z3.ExprRef) -> tuple[z3.ExprRef, z3.ExprRef]:
    if z3.is_int(a) and z3.is_real(b):
        return z3.ToReal(a), b
    if z3.is_real(a) and z3.is_int(b):
        return a, z3.ToReal(b)
    return a, b


def _date_constant(e: exp.Expr) -> int | None:
    """A constant date (DATE 'y-m-d', ± INTERVAL of days, months or years, PostgreSQL's month arithmetic) as days
    since 2000-01-01; None when ``e`` is not one."""
    if isinstance(e, exp.Cast) and e.to.is_type(exp.DataType.Type.DATE) and isinstance(e.this, exp.Literal):
        try:
            return (dt.date.fromisoformat(e.this.this) - _EPOCH).days
        except ValueError:
            raise _Untranslatable(e.sql(dialect="postgres")) from None
    if isinstance(e, (exp.Add, exp.Sub)) and isinstance(e.expression, exp.Interval):
        base = _date_constant(e.this)
        if base is None:
            return None
        interval = e.expression
        amount_node, unit = interval.this, (interval.unit.name if interval.unit is not None else "").upper()
        try:
            amount = int(amount_node.this if isinstance(amount_node, exp.Literal) else "x")
        except ValueError:
            raise _Untranslatable(e.sql(dialect="postgres")) from None
        sign = 1 if isinstance(e, exp.Add) else -1
        day = _EPOCH + dt.timedelta(days=base)
        if unit.startswith("DAY"):
            return base + sign * amount
        months = {"MONTH": 1, "YEAR": 12}.get(unit.rstrip("S"))
        if months is None:
            raise _Untranslatable(e.sql(dialect="postgres"))
        total = day.year * 12 + day.month - 1 + sign * amount * months
        year, month = divmod(total, 12)
        # PostgreSQL clamps the day to the end of the month (date '2000-01-31' + interval '1 month' = 2000-02-29)
        try:
            last = (dt.date(year + (month + 1) // 12, (month + 1) % 12 + 1, 1) - dt.timedelta(days=1)).day
            return (dt.date(year, month + 1, min(day.day, last)) - _EPOCH).days
        except (ValueError, OverflowError):  # beyond the years Python's dates cover
            raise _Untranslatable(e.sql(dialect="postgres")) from None
    return None


# -- the search for N ---------------------------------------------------------------------------------


class _Search(NamedTuple):
    bound: float  # (the least N with Φ_{Q,N} proven unsatisfiable) − 1, or ∞
    reached: bool  # Φ_{bound} was satisfiable: the theorems then give "the sensitivity is exactly bound"
    approximated: list[str]
    witness: Witness | None  # from the largest satisfiable N checked
    timed_out: bool  # a check ran out of time: the bound is what was proven before (∞ if nothing was)


def _search(
    query: SPJ,
    catalog: Catalog,
    positions: Sequence[int],
    key_of: dict[str, list[tuple[str, ...]]],
    budget: Budget,
    cap: int,
    *,
    proven_above: bool = False,
) -> _Search:
    """bound = (the least N with Φ_{Q,N} proven unsatisfiable) − 1, ∞ when Φ_{cap+1} is satisfiable or the
    solver runs out of time before any N is proven unsatisfiable (a check it cannot finish proves nothing).
    ``proven_above``: the caller has proven the sensitivity at most ``cap`` (the fast method's sum, §3.3.13.6),
    so Φ_{cap+1} is unsatisfiable without a check (its check was the slowest: TPC-H Q7 w.r.t. nation, 3 s).

    Φ_{N+1} satisfiable implies Φ_N satisfiable (drop a row), so N doubles until a formula is unsatisfiable
    and is then bisected: O(log N) checks where NR's linear search needs N. The rows are translated once;
    each N gets a fresh solver over the first N of them: z3's incremental mode (one solver, rows added
    between checks, or push/pop) was 10–50× slower here, as it gives up the preprocessing of a fresh check."""
    found: tuple[z3.ModelRef, int] | None = None
    f = _Formula(query, catalog, positions, key_of)
    f.start()

    def check(n: int) -> z3.CheckSatResult:
        nonlocal found
        if proven_above and n > cap:
            return z3.unsat
        while len(f.rows) < n:
            f.add_row()
        if budget.left <= 0:
            return z3.unknown
        solver = f.solver(n)
        result = budget.check(solver)
        if result == z3.sat and (found is None or n > found[1]):
            found = (solver.model(), n)
        return result

    def out(bound: float, reached: bool, timed_out: bool = False) -> _Search:
        w = _witness(f, query, positions, found[0], found[1]) if found is not None else None
        return _Search(bound, reached, list(f.approximated), w, timed_out)

    sat_at, n = 0, 1
    while True:
        if n > cap + 1:
            return out(math.inf, False)
        result = check(n)
        if result == z3.unsat:
            break
        if result != z3.sat:
            return out(math.inf, False, True)
        sat_at, n = n, (n * 2 if n < cap + 1 and n * 2 <= cap + 1 else cap + 1 if n < cap + 1 else cap + 2)
    lo, hi = sat_at, n  # Φ_lo satisfiable (or lo = 0), Φ_hi unsatisfiable
    while hi - lo > 1:
        mid = (lo + hi) // 2
        result = check(mid)
        if result == z3.unsat:
            hi = mid
        elif result == z3.sat:
            lo = mid
        else:
            return out(float(hi - 1), False, True)
    return out(float(hi - 1), True)


def _witness(f: _Formula, query: SPJ, positions: Sequence[int], model: z3.ModelRef, n: int) -> Witness:
    target = query.uses[positions[0]].table
    rows: dict[str, dict[tuple[tuple[str, str], ...], dict[str, Any]]] = {}

    def value(v: z3.ExprRef, kind: str) -> Any:
        got = model.eval(v, model_completion=True)
        if kind == "date":
            try:
                return _EPOCH + dt.timedelta(days=got.as_long())
            except OverflowError:  # beyond Python's years 1–9999, inside PostgreSQL's: days since 2000-01-01
                return got.as_long()
        if kind == "integer":
            return got.as_long()
        if kind == "numeric":
            return got.as_fraction()
        if kind == "boolean":
            return z3.is_true(got)
        return got.as_string()

    def add(table: Table, row: Any, alias: str) -> dict[str, Any]:
        out = {}
        for (r, a, c), v in f.vars.items():
            if r == row and a == alias:
                out[c] = value(v, table.column(c).kind)
        for key in f.key_of[table.name]:
            for c in table.columns:
                if c not in out and (table.name, key, c) in f.funcs:
                    args = [f.vars.get((row, alias, k)) for k in key]
                    if all(a is not None for a in args):
                        out[c] = value(f.funcs[(table.name, key, c)](*args), table.column(c).kind)
        ident = tuple(sorted((k, str(v)) for k, v in out.items() if k in f.columns(table)))
        rows.setdefault(table.name, {}).setdefault(ident, out)
        return out

    y = add(f.catalog.table(target), "y", target)
    for r in range(n):
        for u in query.uses:
            add(f.table_of[u.alias], r, u.alias)
    return Witness(n, {t: tuple(v.values()) for t, v in rows.items()}, y)


def _pumpable(query: SPJ, catalog: Catalog, target: str) -> bool:
    """A sound shortcut to ∞: rows of other uses that can be renewed without end (no solver needed).

    Let S be a set of columns of uses other than the target's, such that every atom of F that mentions a
    column of S is a top-level conjunct ``a = b`` with both columns in S, and every use with a column in S has
    a column of S in each of its keys. Given one derivative row, give every class of S (columns equated by
    those conjuncts) a fresh value: F still holds (the conjuncts of S hold within each class, nothing else
    reads S), y is still in the row, each renewed use has a key seen nowhere else (the keys determine rows),
    and the row is new. Repeating this gives any number of distinct derivative rows — distinct outputs too,
    for set semantics, when an output is a column of S. So with Φ_{Q,1} satisfiable the sensitivity is ∞.
    An atom ``a <> b`` of two columns, or of a column and a literal, of one kind may read S too: it held on the
    row, so a and b are not in one class of S, and a fresh value differs from every value there is, so it still
    holds (TPC-H Q21's ``l3.l_suppkey <> l1.l_suppkey``, Q16's ``p_brand <> 'Brand#45'``).
    S is the largest such set: start from every eligible column and drop violators until none is left. Tables
    used twice are left out (one row at both uses would need its renewed columns equal at both)."""
    tables = {u.alias: catalog.table(u.table) for u in query.uses}
    # a table used twice could have one row at both uses, whose renewed columns would have to stay equal: left out
    once = {u.table for u in query.uses if sum(1 for v in query.uses if v.table == u.table) == 1}
    eligible = {
        (u.alias, c)
        for u in query.uses
        if u.table != target and u.table in once
        for c, col in tables[u.alias].columns.items()
        if col.kind in ("integer", "date", "text", "numeric") and col.bounds is None  # fresh values: not in 1 … τ
    }
    conjuncts = [part for cond in query.conditions for part in _split(cond)]
    pairs: list[tuple[tuple[str, str], tuple[str, str]]] = []
    others: list[set[tuple[str, str]]] = []  # the columns of every other atom
    for part in conjuncts:
        if isinstance(part, exp.EQ) and isinstance(part.this, exp.Column) and isinstance(part.expression, exp.Column):
            pairs.append(((part.this.table, part.this.name), (part.expression.table, part.expression.name)))
        elif _plain_inequality(part, tables):
            continue  # a fresh value differs from every other: ``a <> b`` stays true (docstring)
        else:
            others.append({(c.table, c.name) for c in part.find_all(exp.Column)})
    changed = True
    while changed:
        before = len(eligible)
        for cols in others:
            eligible -= cols
        for a, b in pairs:
            if (a in eligible) != (b in eligible):
                eligible -= {a, b}
        for alias, table in tables.items():
            keys = keys_of(table)
            if not keys or any(not any((alias, c) in eligible for c in key) for key in keys):
                eligible -= {(alias, c) for c in table.columns}
        changed = len(eligible) != before
    if not eligible:
        return False
    if query.semantics == "bag":
        return True
    return any(_renewable(p.unnest(), eligible, tables) for p in query.projections)


def _plain_inequality(part: exp.Expr, tables: Mapping[str, Table]) -> bool:
    """``a <> b``: columns (or a column and a literal) whose values z3 compares as themselves."""
    if not isinstance(part, exp.NEQ):
        return False
    a, b = part.this.unnest(), part.expression.unnest()
    if isinstance(b, exp.Column) and not isinstance(a, exp.Column):
        a, b = b, a
    if not isinstance(a, exp.Column) or a.table not in tables:
        return False
    ka = tables[a.table].column(a.name)
    if isinstance(b, exp.Literal):
        return _same_kind_literal(ka, b)
    return isinstance(b, exp.Column) and b.table in tables and _same_kind(ka, tables[b.table].column(b.name))


def _renewable(p: exp.Expr, renewed: set[tuple[str, str]], tables: Mapping[str, Table]) -> bool:
    """An output that takes a new value whenever the renewed columns do (:func:`_pumpable`): one of them, or the
    year of a renewed date (a fresh date can lie in a year not seen yet: PostgreSQL's dates span 5.8 million
    years, far beyond any cap; TPC-H Q9's GROUP BY EXTRACT(YEAR FROM o_orderdate))."""
    if isinstance(p, exp.Column):
        return (p.table, p.name) in renewed
    if isinstance(p, exp.Extract) and p.this.name.upper() == "YEAR":
        d = p.expression.unnest()
        return (
            isinstance(d, exp.Column) and (d.table, d.name) in renewed and tables[d.table].column(d.name).kind == "date"
        )
    return False


def _determined(
    query: SPJ, key_of: Mapping[str, Sequence[tuple[str, ...]]], table_of: Mapping[str, Table], target: str
) -> set[tuple[str, str]]:
    """The columns (alias, column) that are equal on every row of the derivative w.r.t. the table at use
    ``target`` (used once): every derivative row holds y there, so that use's columns are y's; a top-level
    conjunct ``a = b`` (or ``a = literal``) of the same kind makes b (a) fixed when a (b) is; a use whose every
    column of some key is fixed is one row of its table, so all its columns are. (The foreign-key chains of
    TPC-H: w.r.t. lineitem, the order, customer and nation of the row are fixed.) When every value that
    identifies a derivative row is fixed, there is at most one: the "direct combinatorial answer" of keys."""
    fixed = {(target, c) for c in table_of[target].columns}
    links: list[tuple[tuple[str, str], tuple[str, str] | None]] = []
    for cond in query.conditions:
        for part in _implied(cond):
            if not isinstance(part, exp.EQ):
                continue
            a, b = part.this.unnest(), part.expression.unnest()
            if isinstance(b, exp.Column) and not isinstance(a, exp.Column):
                a, b = b, a
            if not isinstance(a, exp.Column) or a.table not in table_of:
                continue
            ka = table_of[a.table].column(a.name)
            if isinstance(b, exp.Literal) and _same_kind_literal(ka, b):
                links.append(((a.table, a.name), None))
            elif isinstance(b, exp.Column) and b.table in table_of:
                kb = table_of[b.table].column(b.name)
                if _same_kind(ka, kb):
                    links.append(((a.table, a.name), (b.table, b.name)))
    changed = True
    while changed:
        before = len(fixed)
        for a, b in links:
            if b is None:
                fixed.add(a)
            elif a in fixed or b in fixed:
                fixed |= {a, b}
        for use in query.uses:
            table = table_of[use.alias]
            if any(all((use.alias, c) in fixed for c in key) for key in key_of[table.name]):
                fixed |= {(use.alias, c) for c in table.columns}
        changed = len(fixed) != before
    return fixed


def _same_kind(a: Any, b: Any) -> bool:
    """Two columns whose equality the translation makes a z3 equality of their values."""
    if a.kind != b.kind or a.kind == "other":
        return False
    if a.kind == "numeric":
        return _exact_numeric(a.type_sql) and _exact_numeric(b.type_sql)
    return a.kind != "text" or _bpchar(a.type_sql) == _bpchar(b.type_sql)


def _same_kind_literal(column: Any, literal: exp.Literal) -> bool:
    if literal.is_string:
        return bool(column.kind == "text")
    if column.kind == "integer":
        return literal.this.lstrip("-").isdigit()
    return column.kind == "numeric" and _exact_numeric(column.type_sql)


def _split(e: exp.Expr) -> list[exp.Expr]:
    e = e.unnest()
    return [*_split(e.this), *_split(e.expression)] if isinstance(e, exp.And) else [e]


def _implied(e: exp.Expr) -> list[exp.Expr]:
    """The conjuncts of e, and for a conjunct ``(A ∧ B) ∨ (A ∧ C) ∨ …`` the conjuncts A that every disjunct has
    (then A holds whenever e does: TPC-H Q19's ``p_partkey = l_partkey`` in each of its three branches)."""
    out = []
    for part in _split(e):
        out.append(part)
        if isinstance(part, exp.Or):
            branches = _disjuncts(part)
            common = {c.sql(): c for c in _implied(branches[0])}
            for b in branches[1:]:
                texts = {c.sql() for c in _implied(b)}
                common = {k: v for k, v in common.items() if k in texts}
            out += common.values()
    return out


def _disjuncts(e: exp.Expr) -> list[exp.Expr]:
    e = e.unnest()
    return [*_disjuncts(e.this), *_disjuncts(e.expression)] if isinstance(e, exp.Or) else [e]


def sensitivity(
    query: SPJ,
    catalog: Catalog,
    table: str,
    *,
    method: Literal["auto", "exact", "fast"] = "auto",
    timeout: float = DEFAULT_TIMEOUT,
    cap: int = DEFAULT_CAP,
    budget: Budget | None = None,
) -> GlobalSensitivity:
    """The global sensitivity of ``query`` w.r.t. adding or removing one row of ``table`` (NR §3.3.13.4–7).
    ``timeout`` is the search's budget in reference seconds (:data:`UNITS_PER_SECOND`), unless ``budget``, the
    caller's, is given: the result does not depend on the machine or its load."""
    t0 = time.perf_counter()
    budget = budget if budget is not None else Budget.of(timeout)
    table = table.lower()
    positions = [j for j, u in enumerate(query.uses) if u.table == table]
    if not positions:
        return GlobalSensitivity(table, 0.0, True, "keys", 0.0)
    loose = _loose_outputs(query, catalog) if query.semantics == "set" else []
    if loose:
        # An output Ψ cannot translate is a function of the row's identity (:meth:`_Formula.output`), free to
        # differ between any two rows; then N rows with distinct outputs exist iff N distinct rows do: Ψ_{Q,N}
        # is Φ_{Q,N}, which the solver decides without ordering strings and functions (TPC-H Q7's GROUP BY
        # EXTRACT(YEAR …) ran out of 30 s as Ψ; as Φ the keys answer at once). An upper bound, said so.
        bag = sensitivity(SPJ(query.uses, query.conditions), catalog, table, method=method, cap=cap, budget=budget)
        approx = (*bag.approximated, *(a for a in loose if a not in bag.approximated))
        return replace(bag, exact=False, approximated=approx, witness=None, seconds=time.perf_counter() - t0)
    key_of = {u.table: keys_of(catalog.table(u.table)) for u in query.uses}
    keyless_other = [u.table for u in query.uses if u.table != table and not key_of[u.table]]
    target_keyless = not key_of[table]

    def done(value: float, exact: bool, how: str, found: _Search | None = None) -> GlobalSensitivity:
        approx = tuple(found.approximated) if found else ()
        return GlobalSensitivity(
            table,
            value,
            exact and not approx,
            how,
            time.perf_counter() - t0,
            approx,
            found.witness if found and exact and math.isfinite(value) else None,
            bool(found and found.timed_out),
        )

    if keyless_other or (target_keyless and len(positions) > 1):
        # Theorem 3.109, cases 3 and 4: repeated rows multiply the derivative without bound, unless it is empty
        relaxed = {t: keys or [tuple(catalog.table(t).columns)] for t, keys in key_of.items()}
        found = _search(query, catalog, positions, relaxed, budget, cap=0)
        if found.bound == 0:
            return done(0.0, True, "duplicates", found)
        why = f"table {keyless_other[0]!r} has no uniqueness constraint" if keyless_other else "repeated rows"
        return done(math.inf, found.witness is not None, f"duplicates ({why})", found)
    if target_keyless:  # case 2: t used once, compare whole rows
        key_of = {**key_of, table: []}
    if _pumpable(query, catalog, table):
        found = _search(query, catalog, positions, key_of, budget, cap=0)
        if found.bound == 0:
            return done(0.0, True, "smt", found)
        return done(math.inf, found.witness is not None, "keys (rows of other tables renew without end)", found)
    if len(positions) == 1 and _one_row(query, catalog, key_of, positions[0]):
        # the keys fix the one row: Φ_2 is unsatisfiable without a check (:func:`_one_row`)
        found = _search(query, catalog, positions, key_of, budget, cap=1, proven_above=True)
        return done(found.bound, found.reached, "keys (they fix the derivative's one row)", found)

    if len(positions) == 1 or method == "exact":
        found = _search(query, catalog, positions, key_of, budget, cap)
        # Theorem 3.110 (b): with set semantics the bound is exact only for a table used once
        exact = found.reached and (query.semantics == "bag" or len(positions) == 1)
        return done(found.bound, exact, "smt", found)

    # §3.3.13.6: each use as a table of its own, then the sum; then the exact formula within the time left
    total, approx_all, timed_out = 0.0, [], False
    for j in positions:
        copy = f"{table}__use{j}"
        renamed = _as_copy(query, catalog, j, copy)
        part = sensitivity(renamed[0], renamed[1], copy, method="exact", cap=cap, budget=budget)
        total += part.value
        approx_all += [a for a in part.approximated if a not in approx_all]
        timed_out |= part.timed_out
        if not math.isfinite(total):
            break  # the sum is ∞ already: the other uses cannot change it
    fast = _Search(total, False, approx_all, None, timed_out)
    if method == "fast" or not math.isfinite(total):
        return done(total, False, "smt-fast", fast)
    found = _search(query, catalog, positions, key_of, budget, min(cap, int(total)), proven_above=total <= cap)
    # the copies' approximations hold for the whole (the exact formula may have been skipped: proven_above)
    found = found._replace(approximated=list(dict.fromkeys([*approx_all, *found.approximated])))
    if found.bound < total or (found.reached and query.semantics == "bag"):
        return done(found.bound, found.reached and query.semantics == "bag", "smt", found)
    return done(total, False, "smt-fast", fast._replace(timed_out=fast.timed_out or found.timed_out))


def _loose_outputs(query: SPJ, catalog: Catalog) -> list[str]:
    """Why each output the translation does not cover is not covered (empty: all are translated)."""
    probe = _Formula(query, catalog, [], {})
    out = []
    for p in query.projections:
        try:
            probe.term(p, 0)
        except _Untranslatable as why:
            out.append(str(why))
    return out


def _one_row(query: SPJ, catalog: Catalog, key_of: Mapping[str, Sequence[tuple[str, ...]]], position: int) -> bool:
    """Whether the keys alone fix every value that tells derivative rows apart (:func:`_determined`): then at
    most one row holds y, and only Φ_{Q,1} is left to decide (0 or 1)."""
    table_of = {u.alias: catalog.table(u.table) for u in query.uses}
    fixed = _determined(query, key_of, table_of, query.uses[position].alias)
    if query.semantics == "bag":
        return all(
            (u.alias, c) in fixed
            for u in query.uses
            for c in (key_of[u.table][0] if key_of[u.table] else table_of[u.alias].columns)
        )
    return all(isinstance(p, exp.Column) and (p.table, p.name) in fixed for p in query.projections)


def _as_copy(query: SPJ, catalog: Catalog, position: int, copy: str) -> tuple[SPJ, Catalog]:
    use = query.uses[position]
    original = catalog.table(use.table)
    tables = dict(catalog.tables)
    tables[copy] = Table(copy, original.columns, original.primary_key, original.foreign_keys, original.unique)
    uses = tuple(Use(u.alias, copy) if j == position else u for j, u in enumerate(query.uses))
    return SPJ(uses, query.conditions, query.projections, query.semantics), Catalog(tables, catalog.source)


# -- from sqldp's forms -------------------------------------------------------------------------------


def from_form(form: Any, *, grouped: bool | None = None) -> SPJ:
    """The join–filter part of an analysis form (:class:`sqldp.form.AnalysisForm`). Without GROUP BY it is the
    bag query whose derivative's size bounds a COUNT; with GROUP BY, the set query over the group keys, whose
    derivative's size is the number of groups one row can change (Theorem 3.111)."""
    uses = tuple(Use(u.alias, u.table) for u in form.uses)
    conditions = tuple(c.expr for c in form.conjuncts)
    if grouped if grouped is not None else bool(form.group_by):
        return SPJ(uses, conditions, tuple(form.group_by), "set")
    return SPJ(uses, conditions)


def from_select(tree: exp.Expr) -> SPJ:
    """A qualified ``SELECT [DISTINCT] … FROM … [JOIN … ON …] WHERE … [GROUP BY …]`` block.

    A derived table in FROM that is itself a join–filter–project block (TPC-H Q7–Q9) is inlined:
    ``FROM (SELECT e AS c … FROM A WHERE F) AS T, B WHERE G`` is the product A × B filtered by F ∧ G[T.c := e],
    row for row (each combined row is one row of A and one of B), so the derivative w.r.t. every table is the
    same bag. Other nesting (subqueries in WHERE, aggregated or DISTINCT derived tables, WITH, set operations)
    and outer joins are refused: they need the workflow transformations of NR §4.3.6.1 / §3.3.13.9."""
    if not isinstance(tree, exp.Select):
        raise ValueError("only SELECT blocks (set operations need the workflow transformations of NR §3.3.13.9)")
    if tree.args.get("with") is not None:
        raise ValueError("WITH needs the workflow transformations of NR §4.3.6.1")
    uses, conditions, _ = _block(tree, inner=False)
    aliases = [u.alias for u in uses]
    if len(set(aliases)) != len(aliases):
        raise ValueError("a derived table reuses an alias of the query around it")
    derived = _derived(tree)
    projections = tuple(_substitute(e.this if isinstance(e, exp.Alias) else e, derived) for e in tree.expressions)
    semantics: Semantics = "set" if tree.args.get("distinct") is not None or tree.args.get("group") else "bag"
    if tree.args.get("group") is not None:
        projections = tuple(_substitute(e, derived) for e in tree.args["group"].expressions)
    return SPJ(tuple(uses), tuple(conditions), projections, semantics)


_NESTED = (exp.Select, exp.Subquery, exp.Exists, exp.Union, exp.Intersect, exp.Except, exp.With)


def _sources(select: exp.Select) -> list[exp.Expr]:
    from_ = select.args.get("from_") or select.args.get("from")
    if from_ is None:
        raise ValueError("a SELECT without FROM")
    joins = select.args.get("joins") or []
    for j in joins:
        side, kind = (j.args.get("side") or "").upper(), (j.args.get("kind") or "").upper()
        if side or kind in ("SEMI", "ANTI", "OUTER", "LATERAL") or j.args.get("using"):
            # an outer join adds NULL-padded rows when y removes a row's last match: not a join–filter query
            raise ValueError(f"{' '.join(p for p in (side, kind) if p) or 'USING'} JOIN is not a join–filter query")
    return [from_.this, *(j.this for j in joins)]


def _derived(select: exp.Select) -> dict[str, dict[str, exp.Expr]]:
    """Per derived table of ``select``'s FROM: its output names → their expressions over its own tables."""
    out = {}
    for src in _sources(select):
        if isinstance(src, exp.Subquery) and isinstance(src.this, exp.Select):
            inner = _derived(src.this)
            out[src.alias_or_name] = {
                e.alias_or_name: _substitute(e.this if isinstance(e, exp.Alias) else e, inner)
                for e in src.this.expressions
            }
    return out


def _substitute(e: exp.Expr, derived: Mapping[str, Mapping[str, exp.Expr]]) -> exp.Expr:
    def swap(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.Column) and node.table in derived:
            inner = derived[node.table][node.name].copy()
            return inner if isinstance(inner, exp.Column) else exp.Paren(this=inner)
        return node

    return e.copy().transform(swap)


def _block(select: exp.Select, *, inner: bool) -> tuple[list[Use], list[exp.Expr], None]:
    """The uses and filter conjuncts of a block, derived tables inlined (their columns substituted)."""
    if inner and (
        any(select.args.get(a) for a in ("group", "having", "distinct", "limit", "offset", "qualify", "with"))
        or select.find(exp.AggFunc, exp.Window) is not None
    ):
        raise ValueError("a derived table that aggregates or limits needs the workflow transformations (NR §4.3.6.1)")
    uses: list[Use] = []
    conditions: list[exp.Expr] = []
    for src in _sources(select):
        if isinstance(src, exp.Table) and not src.args.get("db"):
            uses.append(Use(src.alias_or_name, src.name.lower()))
        elif isinstance(src, exp.Subquery) and isinstance(src.this, exp.Select):
            u, c, _ = _block(src.this, inner=True)
            uses += u
            conditions += c
        else:
            raise ValueError("only tables and join–filter derived tables in FROM")
    own = [j.args["on"] for j in select.args.get("joins") or () if j.args.get("on") is not None]
    if select.args.get("where") is not None:
        own.append(select.args["where"].this)
    rest = [*own, *select.expressions, *(select.args["group"].expressions if select.args.get("group") else ())]
    if select.args.get("having") is not None:
        rest.append(select.args["having"])
    if any(isinstance(n, _NESTED) for e in rest for n in e.walk()):
        raise ValueError("only single-block queries (subqueries need the workflow transformations of NR §4.3.6.1)")
    derived = _derived(select)
    conditions += [_substitute(c, derived) for c in own]
    return uses, conditions, None


def query_sensitivity(
    tree: exp.Expr,
    catalog: Catalog,
    table: str,
    *,
    timeout: float = DEFAULT_TIMEOUT,
    cap: int = DEFAULT_CAP,
    budget: Budget | None = None,
) -> GlobalSensitivity:
    """The global sensitivity of a qualified query: a block (:func:`from_select`) or a set operation of blocks.

    Set operations (NR §3.3.13.9): an output row's membership in A ∪ B, A ∩ B, A − B is a function of its
    membership in A and in B, and its multiplicity in UNION ALL, INTERSECT ALL, EXCEPT ALL (m_A + m_B,
    min(m_A, m_B), max(m_A − m_B, 0)) changes by at most the changes of m_A and m_B. So the rows one row of t
    changes are at most S_A + S_B, each branch by Ψ over its select list (the set forms, Theorem 3.110) or Φ
    (the ALL forms). An upper bound: the two worst cases need not happen in one database."""
    budget = budget if budget is not None else Budget.of(timeout)
    if isinstance(tree, exp.Subquery):
        return query_sensitivity(tree.this, catalog, table, cap=cap, budget=budget)
    if not isinstance(tree, exp.SetOperation):
        return sensitivity(from_select(tree), catalog, table, cap=cap, budget=budget)
    if tree.args.get("limit") is not None or tree.args.get("offset") is not None:
        raise ValueError("LIMIT over a set operation keeps rows the data chooses: not a join–filter query")
    t0 = time.perf_counter()
    distinct = bool(tree.args.get("distinct"))
    parts = []
    for side in (tree.this, tree.expression):
        inner = side.this if isinstance(side, exp.Subquery) else side
        if isinstance(inner, exp.Select) and (inner.args.get("group") or inner.find(exp.AggFunc) is not None):
            # a group whose aggregate changes is one row out and another in: not the rows Ψ counts
            raise ValueError("an aggregating branch of a set operation needs the workflow transformations")
        if isinstance(inner, exp.Select) and distinct:
            spj = from_select(inner)
            spj = SPJ(spj.uses, spj.conditions, spj.projections if spj.semantics == "set" else _listed(inner), "set")
            parts.append(sensitivity(spj, catalog, table, cap=cap, budget=budget))
        elif isinstance(inner, exp.Select):
            spj = from_select(inner)
            if spj.semantics == "set":  # a DISTINCT or grouped branch under ALL: its distinct rows
                parts.append(sensitivity(spj, catalog, table, cap=cap, budget=budget))
            else:
                parts.append(sensitivity(SPJ(spj.uses, spj.conditions), catalog, table, cap=cap, budget=budget))
        else:
            part = query_sensitivity(inner, catalog, table, cap=cap, budget=budget)
            # a nested set operation's rows are distinct when it is a set form; its bound counts rows either way
            parts.append(part)
    value = parts[0].value + parts[1].value
    approx = tuple(dict.fromkeys(a for p in parts for a in p.approximated))
    exact = all(p.exact for p in parts) and min(p.value for p in parts) == 0
    kind = type(tree).__name__.upper() + ("" if distinct else " ALL")
    return GlobalSensitivity(
        table.lower(),
        value,
        exact and not approx,
        f"sum over {kind} (NR §3.3.13.9)",
        time.perf_counter() - t0,
        approx,
        next((p.witness for p in parts if p.value > 0), None) if exact else None,
        any(p.timed_out for p in parts),
    )


def _listed(select: exp.Select) -> tuple[exp.Expr, ...]:
    derived = _derived(select)
    return tuple(_substitute(e.this if isinstance(e, exp.Alias) else e, derived) for e in select.expressions)


def for_form(form: Any, catalog: Catalog, tables: Sequence[str], *, timeout: float = DEFAULT_TIMEOUT) -> dict[str, Any]:
    """Per table: how many join rows one of its rows can change (what a COUNT over the join moves, Φ) and,
    with GROUP BY, how many groups (Ψ over the keys, Theorem 3.111). Data-independent: safe to show anyone."""
    bag = from_form(form, grouped=False)
    out: dict[str, Any] = {}
    for table in tables:
        entry = {"join_rows": sensitivity(bag, catalog, table, timeout=timeout).to_json()}
        if form.group_by:
            entry["groups"] = sensitivity(from_form(form, grouped=True), catalog, table, timeout=timeout).to_json()
        out[table] = entry
    return out
