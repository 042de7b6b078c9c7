"""``sqldp analyze`` (sensitivity and noise scale, nothing released) and ``sqldp run`` (the noisy answer)."""

from __future__ import annotations

import argparse
from typing import Any

from sqldp.cli import common_options, emit, read_query
from sqldp.runner import Session


def privacy_options() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("privacy (default: the policy's [defaults])")
    g.add_argument("--epsilon", type=float, help="privacy level ε")
    g.add_argument("--advantage", type=float, help="guessing-advantage target; ε is derived from the policy's goals")
    g.add_argument("--delta", type=float, help="δ of (ε, δ)-DP (Laplace mechanism)")
    g.add_argument("--beta", type=float, help="smoothing β (default: chosen to minimise the noise)")
    g.add_argument(
        "--mechanism", choices=("cauchy", "laplace"), help="generalized Cauchy (ε-DP) or Laplace ((ε, δ)-DP)"
    )
    g.add_argument("--confidence", type=float, help="confidence level of the reported error (default 0.78)")
    g.add_argument("--seed", type=int, help="TEST MODE: seed the noise (output is marked test_mode)")
    return p


def register(sub: argparse._SubParsersAction) -> None:
    for name, helptext in (("analyze", "sensitivity and noise scale, no answer"), ("run", "the noisy answer")):
        p = sub.add_parser(name, parents=[common_options(), privacy_options()], help=helptext)
        p.set_defaults(func=run, release=name == "run")


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
    if out.get("test_mode"):
        lines.append("TEST MODE: noise drawn from a seeded generator; not private")
    if out["public"]:
        lines.append("public data: answered exactly")
    else:
        err = out["error"]
        lines.append(
            f"ε = {out['epsilon']:g}{' (from advantage ' + str(out['advantage']) + ')' if out['advantage'] else ''}"
            f", δ = {out['delta'] or 0:g}, β = {out['beta']:.4g}, mechanism = {out['mechanism']}"
        )
        lines.append(f"sensitivity = {out['sensitivity']:.6g}, noise scale = {out['noise_scale']:.6g}")
        lines.append(f"error at {err['confidence']:.0%} confidence: ± {err['absolute']:.6g}")
        for table, term in out["tables"].items():
            lines.append(f"  {table}: {term}")
    if "answer" in out:
        lines.append(f"answer = {out['answer']}")
        extra = {k: v for k, v in out.get("values", {}).items()}
        if len(extra) > 1:
            lines.extend(f"  {k} = {v}" for k, v in extra.items())
    if "rows" in out:
        for row in out["rows"]:
            key = ", ".join(f"{k}={v}" for k, v in row.get("key", {}).items())
            vals = ", ".join(f"{k}={v}" for k, v in row.get("values", row).items())
            lines.append(f"  {key + ': ' if key else ''}{vals}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    sql = read_query(args)
    session = Session(args.dsn, args.policy, schema=args.schema, data_dir=args.data_dir, seed=args.seed)
    result = (session.run if args.release else session.analyze)(sql, **privacy_kwargs(args))
    emit(args, result.to_json(), format_text)
    return 0
