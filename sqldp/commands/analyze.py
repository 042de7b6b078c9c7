"""``sqldp analyze`` (the plan, nothing read; with ``--audit`` the sensitivity and noise scale, nothing
released) and ``sqldp run`` (the noisy answer; with ``--audit`` the data-dependent figures too).

Who sees what (docs/output.md, "What each output field reveals"): without ``--audit`` the output carries only the
noisy answer and figures the query and the policy decide, so it can be handed to an analyst. ``--audit`` is
the data owner's mode: it adds the sensitivity, noise scale, error bar, chosen β and per-table terms, which
are functions of the private data released without noise, and says so in the output."""

from __future__ import annotations

import argparse
import math
from typing import TYPE_CHECKING, Any

from sqldp.cli import common_options, emit, read_query
from sqldp.engine import DEFAULT_ENGINE, ENGINES, command_line, registered
from sqldp.errors import InputError
from sqldp.limits import DEFAULT_MAX_ESTIMATED_ROWS, DEFAULT_STATEMENT_TIMEOUT
from sqldp.mechanisms import registry
from sqldp.result import _describe_term, format_text  # noqa: F401  (_describe_term: tests read it here)

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
        "--mechanism",
        choices=[n.value for n in registry.SMOOTHED],
        help="generalized Cauchy (ε-DP) or Laplace ((ε, δ)-DP)",
    )
    g.add_argument(
        "--bar-share",
        type=float,
        help="share of a smoothed value's ε spent on a DP bound of its noise, for a ± bar (default 0: no bar)",
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
        "--engine", choices=tuple(ENGINES), default=DEFAULT_ENGINE, help=f"where the data is (default {DEFAULT_ENGINE})"
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
    limits = {}
    for flag, name in (("--statement-timeout", "statement_timeout"), ("--max-estimated-rows", "max_estimated_rows")):
        value = getattr(args, name, None)
        if value is not None:
            if not (math.isfinite(value) and value >= 0):
                raise InputError(f"must be a finite number ≥ 0 (0: no limit), got {value:g}", where=flag)
            limits[name] = value
    return command_line(getattr(args, "engine", DEFAULT_ENGINE)).open_session(args, limits)


def privacy_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "epsilon": args.epsilon,
        "advantage": args.advantage,
        "delta": args.delta,
        "beta": args.beta,
        "mechanism": args.mechanism,
        "confidence": args.confidence,
        "bar_share": getattr(args, "bar_share", None),
    }


def run(args: argparse.Namespace) -> int:
    sql = read_query(args)
    budget = None
    if getattr(args, "budget", None):
        from sqldp.commands.budget import read_budget_file

        budget = read_budget_file(args.budget)  # before the session: a wrong file costs no connection
        if not registered(args.engine).DIALECT.has_ledger:  # the ledger is PostgreSQL's (sqldp.proxy.ledger)
            raise InputError(
                f"the budget ledger lives in PostgreSQL; it is not kept for --engine {args.engine}", where="--budget"
            )
    session = open_session(args)
    from sqldp.commands.policy import note_policy

    note_policy(session.policy)
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
    laplace = (registry.LAPLACE, registry.LAPLACE_GLOBAL)
    if out.get("public") or out.get("mechanism") not in laplace or not out.get("epsilon"):
        return None
    from sqldp.privacy_at_risk import pairs

    k = max(1, max((len(group) for group in out.get("measurements", [])), default=1))
    return {"epsilon0": out["epsilon"], "outputs": k, "pairs": pairs(out["epsilon"], k)}


def _risk_text(r: dict[str, Any] | None) -> str:
    if r is None:
        return ""
    rows = [f"  with probability {x['gamma']:g} the privacy loss is ≤ {x['epsilon']:.6g}" for x in r["pairs"]]
    return "\n" + "\n".join([f"privacy at risk (Laplace, ε₀ = {r['epsilon0']:g}, k = {r['outputs']}):", *rows])
