"""What a query gives back: per aggregate and group a :class:`Measurement`, gathered in a :class:`Result`,
and what of them an analyst may see (docs/output.md, "What each output field reveals")."""

from __future__ import annotations

import dataclasses
import functools
import html
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqldp.errors import InputError, RefusedError
from sqldp.mechanisms.registry import CAUCHY, GAUSSIAN_GLOBAL, LAPLACE_GLOBAL, PUBLIC_SCALE, R2T, R2T_HISTOGRAM

if TYPE_CHECKING:  # sqldp.params imports the mechanisms (scipy, gmpy2): not needed to read a result
    from sqldp.params import PrivacyParams

# the release names a measurement carries (sqldp.mechanisms.registry spells them), under their older names
GLOBAL = LAPLACE_GLOBAL  # the mechanism of a data-independent bound (sqldp.release.calibrate)
GAUSSIAN = GAUSSIAN_GLOBAL  # a query's global bounds released together by one Gaussian vector
UNIT_HISTOGRAM = R2T_HISTOGRAM  # GROUP BY under a privacy unit (docs/units.md)
__all__ = ["GAUSSIAN", "GLOBAL", "PUBLIC_SCALE", "R2T", "UNIT_HISTOGRAM", "Measurement", "Result"]


@dataclass(repr=False)
class Measurement:
    """One aggregate (for one group): its sensitivity, the calibrated noise and, for ``run``, the value."""

    aggregate: str
    epsilon: float
    delta: float | None
    beta: float
    sensitivity: float
    noise_scale: float
    half_width: float
    terms: Mapping[str, Any] = field(repr=False)  # the analysis' per-table terms, as bound
    # a name of sqldp.mechanisms.registry.Name: Laplace on a global bound when the plan's bound is
    # data-independent, the Gaussian vector when the query's global bounds are released as one
    # (sqldp.release.gaussian), else the policy's mechanism; it depends on the query, the policy and (ε, δ)
    # only, so it is released
    mechanism: str = CAUCHY
    true_value: float | None = None  # never released; kept out of every serialisation
    # the noise, for error bars at other confidences (the bars of expressions over several measurements)
    calibration: Any = field(default=None, repr=False)
    noisy_value: float | None = None
    # R2T (mechanism R2T): the unit, GS_Q, the number of races and R2T's β — from the policy and the query,
    # so released — and the thresholds τ_j and the truncated answers Q(I, τ_j), data-dependent: audit only
    unit: Mapping[str, Any] | None = None
    thresholds: tuple[float, ...] = ()
    truncated: tuple[float, ...] = field(default=(), repr=False)
    # GROUP BY under a privacy unit: this group's ℓ1 mass of the truncated contributions at each τ_j (audit only)
    mass: tuple[float, ...] = field(default=(), repr=False)
    # which data-independent bound the noise is calibrated to (sqldp.sensitivity.global_bound.GlobalPlan.source,
    # e.g. the schema's keys, a workflow's composition): a function of the query, the schema and the policy
    bound: str | None = None
    # the selector of groups owned by one row (sqldp.strategies.owned): how many groups one neighbouring change can
    # add or remove — from the query and the schema, so released; None for every other measurement
    owned_groups: int | None = None
    # DP partition selection's count (sqldp.release.selection_threshold): the largest count one neighbouring change
    # can give a group that exists on one side only, at the change's own distance — from the query and the
    # policy, so released; None for every other measurement
    one_sided: float | None = None
    # a smoothed measurement's DP error bar (sqldp.mechanisms.smooth_bar.SmoothBar): ε_b, the smoothness and
    # the noisy log-scale L are released, the true log-scale is not; None: no bar bought (the value is "*")
    bar: Any = field(default=None, repr=False)

    def __repr__(self) -> str:
        """The analyst's view (what :meth:`to_json` gives without audit): a notebook or a log that shows a
        measurement shows no true value, sensitivity or data-dependent noise scale. The data owner reads
        those as attributes, or through ``to_json(audit=True)``."""
        shown = ", ".join(f"{k}={v!r}" for k, v in self.to_json().items())
        return f"Measurement({shown})"

    @functools.cached_property
    def tables(self) -> dict[str, Any]:
        """Per table, what contributed to the sensitivity, JSON-ready. Built when first read: converting the
        terms cost a small query's noisy run a third of its time, and most runs never read them."""
        return {t: _jsonable(term) for t, term in self.terms.items()}

    def to_json(self, *, audit: bool = False) -> dict[str, Any]:
        """Without ``audit`` only what the query, the policy and the noise decide (see docs/output.md, "What each
        output field reveals"): the aggregate, its ε and δ share and the noisy value."""
        if not audit:
            out = {k: getattr(self, k) for k in _RELEASED}
            if self.mechanism in PUBLIC_SCALE:
                # a global bound is a function of the query, the policy and public data: so are its noise
                # scale and error bar, which the analyst may see
                out["noise_scale"], out["half_width"] = self.noise_scale, self.half_width
                if self.bound is not None:
                    out["bound"] = self.bound
            if self.unit is not None:
                out["unit"] = dict(self.unit)
            if self.bar is not None:  # ε_b, β and the noisy L and U: DP (sqldp.mechanisms.smooth_bar)
                out["bar"] = self.bar.to_json()
            return out
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in _UNSERIALISED}
        out["tables"] = self.tables
        if self.bar is not None:
            out["bar"] = {**self.bar.to_json(), "log_scale": self.bar.log_scale}
        else:
            del out["bar"]
        return out


_UNSERIALISED = frozenset({"terms", "true_value", "calibration"})
# data-independent (ε and δ shares depend on the query, the policy and the public group domains only; the
# mechanism on the query and the policy) or noisy
_RELEASED = ("aggregate", "epsilon", "delta", "mechanism", "noisy_value")
AUDIT_WARNING = (
    "AUDIT MODE: the sensitivities, noise scales, error bars, β and per-table figures below are computed from "
    "the private data without noise; they are for the data owner and must not be handed to analysts"
)


@dataclass(repr=False)
class Result:
    sql: str
    params: PrivacyParams | None
    public: bool = False
    test_mode: bool = False
    columns: list[str] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)
    measurements: list[list[Measurement]] = field(default_factory=list)  # [group][aggregate]
    released: bool = False
    timings: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    grouped: bool = False
    # data-owner mode: to_json carries the data-dependent figures too (marked "audit": true). The Python
    # attributes are always there: whoever holds a Session holds the database connection anyway; what an
    # analyst may see is the serialisation (the CLI's output, JSON handed on, the proxy's result set).
    audit: bool = False
    plan: list[dict[str, Any]] = field(default_factory=list)  # analyze without audit: nothing read
    # a workflow's steps (sqldp.strategies.workflow.Workflow): each uncorrelated scalar subquery's own result, released
    # before the statement ran with its value
    steps: list[Result] = field(default_factory=list)

    def __repr__(self) -> str:
        """The analyst's view, as ``sqldp run`` prints it (the noisy answer, ± its bar where that bar is
        data-independent, ε, δ, the mechanism, the notes), whatever ``audit`` says: printing a result — what a
        notebook or a log does by default — shows nothing computed from the private data without noise (the
        dataclass repr showed true values, sensitivities and timings). :meth:`audit_view` is the data owner's."""
        return format_text(self.to_json(audit=False))

    def _repr_html_(self) -> str:
        """The analyst's view for Jupyter (the same text as :meth:`__repr__`, escaped, in a ``<pre>``)."""
        return f"<pre>{html.escape(repr(self))}</pre>"

    def audit_view(self) -> dict[str, Any]:
        """The data owner's view: ``to_json(audit=True)``, with the sensitivities, noise scales, error bars,
        chosen β, per-table terms and timings computed from the private data without noise, marked
        ``"audit": true`` with its warning. Not for analysts (docs/output.md, "What each output field
        reveals"); the true values stay attributes of the measurements only."""
        return self.to_json(audit=True)

    @property
    def answer(self) -> Any:
        """The single noisy value of an ungrouped, single-output query."""
        if self.grouped or not self.rows:
            return None
        # a public answer's rows are plain records (column → value), a released one's keys and values
        values = list(self.rows[0].values()) if self.public else list(self.rows[0]["values"].values())
        return values[0] if len(values) == 1 else None

    def table(self) -> tuple[list[str], list[tuple[Any, ...]]]:
        """The released answer as a result set: column names and rows in output order (for the proxy)."""
        if not self.released:
            raise RefusedError("nothing was released (analyze does not answer)")
        if self.public:
            return self.columns, [tuple(r[c] for c in self.columns) for r in self.rows]
        out = []
        for r in self.rows:
            merged = {**r.get("key", {}), **r["values"]}
            out.append(tuple(merged[c] for c in self.columns))
        return self.columns, out

    def records(self) -> list[dict[str, Any]]:
        """The released rows as flat records, one dict per row in output order: each column by name and, for a
        value with a data-independent error bar, ``<name>_error`` (its half-width at the result's confidence).
        The shape pandas and pyarrow take directly (``pandas.DataFrame(result.records())``)."""
        names, rows = self.table()
        out = []
        for values, row in zip(rows, self.rows, strict=True):
            record = dict(zip(names, values, strict=True))
            record.update({f"{name}_error": bar for name, bar in row.get("errors", {}).items()})
            out.append(record)
        return out

    def to_pandas(self) -> Any:
        """The released rows as a pandas DataFrame (see :meth:`records`); pandas is not a dependency of sqldp."""
        try:
            import pandas
        except ImportError:
            raise InputError("to_pandas needs pandas: pip install pandas (or use result.records())") from None
        return pandas.DataFrame(self.records())

    def _main(self) -> Measurement | None:
        return max((m for group in self.measurements for m in group), key=lambda m: m.noise_scale, default=None)

    def to_json(self, *, audit: bool | None = None) -> dict[str, Any]:
        """The result as JSON. Without audit (the default unless the result was made in audit mode): the noisy
        answer and the data-independent figures only — ε, δ, the mechanism, β when the user fixed it, the
        per-aggregate ε/δ shares. The sensitivity, noise scale, error bar, chosen β (NR Theorem 3.73),
        per-table terms and timings are functions of the private data released without noise, so they
        appear only in audit mode (docs/output.md, "What each output field reveals")."""
        audit = self.audit if audit is None else audit
        p = self.params
        out: dict[str, Any] = {
            "query": self.sql,
            "audit": audit,
            "public": self.public,
            "test_mode": self.test_mode,
            "epsilon": p.epsilon if p else 0.0,
            "delta": p.delta if p else None,
            "beta": p.beta if p else None,  # as given; None: chosen per answer, shown in audit mode only
            "mechanism": self._mechanism(),
            "confidence": p.confidence if p else None,  # of the error bars, where they are shown
            "epsilon_from": p.epsilon_source if p else None,
            "advantage": p.advantage if p else None,
            "measurements": [[m.to_json(audit=audit) for m in group] for group in self.measurements],
            "notes": self.notes,
        }
        if self.plan:
            out["plan"] = self.plan
        if self.steps:
            out["steps"] = [s.to_json(audit=audit) for s in self.steps]
        if audit:
            main = self._main()
            out.update(
                {
                    "warning": AUDIT_WARNING,
                    "beta": main.beta if main else out["beta"],
                    "sensitivity": main.sensitivity if main else 0.0,
                    "noise_scale": main.noise_scale if main else 0.0,
                    "error": self._error(main),
                    "tables": dict(main.tables) if main else {},
                    "timings_ms": {k: round(v * 1000, 3) for k, v in self.timings.items()},
                }
            )
        if self.released:
            if self.grouped or self.public:
                out["rows"] = self.rows
            else:
                out["answer"] = self.answer
                out["values"] = self.rows[0]["values"] if self.rows else {}
                # per released value, ± the half-width of an interval holding the true value at the confidence,
                # where it is data-independent (sqldp.release.error_bar)
                out["errors"] = self.rows[0].get("errors", {}) if self.rows else {}
        return out

    def _mechanism(self) -> str | None:
        """The mechanism the measurements used (data-independent: it follows from the query and the policy);
        before anything is measured (``analyze`` without audit) the one the plan gives each aggregate
        (sqldp.sensitivity.plan.Releasable.mechanism), so that ``analyze`` names what ``run`` will use. The
        policy's only when there is neither."""
        used = sorted({m.mechanism for group in self.measurements for m in group})
        if not used:
            used = sorted({step["mechanism"] for step in self.plan if "mechanism" in step})
        if used:
            return ", ".join(used)
        return self.params.mechanism if self.params else None

    def _error(self, main: Measurement | None) -> dict[str, Any]:
        """The audit's headline error: the released answer's own bar where it has one (an AVG's bar, from its
        COUNT's and centred SUM's by interval arithmetic: sqldp.release.error_bar), else the bar of the noisiest
        measurement; ``of`` names which (an AVG's centred SUM has a bar in its own units, not the AVG's)."""
        conf = self.params.confidence if self.params else None
        if main is None:
            return {"confidence": conf, "absolute": 0.0, "relative": 0.0}
        values = self.rows[0].get("values", {}) if self.rows and not (self.grouped or self.public) else {}
        bars = self.rows[0].get("errors", {}) if values else {}
        name = next(iter(values), None)
        if len(values) == 1 and name in bars:
            of, width, noisy = name, bars[name], values[name]
        else:
            of, width, noisy = main.aggregate, main.half_width, main.noisy_value
        # bar / |noisy answer| understates the error by orders of magnitude when the noise dominates the answer
        # (the noisy value is then mostly noise): no relative figure then, and say so
        dominated = noisy is not None and width >= abs(noisy)
        rel = None if noisy is None or dominated else width / abs(noisy)
        out = {"confidence": conf, "absolute": width, "relative": rel, "of": of}
        if dominated:
            out["noise_dominates"] = True
        return out


def _jsonable(term: Any) -> Any:
    if dataclasses.is_dataclass(term) and not isinstance(term, type):
        return {k: _jsonable(v) for k, v in dataclasses.asdict(term).items()}
    if isinstance(term, Mapping):
        return {str(k): _jsonable(v) for k, v in term.items()}
    if isinstance(term, (list, tuple)):
        return [_jsonable(v) for v in term]
    if isinstance(term, float) and not math.isfinite(term):
        return str(term)
    return term


# -- the text form (what `sqldp run` and `sqldp analyze` print, and what printing a Result shows) --------------


def format_text(out: dict[str, Any]) -> str:
    lines = []
    if out.get("audit"):
        lines.append(out.get("warning") or AUDIT_WARNING)
    if out.get("test_mode"):
        lines.append("TEST MODE: noise drawn from a seeded generator; not private")
    if out["public"]:
        lines.append("public data: answered exactly")
    else:
        beta = f", β = {out['beta']:.4g}" if out.get("beta") is not None else ""
        lines.append(
            f"ε = {out['epsilon']:g}{' (from advantage ' + str(out['advantage']) + ')' if out['advantage'] else ''}"
            # no δ (JSON null) is pure ε-DP: say so rather than print a δ of 0 the JSON does not have
            + (f", δ = {out['delta']:g}" if out["delta"] is not None else " (pure ε-DP)")
            + f"{beta}, mechanism = {out['mechanism']}"
        )
        for step in out.get("plan", []):
            share = f"ε = {step['epsilon']:g}" if step["epsilon"] is not None else "ε divided among the groups"
            lines.append(f"  {step['aggregate']}: {share} ({step['groups']}){_expected(step, out.get('confidence'))}")
            if "unit" in step:
                lines.append(f"    {_unit(step['unit'])}")
        for group in out.get("measurements", [])[:1]:
            lines.extend(f"  {m['aggregate']}: {_unit(m['unit'])}" for m in group if m.get("unit"))
    if not out["public"] and out.get("audit"):
        err = out["error"]
        lines.append(f"sensitivity = {out['sensitivity']:.6g}, noise scale = {out['noise_scale']:.6g}")
        of = f" ({err['of']})" if err.get("of") else ""
        lines.append(f"error at {err['confidence']:.0%} confidence: ± {err['absolute']:.6g}{of}")
        for table, term in out["tables"].items():
            first, *rest = _describe_term(term)
            lines.append(f"  {table}: {first}")
            lines.extend(f"    {line}" for line in rest)
    marks: set[str] = set()
    extra = {k: v for k, v in out.get("values", {}).items()}
    if "answer" in out and len(extra) <= 1:
        lines.append(f"answer = {_with_error_bar(out, marks)}")
    elif "answer" in out:  # several outputs, no single answer: each on its line
        lines.append("answer:")
        bars = out.get("errors") or {}
        kind = _unbarred(out, {k for k in extra if k in bars})
        lines.extend(f"  {k} = {_valued(v, bars.get(k), kind, marks)}" for k, v in extra.items())
    if "rows" in out:
        lines.extend(_table(out["rows"], out, marks))
    # the marks' reasons, then the notes: how the answer was computed (an AVG's centring and clamp, a workflow
    # step, …), which the query, the policy and the flags decide, so they are shown to everyone
    lines.extend(f"{mark} {NO_BAR[mark]}" for mark in sorted(marks, key=list(NO_BAR).index))
    lines.extend(f"note: {n}" for n in out.get("notes", []))
    return "\n".join(lines)


# why a released value has no error bar: its noise is scaled to a bound computed from the data (a bar would
# reveal that bound, docs/output.md), or its interval at the confidence is unbounded (a ratio whose noisy
# denominator's interval reaches 0, as an AVG over a group that may be empty: the value is then clamped to the
# column's declared range, sqldp.release.error_bar)
NO_BAR = {
    "*": "no ± bar: the noise is scaled to a bound computed from the data, which a bar would reveal "
    "(the data owner sees it with --audit)",
    "†": "no finite ± bar at this confidence: the interval of the noisy aggregates it is computed from "
    "leaves it unbounded (an AVG whose COUNT may be 0 shows its value clamped to the declared range)",
}


def _unbarred(out: dict[str, Any], barred: set[str]) -> str:
    """The mark for a value released without a bar: "†" when its noise scale is data-independent (some value
    of its column has a bar, or every measurement of the result is calibrated to a global bound), else "*"."""
    mechanisms = {m["mechanism"] for group in out.get("measurements", []) for m in group}
    return "†" if barred or (mechanisms and mechanisms <= PUBLIC_SCALE) else "*"


def _valued(value: Any, bar: float | None, kind: str, marks: set[str]) -> str:
    """A released value as text: ``value ± bar``, or the value and its mark when it has no bar."""
    if not _is_number(value):
        return _cell(value)
    if bar is not None:
        return _plus_minus(value, bar)
    marks.add(kind)
    return f"{_cell(value)} {kind}"


def _expected(step: dict[str, Any], confidence: float | None) -> str:
    """A plan step's mechanism and the error to expect before anything is read: the bar per value where the
    bound is a number the query, the schema and the policy fix (sqldp.release.describe), else its form."""
    mech = step.get("mechanism")
    if not mech:
        return ""
    if "half_width" in step and confidence:
        return (
            f", {mech}: ± {step['half_width']:.3g} per value at {confidence:.0%} confidence"
            f" (noise scale {step['noise_scale']:.3g})"
        )
    if mech in PUBLIC_SCALE:
        return f", {mech}: a data-independent ± bar comes with each value"
    if mech in (R2T, UNIT_HISTOGRAM):
        return f", {mech}"
    return f", {mech}: no ± bar (the noise is scaled to a bound computed from the data)"


def _table(rows: list[dict[str, Any]], shown: dict[str, Any], marks: set[str]) -> list[str]:
    """Rows as psql prints them: a header, aligned columns (numbers to the right), and the row count; a value
    with a data-independent error bar as ``value ± bar``, a released value without one with its mark
    (:data:`NO_BAR`)."""
    records = [{**r["key"], **r["values"]} if "values" in r and "key" in r else r.get("values", r) for r in rows]
    if not records:
        return ["(0 rows)"]
    names = list(records[0])
    bars = [r.get("errors", {}) if "values" in r else {} for r in rows]
    # the released (noisy) columns; a public result's rows are exact and carry no "values"
    released = {n for r in rows if "values" in r for n in r["values"]}
    kinds = {n: _unbarred(shown, {n} & {k for bar in bars for k in bar}) for n in released}
    cells = [
        [_valued(rec.get(n), bar.get(n), kinds[n], marks) if n in released else _cell(rec.get(n)) for n in names]
        for rec, bar in zip(records, bars, strict=True)
    ]
    widths = [max(len(n), *(len(c[i]) for c in cells)) for i, n in enumerate(names)]
    numeric = [all(_is_number(rec.get(n)) for rec in records) for n in names]
    out = [" " + " | ".join(n.center(w) for n, w in zip(names, widths, strict=True)) + " "]
    out.append("-" + "-+-".join("-" * w for w in widths) + "-")
    for c in cells:
        parts = (v.rjust(w) if num else v.ljust(w) for v, w, num in zip(c, widths, numeric, strict=True))
        out.append(" " + " | ".join(parts) + " ")
    out.append(f"({len(records)} row{'s' if len(records) != 1 else ''})")
    return out


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.2f}" if math.isfinite(v) and abs(v) < 1e15 else repr(v)
    return str(v)


def _with_error_bar(out: dict[str, Any], marks: set[str]) -> str:
    """The answer, and ± its error bar where that bar is data-independent (the analyst output then carries it,
    ``errors``), rounded to the bar's second digit; "noise dominates" when the bar is wider than the answer;
    without a bar, its mark (:data:`NO_BAR`)."""
    answer = out["answer"]
    width = (out.get("errors") or {}).get(next(iter(out.get("values") or {}), ""))
    if answer is None:
        return str(answer)
    if width is None:
        if not _is_number(answer):
            return str(answer)
        kind = _unbarred(out, set())
        marks.add(kind)
        return f"{answer} {kind}"
    confidence = out.get("confidence")
    level = f" ({confidence:.0%} confidence)" if confidence else ""
    return f"{_plus_minus(answer, width)}{level}"


def _plus_minus(value: float, width: float) -> str:
    if width == 0 or not math.isfinite(width):
        return f"{value:g}"
    digits = max(0, 1 - math.floor(math.log10(width)))
    dominated = ", noise dominates" if width >= abs(value) else ""
    return f"{value:.{digits}f} ± {width:.{digits}f}{dominated}"


def _unit(u: dict[str, Any]) -> str:
    """A privacy unit's data-independent figures (sqldp.sensitivity.units.UnitPlan.describe)."""
    names = [f"{n} ({t}.{k})" for n, t, k in zip(*(u[x].split(", ") for x in ("unit", "table", "key")), strict=True)]
    how = {"linear program": ", linear program", "across groups": ", truncated across groups"}
    lp = how.get(u.get("truncation", ""), "")
    tau = f", τ = {u['tau']:g} chosen by the race" if "tau" in u else ""  # a function of noisy values
    beta = u.get("selection_beta", u["beta"])  # a histogram's race only chooses τ (docs/units.md)
    return f"unit {', '.join(names)}, GS {u['gs']:g}, {u['races']} races (R2T{lp}, β = {beta:g}){tau}"


def _describe_term(term: Any) -> list[str]:
    """One table's contribution as text lines: a row-level term on one line, e.g. ``sensitivity 7.41
    (derivative 7 at the data, 7.41 smoothed; G = 1; uses t)`` (a global one has no derivative at the data:
    ``sensitivity 7 (global derivative bound 7, no count read at the data; G = 1; uses orders)``); a value-level
    term (``docs/columns.md``) on a line per part."""
    if not isinstance(term, dict):
        return [str(term)]
    if "value_sensitivity" in term or "norm" in term:
        return _describe_values(term)
    if set(term) == {"rows"}:  # a combined bound's table with private rows and no value read (TPC-H Q12's orders)
        return ["rows: " + " ".join(_describe_term(term["rows"]))]
    if "truncated" in term:  # R2T under a privacy unit (sqldp.sensitivity.units)
        values = ", ".join(f"{v:.6g}" for v in term["truncated"])
        taus = ", ".join(f"{t:.6g}" for t in term.get("thresholds", []))
        largest = term["largest_contribution"]
        return [f"largest contribution of one unit {largest:.6g}; Q(I, τ) for τ = {taus}: {values}"]
    if "sensitivity" not in term:
        return [str(term)]
    line = f"sensitivity {term['sensitivity']:.6g}"
    if "derivative" in term and "smooth_derivative" in term:
        line += (
            f" (derivative {term['derivative']:.6g} at the data, {term['smooth_derivative']:.6g} smoothed;"
            f" G = {term.get('weight', 1):g}; uses {', '.join(term.get('uses', []))})"
        )
    elif "smooth_derivative" in term:  # a global row bound reads no count at the data (sqldp.sensitivity.rows)
        line += (
            f" (global derivative bound {term['smooth_derivative']:.6g}, no count read at the data;"
            f" G = {term.get('weight', 1):g}; uses {', '.join(term.get('uses', []))})"
        )
    known = {"sensitivity", "derivative", "smooth_derivative", "weight", "uses"}
    extra = {k: v for k, v in term.items() if k not in known}
    return [line + (f" {extra}" if extra else "")]


def _describe_values(term: dict[str, Any]) -> list[str]:
    """A value-level term (NR §3.3.8), and in combined mode its row-level part and c2 (§3.3.9.3)."""
    terms = term.get("column_terms", {})
    by_column = ", ".join(f"{c} {v:.6g}" for c, v in sorted(terms.get("terms", {}).items(), key=lambda kv: -kv[1]) if v)
    head = f"values under {term.get('norm')} (rows {term.get('row_privacy', '?')}): "
    if "value_sensitivity" not in term:  # a global combined bound reads no value query (sqldp.sensitivity.columns)
        lines = [head + "global bound, c3·c4 below (no value-level scan)"]
    else:
        lines = [
            head
            + f"sensitivity {term['value_sensitivity']:.6g}"
            + (f"; by column at β = {terms['at_beta']:g}: {by_column}" if by_column else "")
        ]
    slopes = {c: v["filter_slope"] for c, v in term.get("columns", {}).items() if v.get("filter_slope")}
    if slopes:
        lines.append("private filters' slopes: " + ", ".join(f"{c} {v:.4g}" for c, v in sorted(slopes.items())))
    if "window" in term:
        w = term["window"]
        lines.append(f"window on {w['column']}: support {w['support']}, scanned {w['scanned']}")
    if "filtered_out_shift" in term:
        lines.append(f"filtered-out rows enter shifted by Δ = {term['filtered_out_shift']:.6g}")
    if "rows" in term:
        lines.append("rows: " + " ".join(_describe_term(term["rows"])))
    if "combined_sensitivity" in term:
        lines.append(
            f"combined: {term['combined_sensitivity']:.6g} (NR §3.3.9: c3 = {term['c3']:.6g}, a product row's "
            f"largest derivative over the declared ranges; c4 = {term['c4']:.6g}, the smoothed number of product "
            "rows a row is in)"
        )
    return lines
