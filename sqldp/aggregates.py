"""One table of the SQL aggregates sqldp answers, each as an expression over the primitive aggregates.

The analyses bound four primitive aggregates over the filtered product — COUNT, SUM, MIN and MAX
(:class:`sqldp.form.Aggregate`; NR §3.3.7.3 and §3.3.8.3). Every SQL aggregate sqldp answers is an expression
over those: the normaliser (:mod:`sqldp.normalize`) replaces each call by its entry's expression, in which each
primitive aggregate stands as a placeholder ``__agg<i>``. Each primitive aggregate is its own measurement, ε
split equally among them (sequential composition, NR §3.3.10.4), and the expression is computed on their
noisy values (:func:`sqldp.postprocess.evaluate`): post-processing, which keeps the guarantee (Dwork & Roth,
"The Algorithmic Foundations of Differential Privacy", Prop. 2.1).

An entry (:class:`AggregateRule`) is keyed by sqlglot's expression class for the aggregate and gives its name
in messages, where its rewriting comes from, and the rule that writes the expression. Adding an aggregate is
adding its entry; the refusal of one that is missing lists the table (:func:`supported`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sqlglot import exp

from sqldp.errors import RefusedError
from sqldp.form import AggKind
from sqldp.sqlgen import number

Range = tuple[float, float]


@dataclass(frozen=True)
class Lift:
    """What a rule is given by the normaliser.

    * ``measure(kind, arg, distinct=False)`` — the placeholder of the primitive aggregate ``kind(arg)`` (``arg``
      None: COUNT(*); ``distinct``: COUNT(DISTINCT arg)),
      measured once per query however often the rules ask for it;
    * ``declared_range(arg)`` — the policy's range [lo, hi] when ``arg`` is a numeric column with one, else None;
    * ``non_negative(arg)`` — whether ``arg`` is at least 0 on every row by the declared ranges;
    * ``note(text)`` — records a rewrite for ``explain`` and the result's notes;
    * ``refuse(why)`` — the error to raise, placed at the aggregate call."""

    measure: Callable[..., exp.Expr]  # (kind, arg, distinct=False)
    declared_range: Callable[[exp.Expr], Range | None]
    non_negative: Callable[[exp.Expr], bool]
    note: Callable[[str], None]
    refuse: Callable[[str], RefusedError]


Rule = Callable[[Lift, exp.Expr], exp.Expr]  # (context, the aggregate call) → expression over placeholders


@dataclass(frozen=True)
class AggregateRule:
    """One SQL aggregate: its name as SQL spells it, where its rewriting comes from, and its rule."""

    name: str
    section: str
    lift: Rule
    also: tuple[str, ...] = ()  # other spellings PostgreSQL has for the same aggregate (VARIANCE is VAR_SAMP)


def clamp(e: exp.Expr, lo: float, hi: float | None) -> exp.Expr:
    """GREATEST(lo, LEAST(hi, e)) (without ``hi``: GREATEST(lo, e)), computed on the noisy values."""
    inner = e if hi is None else exp.Least(this=number(hi), expressions=[e])
    return exp.Greatest(this=number(lo), expressions=[inner])


COUNT_NOTE = "COUNT → the nearest integer, at least 0 (post-processing)"
SUM_NOTE = "SUM(e) of an e ≥ 0 on every row (by the declared ranges) → at least 0 (post-processing)"


def counted(e: exp.Expr) -> exp.Expr:
    """CAST(GREATEST(0, ROUND(e)) AS BIGINT): a noisy count as the non-negative integer every count is, of
    PostgreSQL's type for COUNT (so that ``COUNT(*) / 2`` truncates, sqldp.postprocess). Post-processing (Dwork &
    Roth, Prop. 2.1); its error bar is the measurement's plus 0.5 for the rounding (sqldp.release.error_bar)."""
    rounded = exp.Greatest(this=number(0), expressions=[exp.Round(this=e)])
    return exp.Cast(this=rounded, to=exp.DataType.build("BIGINT"))


# -- the rules ---------------------------------------------------------------------------------------------


def _primitive(kind: AggKind) -> Rule:
    """SUM(e), MIN(e), MAX(e): the primitive aggregate itself."""

    def lift(c: Lift, node: exp.Expr) -> exp.Expr:
        return c.measure(kind, node.this)

    return lift


def _sum(c: Lift, node: exp.Expr) -> exp.Expr:
    """SUM(e), clamped at 0 when e is at least 0 on every row: the true sum (over e with every column clamped to
    its declared range, sqldp.sensitivity.intervals) is then at least 0, and moving the noisy value onto
    [0, ∞), a convex set holding it, never moves it away from the truth (post-processing)."""
    s = c.measure("sum", node.this)
    if not c.non_negative(node.this):
        return s
    c.note(SUM_NOTE)
    return clamp(s, 0, None)


def _count(c: Lift, node: exp.Expr) -> exp.Expr:
    """COUNT(*), COUNT(e), COUNT(DISTINCT e), released as non-negative integers (:func:`counted`)."""
    if isinstance(node.this, exp.Distinct):
        args = node.this.expressions
        if len(args) != 1:
            raise c.refuse("COUNT(DISTINCT …) of one expression is supported")
        n = c.measure("count", args[0], True)
    else:
        star = node.this is None or isinstance(node.this, exp.Star)
        n = c.measure("count", None if star else node.this)
    c.note(COUNT_NOTE)
    return counted(n)


def _avg(c: Lift, node: exp.Expr) -> exp.Expr:
    arg = node.this
    bounds = c.declared_range(arg)
    if bounds is None:
        c.note("AVG → SUM/COUNT")
        return exp.Paren(this=exp.Div(this=c.measure("sum", arg), expression=c.measure("count", arg)))
    # Centred, as the peers do (Tumult Analytics, SmartNoise SQL): AVG(x) = m + SUM(x − m)/COUNT(x) for the
    # midpoint m of x's declared range [lo, hi]; a row then moves the sum by at most (hi − lo)/2 instead of
    # max(|lo|, |hi|). The released ratio is clamped to [lo, hi], where every average of values in the range
    # lies (post-processing of the two noisy aggregates).
    lo, hi = bounds
    mid = number((lo + hi) / 2)
    c.note(f"AVG → {mid.sql()} + SUM(x − {mid.sql()})/COUNT(x), clamped to [{lo:g}, {hi:g}]")
    s = c.measure("sum", exp.Sub(this=arg.copy(), expression=mid.copy()))
    n = c.measure("count", arg)
    return clamp(exp.Add(this=mid, expression=exp.Div(this=s, expression=n)), lo, hi)


def _spread(name: str, sample: bool, root: bool) -> Rule:
    """VAR_POP, VAR_SAMP (VARIANCE) and their square roots STDDEV_POP, STDDEV_SAMP (STDDEV) of x from three
    measurements, n = COUNT(x), s1 = SUM(x − m) and s2 = SUM((x − m)²), as the peers compute them: SmartNoise
    SQL's rewriter writes SUM(x·x)/COUNT(x) − (SUM(x)/COUNT(x))² and STDDEV as its SQRT, Tumult Core's
    create_variance_measurement centres the sums on the midpoint of the clamping bounds and clamps the result.

    The variance does not change when every value moves by m, so VAR_POP = s2/n − (s1/n)² for any m. With m the
    midpoint of x's declared range [lo, hi] (a column with a range, as AVG), a row moves s1 by at most
    h = (hi − lo)/2 and s2 by at most h² (the analyses find these bounds themselves: the row-level interval
    of (x − m)·(x − m) over [lo, hi] is within [−h², h²]), against max(|lo|, |hi|) and its square uncentred.
    Every population variance of values in [lo, hi] lies in [0, h²] (Popoviciu's inequality on variances; half
    the values at each end reach h²), so the released VAR_POP is clamped there. The sample variance is
    n/(n − 1)·VAR_POP: at most n/(n − 1)·h², which is 2h² at n = 2, so it is computed from the clamped VAR_POP
    and clamped to [0, 2h²], where every sample variance of values in the range lies.

    Without a declared range (an expression argument, say) m is 0: s2 = SUM(x·x), a sum like any other, which
    the analyses bound from the ranges of the columns it reads (max |x|² under row-level privacy) or refuse as
    they would SUM(x·x) written by hand, so the rewriting is as sound as the analyses; only the noise is
    larger. The released variance is then clamped below at 0 only.

    As PostgreSQL returns NULL for VAR_POP of no rows and VAR_SAMP of fewer than two, the release is NULL when
    the noisy n is at most 0 (VAR_POP) or 1 (VAR_SAMP). Each step is arithmetic on the three noisy values:
    post-processing (module docstring)."""

    def lift(c: Lift, node: exp.Expr) -> exp.Expr:
        arg = node.this
        bounds = c.declared_range(arg)
        if bounds is None:
            dev, top, centre = arg.copy(), None, ""
        else:
            lo, hi = bounds
            mid = number((lo + hi) / 2)
            dev, top, centre = exp.Sub(this=arg.copy(), expression=mid), ((hi - lo) / 2) ** 2, f" − {mid.sql()}"
        factor = dev if isinstance(dev, exp.Column) else exp.Paren(this=dev)
        n = c.measure("count", arg)
        s1 = c.measure("sum", dev)
        s2 = c.measure("sum", exp.Mul(this=factor, expression=factor.copy()))
        mean = exp.Paren(this=exp.Div(this=s1, expression=n.copy()))
        pop = exp.Sub(this=exp.Div(this=s2, expression=n.copy()), expression=exp.Mul(this=mean, expression=mean.copy()))
        value = clamp(pop, 0, top)
        square = f"(x{centre})²" if centre else "x²"
        text = f"SUM({square})/n − (SUM(x{centre})/n)² with n = COUNT(x), " + (
            "at least 0" if top is None else f"clamped to [0, {top:g}]"
        )
        if sample:
            correction = exp.Paren(
                this=exp.Div(this=n.copy(), expression=exp.Paren(this=exp.Sub(this=n.copy(), expression=number(1))))
            )
            value = exp.Mul(this=correction, expression=value)
            text = f"n/(n − 1) × ({text})"
            if top is not None:
                value = exp.Least(this=number(2 * top), expressions=[value])
                text += f", at most {2 * top:g}"
        least = 1 if sample else 0
        value = exp.Case(ifs=[exp.If(this=exp.GT(this=n.copy(), expression=number(least)), true=value)])
        text += f"; NULL for n ≤ {least}"
        if root:
            value, text = exp.Sqrt(this=value), f"SQRT({text})"
        c.note(f"{name} → {text}")
        return value

    return lift


# -- the table ----------------------------------------------------------------------------------------------

_SPREAD = (
    "NR §3.3.10.4 (COUNT and two SUMs, three measurements); centred on the declared range and clamped as "
    "Tumult Core's create_variance_measurement, SQRT for STDDEV as SmartNoise SQL's rewriter"
)

AGGREGATES: dict[type[exp.Expr], AggregateRule] = {
    exp.Count: AggregateRule("COUNT", "NR §3.3.7.3, §3.3.8.3 (a primitive aggregate)", _count),
    exp.Sum: AggregateRule("SUM", "NR §3.3.7.3, §3.3.8.3 (a primitive aggregate)", _sum),
    exp.Avg: AggregateRule(
        "AVG",
        "NR §3.3.10.4 (SUM and COUNT, two measurements); centred on the declared range as Tumult Analytics and "
        "SmartNoise SQL do",
        _avg,
    ),
    exp.Min: AggregateRule("MIN", "NR §3.3.8.3 (Min / max; a primitive aggregate)", _primitive("min")),
    exp.Max: AggregateRule("MAX", "NR §3.3.8.3 (Min / max; a primitive aggregate)", _primitive("max")),
    exp.VariancePop: AggregateRule("VAR_POP", _SPREAD, _spread("VAR_POP", sample=False, root=False)),
    exp.Variance: AggregateRule("VAR_SAMP", _SPREAD, _spread("VAR_SAMP", sample=True, root=False), ("VARIANCE",)),
    exp.StddevPop: AggregateRule("STDDEV_POP", _SPREAD, _spread("STDDEV_POP", sample=False, root=True)),
    exp.StddevSamp: AggregateRule("STDDEV_SAMP", _SPREAD, _spread("STDDEV_SAMP", sample=True, root=True)),
    exp.Stddev: AggregateRule("STDDEV", _SPREAD, _spread("STDDEV", sample=True, root=True)),
}


def lookup(node: exp.Expr) -> AggregateRule | None:
    """The entry of the aggregate call ``node`` (by its exact class: sqlglot has one class per aggregate), or None."""
    return AGGREGATES.get(type(node))


def supported() -> str:
    """The aggregates the table answers, in table order, for the refusals that list them."""
    return ", ".join(dict.fromkeys(name for rule in AGGREGATES.values() for name in (rule.name, *rule.also)))
