"""``sqldp analyze`` (the plan, nothing read; with ``--audit`` the sensitivity and noise scale, nothing
released) and ``sqldp run`` (the noisy answer; with ``--audit`` the data-dependent figures too).

Who sees what (README, "What each output field reveals"): without ``--audit`` the output carries only the
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
from sqldp.limits import DEFAULT_MAX_ESTIMATED_ROWS, DEFAULT_STATEMENT_TIMEOUT
from sqldp.result import AUDIT_WARNING

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
    g.add_argument(
        "--statement-timeout",
        type=float,
        metavar="SECONDS",
        help=f"PostgreSQL: cancel a statement after SECONDS (default {DEFAULT_STATEMENT_TIMEOUT:g}; 0: no limit)",
    )
    g.add_argument(
        "--max-estimated-rows",
        type=float,
        metavar="N",
        help="PostgreSQL: refuse, before running or charging it, a private query whose plan expects a step of "
        f"more than N rows (default {DEFAULT_MAX_ESTIMATED_ROWS:g}; 0: no limit)",
    )
    return p


def open_session(args: argparse.Namespace) -> Session:
    """The session a command runs on: PostgreSQL (``--dsn``) or Spark (``--engine spark``)."""
    from sqldp.session import Session  # imported when a command runs: `sqldp --help` stays fast

    limits = {}
    for flag, name in (("--statement-timeout", "statement_timeout"), ("--max-estimated-rows", "max_estimated_rows")):
        value = getattr(args, name, None)
        if value is not None:
            if not (math.isfinite(value) and value >= 0):
                raise InputError(f"must be a finite number ≥ 0 (0: no limit), got {value:g}", where=flag)
            limits[name] = value
    if getattr(args, "engine", "postgres") != "spark":
        return Session(args.dsn, args.policy, schema=args.schema, data_dir=args.data_dir, seed=args.seed, **limits)
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
            lines.append(f"  {step['aggregate']}: {share} ({step['groups']})")
            if "unit" in step:
                lines.append(f"    {_unit(step['unit'])}")
        for group in out.get("measurements", [])[:1]:
            lines.extend(f"  {m['aggregate']}: {_unit(m['unit'])}" for m in group if m.get("unit"))
    if not out["public"] and out.get("audit"):
        err = out["error"]
        lines.append(f"sensitivity = {out['sensitivity']:.6g}, noise scale = {out['noise_scale']:.6g}")
        lines.append(f"error at {err['confidence']:.0%} confidence: ± {err['absolute']:.6g}")
        for table, term in out["tables"].items():
            first, *rest = _describe_term(term)
            lines.append(f"  {table}: {first}")
            lines.extend(f"    {line}" for line in rest)
    if "answer" in out:
        lines.append(f"answer = {_with_error_bar(out)}")
        extra = {k: v for k, v in out.get("values", {}).items()}
        if len(extra) > 1:
            lines.extend(f"  {k} = {v}" for k, v in extra.items())
    if "rows" in out:
        lines.extend(_table(out["rows"]))
    return "\n".join(lines)


def _table(rows: list[dict[str, Any]]) -> list[str]:
    """Rows as psql prints them: a header, aligned columns (numbers to the right), and the row count; a value
    with a data-independent error bar as ``value ± bar``."""
    records = [{**r["key"], **r["values"]} if "values" in r and "key" in r else r.get("values", r) for r in rows]
    if not records:
        return ["(0 rows)"]
    names = list(records[0])
    bars = [r.get("errors", {}) if "values" in r else {} for r in rows]
    cells = [
        [_plus_minus(rec[n], bar[n]) if n in bar and _is_number(rec.get(n)) else _cell(rec.get(n)) for n in names]
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


def _with_error_bar(out: dict[str, Any]) -> str:
    """The answer, and ± its error bar where that bar is data-independent (the analyst output then carries it,
    ``errors``), rounded to the bar's second digit; "noise dominates" when the bar is wider than the answer."""
    answer = out["answer"]
    width = (out.get("errors") or {}).get(next(iter(out.get("values") or {}), ""))
    if answer is None or width is None:
        return str(answer)
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
    session = open_session(args)
    result = (session.run if args.release else session.analyze)(sql, audit=args.audit, **privacy_kwargs(args))
    out = result.to_json()
    if getattr(args, "privacy_at_risk", False):
        out["privacy_at_risk"] = privacy_at_risk_report(out)
    emit(args, out, lambda o: format_text(o) + _risk_text(o.get("privacy_at_risk")))
    return 0


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
