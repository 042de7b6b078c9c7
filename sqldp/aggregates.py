"""One table of the SQL aggregates sqldp answers, each as an expression over the primitive aggregates.

The analyses bound four primitive aggregates over the filtered product — COUNT, SUM, MIN and MAX
(:class:`sqldp.form.Aggregate`; NR §3.3.7.3 and §3.3.8.3). Every SQL aggregate sqldp answers is an expression
over those: the normaliser (:mod:`sqldp.normalize`) replaces each call by its entry's expression, in which each
primitive aggregate stands as a placeholder ``__agg<i>``. Each primitive aggregate is its own measurement, ε
split equally among them (sequential composition, NR §3.3.10.4), and the expression is computed on their
noisy values (:func:`sqldp.release.evaluate`): post-processing, which keeps the guarantee (Dwork & Roth,
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

    * ``measure(kind, arg)`` — the placeholder of the primitive aggregate ``kind(arg)`` (``arg`` None: COUNT(*)),
      measured once per query however often the rules ask for it;
    * ``declared_range(arg)`` — the policy's range [lo, hi] when ``arg`` is a numeric column with one, else None;
    * ``note(text)`` — records a rewrite for ``explain`` and the result's notes;
    * ``refuse(why)`` — the error to raise, placed at the aggregate call."""

    measure: Callable[[AggKind, exp.Expr | None], exp.Expr]
    declared_range: Callable[[exp.Expr], Range | None]
    note: Callable[[str], None]
    refuse: Callable[[str], RefusedError]


Rule = Callable[[Lift, exp.Expr], exp.Expr]  # (context, the aggregate call) → expression over placeholders


@dataclass(frozen=True)
class AggregateRule:
    """One SQL aggregate: its name as SQL spells it, where its rewriting comes from, and its rule."""

    name: str
    section: str
    lift: Rule


def clamp(e: exp.Expr, lo: float, hi: float | None) -> exp.Expr:
    """GREATEST(lo, LEAST(hi, e)) (without ``hi``: GREATEST(lo, e)), computed on the noisy values."""
    inner = e if hi is None else exp.Least(this=number(hi), expressions=[e])
    return exp.Greatest(this=number(lo), expressions=[inner])


# -- the rules ---------------------------------------------------------------------------------------------


def _primitive(kind: AggKind) -> Rule:
    """COUNT(e), SUM(e), MIN(e), MAX(e): the primitive aggregate itself."""

    def lift(c: Lift, node: exp.Expr) -> exp.Expr:
        return c.measure(kind, node.this)

    return lift


def _count(c: Lift, node: exp.Expr) -> exp.Expr:
    star = node.this is None or isinstance(node.this, exp.Star)
    return c.measure("count", None if star else node.this)


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


# -- the table ----------------------------------------------------------------------------------------------

AGGREGATES: dict[type[exp.Expr], AggregateRule] = {
    exp.Count: AggregateRule("COUNT", "NR §3.3.7.3, §3.3.8.3 (a primitive aggregate)", _count),
    exp.Sum: AggregateRule("SUM", "NR §3.3.7.3, §3.3.8.3 (a primitive aggregate)", _primitive("sum")),
    exp.Avg: AggregateRule(
        "AVG",
        "NR §3.3.10.4 (SUM and COUNT, two measurements); centred on the declared range as Tumult Analytics and "
        "SmartNoise SQL do",
        _avg,
    ),
    exp.Min: AggregateRule("MIN", "NR §3.3.8.3 (Min / max; a primitive aggregate)", _primitive("min")),
    exp.Max: AggregateRule("MAX", "NR §3.3.8.3 (Min / max; a primitive aggregate)", _primitive("max")),
}


def lookup(node: exp.Expr) -> AggregateRule | None:
    """The entry of the aggregate call ``node`` (by its exact class: sqlglot has one class per aggregate), or None."""
    return AGGREGATES.get(type(node))


def supported() -> str:
    """The aggregates the table answers, in table order, for the refusals that list them."""
    return ", ".join(dict.fromkeys(rule.name for rule in AGGREGATES.values()))
