"""``sqldp analyze`` (the plan, nothing read; with ``--audit`` the sensitivity and noise scale, nothing
released) and ``sqldp run`` (the noisy answer; with ``--audit`` the data-dependent figures too).

Who sees what (docs/output.md, "What each output field reveals"): without ``--audit`` the output carries only the
noisy answer and figures the query and the policy decide, so it can be handed to an analyst. ``--audit`` is
the data owner's mode: it adds the sensitivity, noise scale, error bar, chosen β and per-table terms, which
are functions of the private data released without noise, and says so in the output."""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqldp.cli import common_options, emit, read_query
from sqldp.errors import InputError
from sqldp.result import AUDIT_WARNING, PUBLIC_SCALE, R2T, UNIT_HISTOGRAM

if TYPE_CHECKING:
    from sqldp.session import Session


def privacy_group(p: argparse.ArgumentParser, *, advantage: bool = True) -> argparse._ArgumentGroup:
    """The flags that decide what the analysis does (ε, δ, β, the mechanism; and the advantage target ε may
    come from), as `run`, `analyze` and `explain` take them."""
    g = p.add_argument_group("privacy (default: the policy's [defaults])")
    g.add_argument("--epsilon", type=float, help="privacy level ε")
    if advantage:
        g.add_argument(
            "--advantage", type=float, help="guessing-advantage target; ε is derived from the policy's goals"
        )
    g.add_argument("--delta", type=float, help="δ of (ε, δ)-DP (Laplace mechanism)")
    g.add_argument("--beta", type=float, help="smoothing β (default: chosen to minimise the noise)")
    g.add_argument(
        "--mechanism", choices=("cauchy", "laplace"), help="generalized Cauchy (ε-DP) or Laplace ((ε, δ)-DP)"
    )
    return g


def privacy_options() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    g = privacy_group(p)
    g.add_argument("--confidence", type=float, help="confidence level of the reported error (default 0.78)")
    g.add_argument("--seed", type=int, help="TEST MODE: seed the noise (output is marked test_mode)")
    g.add_argument(
        "--audit",
        action="store_true",
        help="DATA OWNER ONLY: add the data-dependent figures (sensitivity, noise scale, error, β); not private",
    )
    g.add_argument(
        "--privacy-at-risk", action="store_true", help="Laplace only: add the (ε, γ) pairs of privacy at risk"
    )
    return p


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    for name, helptext in (
        ("analyze", "the plan (with --audit: sensitivity, noise scale)"),
        ("run", "the noisy answer"),
    ):
        p = sub.add_parser(name, parents=[common_options(), privacy_options(), engine_options()], help=helptext)
        p.set_defaults(func=run, release=name == "run")
        if name == "run":
            p.add_argument(
                "--budget",
                metavar="FILE",
                help="charge the run to this budget file's limit, in the database's ledger; refused when spent "
                "(without it the command line keeps no budget)",
            )


def engine_options() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("engine")
    g.add_argument(
        "--engine", choices=("postgres", "spark"), default="postgres", help="where the data is (default postgres)"
    )
    g.add_argument(
        "--spark-master", metavar="URL", help="Spark master (default local[*]; sc://host:15002 for Spark Connect)"
    )
    g.add_argument(
        "--spark-data",
        metavar="DIR",
        help="Spark: register each <table>.parquet of DIR (default: where sqldp load --engine spark writes); "
        "keys from --schema, else DIR/schema.sql when present",
    )
    return p


def open_session(args: argparse.Namespace) -> Session:
    """The session a command runs on: PostgreSQL (``--dsn``) or Spark (``--engine spark``)."""
    from sqldp.session import Session  # imported when a command runs: `sqldp --help` stays fast

    if getattr(args, "engine", "postgres") != "spark":
        return Session(args.dsn, args.policy, schema=args.schema, data_dir=args.data_dir, seed=args.seed)
    if args.dsn:
        raise InputError("--dsn is PostgreSQL's; with --engine spark the data comes from --spark-data", where="--dsn")
    from sqldp import datasets
    from sqldp.engine.spark import spark_session

    directory = Path(args.spark_data) if args.spark_data else datasets.default_spark_data()
    tables = datasets.parquet_tables(directory)  # checked before Spark starts (seconds)
    keys = args.schema or (directory / datasets.SPARK_SCHEMA if (directory / datasets.SPARK_SCHEMA).is_file() else None)
    spark = spark_session(args.spark_master)
    views = datasets.register_parquet(spark, directory)
    assert set(views) == set(tables)
    return Session(policy=args.policy, schema=keys, seed=args.seed, spark=spark, spark_tables=views)


def privacy_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "epsilon": args.epsilon,
        "advantage": args.advantage,
        "delta": args.delta,
        "beta": args.beta,
        "mechanism": args.mechanism,
        "confidence": args.confidence,
    }


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


def run(args: argparse.Namespace) -> int:
    sql = read_query(args)
    budget = None
    if getattr(args, "budget", None):
        from sqldp.commands.budget import read_budget_file

        budget = read_budget_file(args.budget)  # before the session: a wrong file costs no connection
        if args.engine == "spark":  # the ledger is PostgreSQL's (sqldp.proxy.ledger)
            raise InputError(
                "the budget ledger lives in PostgreSQL; it is not kept for --engine spark", where="--budget"
            )
    session = open_session(args)
    if budget is not None:
        from sqldp.commands.budget import budget_json, budgeted_run

        result, balance = budgeted_run(session, budget, sql, audit=args.audit, privacy=privacy_kwargs(args))
    else:
        result = (session.run if args.release else session.analyze)(sql, audit=args.audit, **privacy_kwargs(args))
    out = result.to_json()
    if budget is not None:
        out["budget"] = budget_json(budget, balance)
    if getattr(args, "privacy_at_risk", False):
        out["privacy_at_risk"] = privacy_at_risk_report(out)
    emit(args, out, lambda o: format_text(o) + _risk_text(o.get("privacy_at_risk")) + _budget_text(o.get("budget")))
    return 0


def _budget_text(b: dict[str, Any] | None) -> str:
    if b is None:
        return ""
    from sqldp.commands.budget import budget_text

    return "\n" + budget_text(b)


def privacy_at_risk_report(out: dict[str, Any]) -> dict[str, Any] | None:
    """Opt-in report (Dandekar, Basu and Bressan, "Differential Privacy at Risk", PoPETs 2021, Thm 4): for a
    Laplace mechanism at ε₀ = the result's ε with k outputs (the aggregates of one group), the (ε, γ) pairs.
    Not defined for generalized Cauchy: None."""
    if out.get("public") or out.get("mechanism") not in ("laplace", "laplace-global") or not out.get("epsilon"):
        return None
    from sqldp.privacy_at_risk import pairs

    k = max(1, max((len(group) for group in out.get("measurements", [])), default=1))
    return {"epsilon0": out["epsilon"], "outputs": k, "pairs": pairs(out["epsilon"], k)}


def _risk_text(r: dict[str, Any] | None) -> str:
    if r is None:
        return ""
    rows = [f"  with probability {x['gamma']:g} the privacy loss is ≤ {x['epsilon']:.6g}" for x in r["pairs"]]
    return "\n" + "\n".join([f"privacy at risk (Laplace, ε₀ = {r['epsilon0']:g}, k = {r['outputs']}):", *rows])
