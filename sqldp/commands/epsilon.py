"""``sqldp epsilon``: explore a guessing-advantage goal without a query (NR §3.3.10), the
privacy-at-risk report and the cost model of Dandekar, Basu and Bressan (PoPETs 2021)."""

from __future__ import annotations

import argparse
import math
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqldp.cli import emit
from sqldp.errors import InputError

if TYPE_CHECKING:
    from sqldp import advantage as adv

# the conversions (scipy) are imported by the functions that run them, not for `sqldp --help`


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "epsilon",
        help="ε for a guessing-advantage target, or the advantage an ε allows (--plot needs matplotlib)",
        description="ε for an advantage target (--advantage) or the advantage of an ε (--epsilon), for the goals "
        "of --policy or an inline goal (--prior/--radius, --membership); privacy at risk and its cost model.",
    )
    p.add_argument("--policy", metavar="POLICY.toml", help="take the goals (and the DP metric) from this policy")
    p.add_argument("--format", choices=("text", "json"), default="text", help="output format")
    what = p.add_mutually_exclusive_group()
    what.add_argument("--advantage", type=float, metavar="X", help="target advantage: report the ε that meets it")
    what.add_argument("--epsilon", type=float, metavar="E", help="report the advantage this ε allows")
    g = p.add_argument_group("inline goal (without --policy)")
    g.add_argument(
        "--prior",
        action="append",
        metavar="SPEC",
        help="an attribute's prior: range_uniform:LO:HI, range:LO:HI, normal:MU:SIGMA, set_uniform:K, "
        "set_prior:W1,W2,…, unknown (repeat for several attributes)",
    )
    g.add_argument("--radius", action="append", metavar="R", help="precision radius per --prior, or 'exact'")
    g.add_argument("--membership", metavar="P", help="guess a row's membership; P = prior or 'unknown'")
    g.add_argument("--combine", choices=("and", "or", "each"), default="and", help="how attributes combine")
    g.add_argument("--search", choices=("simplified", "a"), default="simplified", help="restricted-space search")
    p.add_argument(
        "--plot",
        metavar="FILE",
        help="draw posterior and advantage against ε (NR Fig. 55): FILE.png, .svg or .pdf; needs matplotlib "
        "(pip install 'sqldp[plot]')",
    )
    r = p.add_argument_group("privacy at risk (Laplace mechanism; Dandekar, Basu and Bressan, PoPETs 2021)")
    r.add_argument("--risk", action="store_true", help="report (ε, γ) pairs of a Laplace mechanism at ε₀")
    r.add_argument(
        "--epsilon0", type=float, metavar="E0", help="the mechanism's ε₀ (default: --epsilon or the ε found)"
    )
    r.add_argument("--outputs", type=int, default=1, metavar="K", help="number of Laplace outputs k (default 1)")
    r.add_argument("--cost-per-person", type=float, metavar="E", help="compensation per person without guarantees")
    r.add_argument("--people", type=int, metavar="N", help="number of people in the data")
    r.add_argument("--cost-rate", type=float, default=1.0, metavar="C", help="rate c of Eq. 8 (default 1)")
    r.add_argument("--cost-min", type=float, default=0.0, metavar="EMIN", help="unavoidable cost E_min (default 0)")
    p.set_defaults(func=run)


def inline_goal(args: argparse.Namespace) -> adv.Goal:
    from sqldp import advantage as adv
    from sqldp.priors import parse_cli_prior

    if args.membership is not None:
        if args.prior or args.radius:
            raise InputError("give either --membership or --prior/--radius", where="--membership")
        if args.membership == "unknown":
            return adv.Goal(membership="row")
        try:
            membership = float(args.membership)
        except ValueError:
            membership = math.nan
        if not 0 < membership < 1:
            raise InputError(
                f"must be a probability in (0, 1) or 'unknown', got {args.membership!r}", where="--membership"
            )
        return adv.Goal(membership="row", membership_prior=membership)
    if not args.prior:
        raise InputError("no goal: give --policy, --prior [--radius] or --membership", where="--prior")
    radii = args.radius or []
    if radii and len(radii) != len(args.prior):
        raise InputError(f"give one --radius per --prior ({len(args.prior)}), got {len(radii)}", where="--radius")
    attrs = []
    for i, spec in enumerate(args.prior):
        prior = parse_cli_prior(spec)
        radius = _radius(radii[i]) if radii else None
        if radius is not None and not prior.numeric:
            raise InputError(f"prior {spec!r} has no numeric values: use --radius exact", where="--radius")
        if radius is None and not prior.discrete and prior.kind != "unknown":
            raise InputError(f"prior {spec!r} is continuous: give a --radius > 0", where="--radius")
        attrs.append(adv.Attribute("attribute", str(i + 1), radius, prior))
    if args.search == "a" and args.combine != "and":
        raise InputError("the restricted-space search is implemented for --combine and only", where="--search")
    return adv.Goal(tuple(attrs), args.combine, search=args.search)


def _radius(text: str) -> float | None:
    if text == "exact":
        return None
    try:
        r = float(text)
    except ValueError:
        r = math.nan
    if not (math.isfinite(r) and r > 0):
        raise InputError(f"must be a number > 0 or 'exact', got {text!r}", where="--radius")
    return r


def explore(args: argparse.Namespace) -> dict[str, Any]:
    from sqldp import advantage as adv
    from sqldp import privacy_at_risk as par

    policy = None
    if args.policy:
        from sqldp.policy import Policy

        policy = Policy.from_file(args.policy)
        if args.prior or args.membership:
            raise InputError("give either --policy or an inline goal, not both", where="--prior")
        goals = list(policy.goals) or adv.default_goals(policy)
    elif args.prior or args.membership is not None:
        goals = [inline_goal(args)]
    else:
        goals = []
    out: dict[str, Any] = {"goals": []}
    for flag, value in (("--advantage", args.advantage), ("--epsilon", args.epsilon), ("--epsilon0", args.epsilon0)):
        if value is not None and not (math.isfinite(value) and value > 0 and (flag != "--advantage" or value < 1)):
            raise InputError(f"out of range: {value}", where=flag)
    if goals and args.epsilon is not None:
        convs = [adv.advantage_from_epsilon(g, args.epsilon, policy) for g in goals]
        out.update(mode="advantage", epsilon=args.epsilon, advantage=max(c.advantage for c in convs))
        out["goals"] = [c.to_json() for c in convs]
    elif goals:
        convs = []
        for g in goals:
            target = args.advantage if args.advantage is not None else g.advantage
            if target is None and policy is not None:
                target = policy.defaults.advantage
            if target is None:
                raise InputError(
                    f"no advantage target for goal {g.describe()!r}: pass --advantage", where="--advantage"
                )
            convs.append(adv.goal_conversion(g, target, policy))
        best = min(convs, key=lambda c: c.epsilon)
        eps = None if math.isinf(best.epsilon) else best.epsilon
        out.update(mode="epsilon", advantage=args.advantage, epsilon=eps, goals=[c.to_json() for c in convs])
        if eps is None:
            out["notes"] = ["the target is met without any noise (ε = ∞): sqldp run refuses it"]
    elif args.advantage is not None or (args.epsilon is not None and not (args.risk or args.cost_per_person)):
        raise InputError("no goal: give --policy, --prior [--radius] or --membership", where="--prior")
    eps0 = args.epsilon0 or args.epsilon or out.get("epsilon")
    if args.risk:
        if not eps0:
            raise InputError("privacy at risk needs the mechanism's ε₀: pass --epsilon0 or --epsilon", where="--risk")
        pairs = par.pairs(eps0, args.outputs)
        out["privacy_at_risk"] = {"epsilon0": eps0, "outputs": args.outputs, "pairs": pairs}
    if args.cost_per_person is not None or args.people is not None:
        if args.cost_per_person is None or args.people is None:
            raise InputError("the cost model needs both --cost-per-person and --people", where="--people")
        if not eps0:
            raise InputError(
                "the cost model needs the mechanism's ε₀: pass --epsilon0 or --epsilon", where="--epsilon0"
            )
        report = par.cost_report(
            args.cost_per_person, args.people, eps0, k=args.outputs, e_min=args.cost_min, c=args.cost_rate
        )
        out["cost"] = report.to_json()
    if len(out) == 1 and not goals:
        raise InputError("nothing to do: give a goal, --risk or --cost-per-person/--people", where="epsilon")
    if args.plot:
        if not goals:
            raise InputError("--plot needs a goal", where="--plot")
        target = args.advantage or next((g.advantage for g in goals if g.advantage), None) or 0.1
        priors = sorted({round(p, 12) for c in out["goals"] for iv in c["prior_range"] for p in iv})
        first = out["goals"][0] if out["goals"] else {}
        write_plot(
            Path(args.plot),
            priors,
            target,
            diameter=float(first.get("diameter") or 1.0),
            chosen=out.get("epsilon"),
            title=str(first.get("goal", "")),
        )
        out["plot"] = args.plot
    return out


PLOT_FORMATS = ("png", "svg", "pdf")


def write_plot(
    path: Path,
    priors: list[float],
    target: float,
    *,
    diameter: float = 1.0,
    chosen: float | None = None,
    title: str = "",
) -> None:
    """Posterior guessing probability and advantage against ε for the goal's priors and the worst case, like
    NR Fig. 55. ε is in the goal's units, as the text prints it: the curves are functions of ε·R (R the goal's
    diameter in precision units, NR §3.3.10), so the axis is the normalised ε divided by R. The target advantage
    and the chosen ε are marked and labelled. PNG, SVG or PDF by the file's suffix; written to a temp file in the
    target directory, given the permissions a new file gets under the umask, then renamed into place."""
    from sqldp import advantage as adv

    fmt = path.suffix.lower().lstrip(".")
    if fmt not in PLOT_FORMATS:
        raise InputError(
            f"the plot is written as {', '.join(PLOT_FORMATS)}: give FILE.png, .svg or .pdf", where="--plot"
        )
    if not path.parent.exists():
        raise InputError(f"directory {str(path.parent)!r} does not exist", where="--plot")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise InputError("drawing needs matplotlib: pip install 'sqldp[plot]'", where="--plot") from None
    shown = [p for p in priors if 0 < p < 1][:6]
    normalised = [k / 100 for k in range(0, 501)]  # ε·R
    eps = [e / diameter for e in normalised]  # ε in the goal's units
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for p in shown:
        advs = [adv.advantage_simplified(e, p) for e in normalised]
        ax1.plot(eps, [min(1.0, p + a) for a in advs], label=f"prior {p:.3g}")
        ax2.plot(eps, advs, label=f"prior {p:.3g}")
    worst = [adv.advantage_over([(0.0, 1.0)], e)[0] for e in normalised]
    ax2.plot(eps, worst, "k--", label="worst-case prior")
    ax2.axhline(target, color="grey", linewidth=0.8, linestyle=":", label=f"target advantage {target:g}")
    if chosen is not None and math.isfinite(chosen):
        for ax in (ax1, ax2):
            ax.axvline(chosen, color="red", linewidth=0.8, label=f"chosen ε = {chosen:.4g}")
    unit = f"ε (R = {diameter:g})"
    ax1.set(xlabel=unit, ylabel="posterior guessing probability", ylim=(0, 1))
    ax2.set(xlabel=unit, ylabel="guessing advantage", ylim=(0, 1))
    for ax in (ax1, ax2):
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(f"goal: {title}", fontsize=9)
    fig.tight_layout()
    fd, tmp = tempfile.mkstemp(suffix=f".{fmt}", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fig.savefig(fh, format=fmt, dpi=100)
        umask = os.umask(0)  # mkstemp makes the file 0600; a plot gets what any new file would
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    finally:
        plt.close(fig)


def _text(out: dict[str, Any]) -> str:
    lines = []
    for c in out.get("goals", []):
        e = c["epsilon"]
        lines.append(
            f"{c['goal']}: advantage {c['advantage']:.6g} ⇔ ε = {'∞ (no noise needed)' if e is None else f'{e:.6g}'}"
            f" (R = {c['diameter']:g}, prior p = {c['prior']:.4g}, bound {c['bound']}, units: {c['unit']})"
        )
    if out.get("mode") == "epsilon" and out.get("epsilon") is not None:
        lines.append(f"ε = {out['epsilon']:.6g}")
    elif out.get("mode") == "advantage":
        lines.append(f"advantage ≤ {out['advantage']:.6g}")
    if "privacy_at_risk" in out:
        r = out["privacy_at_risk"]
        lines.append(f"privacy at risk of Laplace at ε₀ = {r['epsilon0']:.6g}, k = {r['outputs']}:")
        lines.extend(f"  with probability {x['gamma']:g} the loss is ≤ {x['epsilon']:.6g}" for x in r["pairs"])
    if "cost" in out:
        c = out["cost"]
        lines.append(f"budget at ε₀ = {c['epsilon0']:g}: {c['budget']:.2f}")
        lines.append(
            f"cost-optimal ε = {c['epsilon_min']:.6g} (γ = {c['gamma_min']:.4g}): budget {c['budget_min']:.2f}, "
            f"saving {c['saving']:.2f}"
        )
    lines.extend(out.get("notes", []))
    if "plot" in out:
        lines.append(f"plot written to {out['plot']}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    out = explore(args)
    emit(args, out, _text)
    return 0
