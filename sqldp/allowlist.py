"""What an analyst's statement may contain: the allow-list of functions, operators, casts and constructs.

Every statement sqldp runs for an analyst, public or private, is checked here before anything reaches the
database. PostgreSQL runs a statement with the rights of sqldp's connection, and many of its built-in functions
read or change server state rather than the tables the policy governs: files (``pg_read_file``,
``pg_ls_dir``), table statistics and sizes (``pg_stat_*``, ``pg_relation_size``, which reveal private row
counts exactly), settings (``current_setting``, ``set_config``), large objects, sequences, sleeps and other
volatile functions whose effects or timing depend on the data. None of them is covered by a sensitivity
analysis, so none may run: the differential-privacy guarantee (NR §3.3.2) only covers what is computed from
the policy's tables by the operators the analyses model.

The list is keyed by sqlglot expression class (one class per built-in the parser recognises) and, for
functions sqlglot does not know (``exp.Anonymous``), by lower-case name. It is meant to become the single
operator table of sqldp; the private path's stricter list of functions defined for every value
(``sensitivity.failures``) applies on top of it. Anything not listed is refused with the function's name
and position: an unknown function is never assumed harmless.
"""

from __future__ import annotations

from sqlglot import exp

from sqldp.errors import ForbiddenError, RefusedError

# Structure of a single read-only SELECT: clauses, names, literals, set operations and subqueries. Not here
# (so refused): SELECT … INTO (creates a table), FOR UPDATE/SHARE (exp.Lock takes row locks), TABLESAMPLE,
# LATERAL, table functions, aggregate FILTER clauses (the analyses do not model them; sqldp.frontend.rewrite_filters
# writes those of the aggregates that skip NULLs as CASE first), exp.Dot
# (schema-qualified functions and field selection), arrays and subscripts, parameters, and any construct a
# future sqlglot adds.
STRUCTURE: frozenset[type[exp.Expr]] = frozenset(
    {
        exp.Select, exp.From, exp.Join, exp.Where, exp.Group, exp.Having, exp.Order, exp.Ordered,
        exp.Limit, exp.Offset, exp.Column, exp.Identifier, exp.Table, exp.TableAlias, exp.Alias, exp.Star,
        exp.Literal, exp.Null, exp.Boolean, exp.Paren, exp.Subquery, exp.With, exp.CTE, exp.Union,
        exp.Intersect, exp.Except, exp.Values, exp.Tuple, exp.Distinct, exp.DataType, exp.DataTypeParam,
        exp.Interval, exp.Window, exp.WindowSpec,
    }
)  # fmt: skip

# Operators: comparisons, logic, arithmetic, string concatenation, pattern matching with LIKE (no regular
# expressions: their cost grows with the pattern in ways a statement timeout would reveal).
OPERATORS: frozenset[type[exp.Expr]] = frozenset(
    {
        exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.NullSafeEQ, exp.NullSafeNEQ, exp.Is,
        exp.And, exp.Or, exp.Not, exp.Neg, exp.Add, exp.Sub, exp.Mul, exp.Div, exp.Mod, exp.IntDiv, exp.DPipe,
        exp.Like, exp.ILike, exp.Between, exp.In, exp.Exists, exp.Any, exp.All,
    }
)  # fmt: skip

# Functions sqlglot recognises: immutable or stable, no side effects, read nothing but their arguments.
# Aggregates and window functions over rows the statement read are included; what the private path can
# analyse is decided by the normaliser, not here.
FUNCTIONS: frozenset[type[exp.Expr]] = frozenset(
    {
        # aggregates
        exp.Count, exp.Sum, exp.Avg, exp.Min, exp.Max, exp.Stddev, exp.StddevPop, exp.StddevSamp,
        exp.Variance, exp.VariancePop, exp.LogicalAnd, exp.LogicalOr, exp.GroupConcat, exp.Corr,
        exp.CovarSamp, exp.CovarPop, exp.PercentileCont, exp.PercentileDisc,
        # window functions
        exp.RowNumber, exp.Rank, exp.DenseRank, exp.PercentRank, exp.CumeDist, exp.Ntile, exp.Lag, exp.Lead,
        exp.FirstValue, exp.LastValue, exp.NthValue,
        # conditionals and casts (cast targets are checked against TYPES)
        exp.Case, exp.If, exp.Coalesce, exp.Nullif, exp.Greatest, exp.Least, exp.Cast,
        # arithmetic
        exp.Abs, exp.Round, exp.Ceil, exp.Floor, exp.Sqrt, exp.Cbrt, exp.Exp, exp.Ln, exp.Log, exp.Pow,
        exp.Sign, exp.Trunc, exp.Degrees, exp.Radians, exp.Pi, exp.Sin, exp.Cos, exp.Tan, exp.Asin, exp.Acos,
        exp.Atan, exp.Atan2, exp.Cot, exp.Sinh, exp.Cosh, exp.Tanh, exp.WidthBucket,
        # strings (no REPEAT/LPAD/RPAD: one call can ask for gigabytes)
        exp.Upper, exp.Lower, exp.Length, exp.Substring, exp.Trim, exp.Concat, exp.Replace, exp.Left,
        exp.Right, exp.SplitPart, exp.StrPosition, exp.Initcap, exp.Reverse, exp.Translate, exp.Ascii,
        exp.Chr, exp.MD5,
        # dates and times; CURRENT_DATE and CURRENT_TIMESTAMP are the transaction's start, fixed before any
        # row is read (clock_timestamp(), which moves while the statement works, is not listed)
        exp.Extract, exp.TimestampTrunc, exp.DateTrunc, exp.StrToDate, exp.StrToTime, exp.TimeToStr,
        exp.ToChar, exp.ToNumber, exp.MakeInterval, exp.JustifyDays, exp.JustifyHours, exp.JustifyInterval,
        exp.CurrentDate, exp.CurrentTimestamp,
    }
)  # fmt: skip

# Built-ins sqlglot parses as exp.Anonymous, by PostgreSQL name.
ANONYMOUS: frozenset[str] = frozenset(
    {
        "age", "make_date", "make_time", "make_interval", "justify_days", "justify_hours",
        "justify_interval", "isfinite", "date_part", "gcd", "lcm", "octet_length", "bit_length",
        "char_length", "character_length", "every", "btrim", "to_number", "scale", "trim_scale",
    }
)  # fmt: skip

# Ordinary types a cast may target. Not listed: the reg* and OID types (``'orders'::regclass`` looks a
# relation up in the system catalogs), user-defined types, xml/json (functions reading the catalogs hide
# behind their input routines) and anything else.
TYPES: frozenset[exp.DType] = frozenset(
    {
        exp.DataType.Type.SMALLINT, exp.DataType.Type.INT, exp.DataType.Type.BIGINT,
        exp.DataType.Type.DECIMAL, exp.DataType.Type.FLOAT, exp.DataType.Type.DOUBLE,
        exp.DataType.Type.BOOLEAN, exp.DataType.Type.TEXT, exp.DataType.Type.VARCHAR,
        exp.DataType.Type.CHAR, exp.DataType.Type.NCHAR, exp.DataType.Type.NVARCHAR,
        exp.DataType.Type.DATE, exp.DataType.Type.TIME, exp.DataType.Type.TIMETZ,
        exp.DataType.Type.TIMESTAMP, exp.DataType.Type.TIMESTAMPTZ, exp.DataType.Type.INTERVAL,
    }
)  # fmt: skip

# Unquoted words PostgreSQL reads as functions of the session (SQL-standard "value functions") although
# sqlglot takes them for column names: a column ``user`` must be written ``"user"``.
SESSION_WORDS = frozenset(
    {"user", "current_user", "session_user", "current_role", "system_user", "current_catalog", "current_schema"}
)

_SET_NAMES: dict[type[exp.Expr], str] = {exp.Rollup: "ROLLUP", exp.Cube: "CUBE", exp.GroupingSets: "GROUPING SETS"}

# Where a bare word (exp.Var) is a keyword argument rather than something PostgreSQL would resolve.
_VAR_PARENTS = (exp.Interval, exp.Extract, exp.TimestampTrunc, exp.DateTrunc, exp.WindowSpec)

ALLOWED: frozenset[type[exp.Expr]] = STRUCTURE | OPERATORS | FUNCTIONS

# Grouping sets (GROUP BY ROLLUP / CUBE / GROUPING SETS and GROUPING()): read-only and side-effect free, so a
# statement over public tables only runs them as written; no private-path analysis models one row counted in
# several groupings (its sensitivity is the number of grouping sets times one grouping's), so over a private
# table they stay refused.
PUBLIC_ONLY: frozenset[type[exp.Expr]] = frozenset({exp.Rollup, exp.Cube, exp.GroupingSets, exp.Grouping})


def _name(node: exp.Expr, sql: str = "") -> str:
    start, end = node.meta.get("start"), node.meta.get("end")
    if sql and start is not None and end is not None and isinstance(node, exp.Func):
        return sql[start : end + 1].lower()  # the name as written: version(), not sqlglot's current_version()
    if isinstance(node, exp.Anonymous):
        return str(node.this).lower()
    if isinstance(node, exp.Func):
        return node.sql_name().lower()
    return node.key.upper()


def refusal(node: exp.Expr, sql: str = "", *, public: bool = False) -> str | None:
    """Why ``node`` (one node, not its children) may not run, or None when it may; ``public``: the statement
    reads public tables only (:data:`PUBLIC_ONLY` may run)."""
    kind = type(node)
    if kind in PUBLIC_ONLY:
        what = "GROUPING()" if kind is exp.Grouping else f"GROUP BY {_SET_NAMES[kind]}"
        return None if public else f"{what} is answered over public tables only, not over a private table"
    if kind is exp.Anonymous:
        name = str(node.this).lower()
        return None if name in ANONYMOUS else f"function {name}() is not on sqldp's allow-list"
    if kind is exp.Var:
        return None if isinstance(node.parent, _VAR_PARENTS) else f"the bare word {node.name!r} is not allowed"
    if type(node) is exp.Column and not node.table:  # written out: mypy narrows type(node), not kind
        ident = node.this
        if isinstance(ident, exp.Identifier) and not ident.quoted and ident.name.lower() in SESSION_WORDS:
            return f"{ident.name.lower()} reads the server's session state; quote it if it is a column"
    if kind is exp.DataType:
        if node.this not in TYPES:
            return f"type {node.sql(dialect='postgres')} is not on sqldp's allow-list of types"
        return None
    if kind is exp.Cast:
        to = node.args.get("to")
        if not isinstance(to, exp.DataType):  # reg* / OID types are exp.ObjectIdentifier
            return f"a cast to {to.sql(dialect='postgres') if to is not None else '?'} is not allowed"
        return None
    if kind in ALLOWED:
        return None
    if kind is exp.ObjectIdentifier:
        return f"the {node.name} type reads the system catalogs and is not allowed"
    if kind is exp.Lock:
        return "SELECT … FOR UPDATE/SHARE takes locks and is not allowed"
    if kind is exp.Into:
        return "SELECT … INTO creates a table and is not allowed"
    if isinstance(node, exp.Func):
        return f"function {_name(node, sql)}() is not on sqldp's allow-list"
    return f"{node.key.upper()} is not supported"


def check(sql: str, tree: exp.Expr, *, public: bool = False) -> None:
    """Refuse ``tree`` unless every node is allowed; the error names the first offender and its position.
    ``public``: the statement reads public tables only. Iterative (``walk`` is breadth-first over an explicit
    queue), so a deep tree cannot overflow the stack."""
    from sqldp.frontend import position  # frontend imports this module

    for node in tree.walk(bfs=True):
        why = refusal(node, sql, public=public)
        if why is not None:
            error = ForbiddenError if isinstance(node, (exp.Func, exp.ObjectIdentifier)) else RefusedError
            raise error(why, where=position(sql, node))
