"""``sqldp explain``: the relational algebra and the analysis form of a query, no database access needed
with ``--schema``."""

from __future__ import annotations

import argparse
from typing import Any

from sqldp.cli import common_options, emit, read_query
from sqldp.commands.analyze import privacy_group
from sqldp.errors import RefusedError
from sqldp.mechanisms.registry import CAUCHY, LAPLACE


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("explain", parents=[common_options()], help="show the algebra and analysis form")
    # what the analysis decides depends on these (δ > 0 allows DP partition selection; the mechanism picks
    # the release), so explain takes them as `run` does and tells what `run` with the same flags would do
    privacy_group(p, advantage=False)
    p.set_defaults(func=run)


def explain(sql: str, catalog: Any, policy: Any) -> dict[str, Any]:
    # imported here, not at the top: every command module is imported for `sqldp --help`, which must not wait
    # for z3, scipy and the analyses

    from sqldp import algebra as ra
    from sqldp import budgets
    from sqldp.errors import InputError
    from sqldp.form import describe
    from sqldp.frontend import locate, parse
    from sqldp.groups import partition_selection
    from sqldp.normalize import PublicRelease, normalize, relations_read
    from sqldp.params import PrivacyParams, resolve_params
    from sqldp.release import gaussian
    from sqldp.sensitivity.global_bound import for_form as schema_sensitivity
    from sqldp.strategies import argmax, selection, setops
    from sqldp.strategies.aggregate import compile_form
    from sqldp.strategies.owned import own_selector

    parsed = parse(sql, catalog)
    out: dict[str, Any] = {"algebra": ra.to_json(parsed.algebra), "algebra_text": ra.render(parsed.algebra)}
    composed = _workflow(parsed.tree, catalog, policy)
    if composed is not None:
        out["workflow_sensitivity"] = composed
    try:  # public rows picked by private data (TPC-H Q20, Q15): a DP choice, then the public path
        chosen = selection.explain(parsed, catalog, policy) or argmax.explain(parsed, catalog, policy)
    except RefusedError as err:
        out.update(analysis=None, public=False, refused={"reason": err.message, "where": err.where})
        return out
    if chosen is not None:
        out.update(analysis=None, public=False, refused=None, selection=chosen, sql=chosen["sql"])
        return out
    top = setops.set_operation(parsed.statement) if parsed.statement is not None else None
    if top is not None and any(not policy.table(t).public for t in relations_read(top, catalog)):
        # a set operation over private tables (sqldp.strategies.setops): each branch is explained as the query it
        # runs as
        try:
            _, branches = setops.split(top)
        except RefusedError as err:
            out.update(analysis=None, public=False, refused={"reason": err.message, "where": err.where})
            return out
        out.update(analysis=None, public=False, refused=None)
        out["set_operation"] = {
            "composition": "each branch released at its share of ε (sequential composition); the set operation, "
            "ORDER BY and LIMIT on the released rows",
            "branches": [{**explain(b.sql, catalog, policy), "branch": b.sql} for b in branches],
        }
        return out
    try:
        form = normalize(parsed, catalog, policy)
    except RefusedError as err:
        out.update(analysis=None, public=False, refused={"reason": err.message, "where": err.where})
        return out
    if isinstance(form, PublicRelease):
        out.update(analysis=None, public=True, refused=None, tables=list(form.tables))
    else:
        out.update(analysis=describe(form), public=False, refused=None)
        private = [t for t in form.tables if policy.table(t).rows_private]
        # from the schema's keys alone (NR §3.3.13): data-independent, so anyone may see it. With semi-joins
        # the outer product's figures alone would understate the derived tables' reach (sqldp.subqueries): the
        # plan's own global bound (sqldp.sensitivity.global_bound) adds it, and is what `run` uses
        # a histogram of per-key counts (sqldp.strategies.nested) has its own global bound, not the product's
        flat = not form.semijoins and form.nested is None
        out["global_sensitivity"] = schema_sensitivity(form, catalog, private) if flat else {}
        # the rest of what `run` decides before reading data: the groups and each aggregate's plan, which
        # refuse what the analyses do not cover, and the mechanism each aggregate would get
        try:
            if form.nested is None:  # a group key of a private table with no declared domain, when δ > 0
                form = own_selector(partition_selection(form, policy, policy.defaults.delta), catalog, policy)
            _, plans, statements = compile_form(form, catalog, policy, policy.defaults.beta)
        except RefusedError as err:
            out["refused"] = {"reason": err.message, "where": locate(sql, parsed.statement, err)}
            return out
        # the statements `run` sends, after the rewriter's rules (sqldp.rewrite); they depend on the query and
        # the policy only
        out["sql"] = statements.all()
        if statements.choice is not None:
            # the query reads a key the policy declares a contribution bound for (max_rows_per): whether the
            # plans rely on it, the tables then read truncated, and the expected noise each way
            out["truncation"] = {
                **statements.choice,
                "truncated": [
                    {"table": t.table, "column": t.column, "max_rows": t.tau} for t in statements.truncations
                ],
            }
        # at the policy's default (ε, δ): one Gaussian vector for all the aggregates where it wins
        # (sqldp.release.gaussian; the choice depends on ε, δ and the query's shape only)
        params: PrivacyParams | None
        try:
            params = resolve_params(policy, outputs=max(1, len(form.aggregates)))
        except InputError:  # no default ε in the policy: the mechanism is chosen when the query runs
            params = None
        joint = params is not None and gaussian(form, params, plans)
        # the rule the release applies (what `run` and `analyze` name), at the policy's default mechanism
        chosen = policy.defaults.mechanism
        out["mechanisms"] = {agg.sql: p.mechanism(chosen, joint) for agg, p in zip(form.aggregates, plans, strict=True)}
        # which global bound each aggregate's noise would be calibrated to (the release's "bound")
        bounds = {
            agg.sql: p.bound_source for agg, p in zip(form.aggregates, plans, strict=True) if p.bound_source is not None
        }
        if bounds:
            out["bounds"] = bounds
        # the share of ε that buys a smoothed value its DP ± bar (sqldp.mechanisms.smooth_bar), where one is bought
        share = params.bar_share if params is not None else policy.defaults.bar_share
        barred = {agg: share for agg, mech in out["mechanisms"].items() if share > 0 and mech in (CAUCHY, LAPLACE)}
        if barred:
            out["bar_share"] = barred
        # under a privacy unit: the unit, GS_Q and the number of races (policy and query only); the row-level
        # global sensitivity above is not what protects these tables then
        units = {
            agg.sql: p.privacy_unit for agg, p in zip(form.aggregates, plans, strict=True) if p.privacy_unit is not None
        }
        if units:
            out["units"] = units
            out["global_sensitivity"] = {}
        if statements.notes:  # what the SQL does beyond the query (a truncation, groups owned by one row)
            out["notes"] = list(statements.notes)
        if budgets.budgeted_tables(policy):  # per-row budgets (docs/budgets.md): what `run_budgeted` would charge
            out["budget"] = budgets.describe(form, plans, statements, catalog, policy, params)
        owners = [p for p in plans if p.owned_groups is not None]
        if owners:
            # groups owned by one row (sqldp.strategies.owned): the full product's join-row figures above are not what
            # bounds its values (the bound form without the owning tables does)
            out["owned_groups"] = owners[0].bind(())(0.0).tables["owned groups"]
            out["global_sensitivity"] = {}
    return out


def _workflow(tree: Any, catalog: Any, policy: Any) -> dict[str, Any] | None:
    """For a query with subqueries, WITH or aggregating derived tables: its steps and the composed global
    sensitivity per table (NR §3.3.13.9, Prop. 3.2; :mod:`sqldp.sensitivity.model_check_workflow`), in join rows
    of the main step (what its COUNT or SUM moves, ℓ1 over its groups), with the reason where it is ∞ or the
    query does not decompose. From the schema's keys alone: data-independent, so anyone may see it. None for a
    single block (its figures are ``global_sensitivity``)."""
    from sqlglot import exp

    from sqldp.sensitivity import model_check_workflow as mw
    from sqldp.sensitivity.global_bound import TIMEOUT

    if not any(isinstance(n, (exp.Subquery, exp.With, exp.Exists)) for n in tree.walk()) and not any(
        isinstance(n, exp.In) and n.args.get("query") is not None for n in tree.walk()
    ):
        return None
    private = sorted(t for t in catalog.tables if policy.table(t).rows_private)
    # the release relies on the keys only when PostgreSQL enforces them (a catalog read from the database)
    base: dict[str, Any] = {"private": private, "enforced": catalog.enforced}
    try:
        found = mw.workflow(tree, catalog, timeout=TIMEOUT, measure="join")
    except ValueError as err:
        return {**base, "refused": str(err)}
    return {**base, **found.to_json()}


def _text(out: dict[str, Any]) -> str:
    from sqldp.sensitivity.units import BASE  # after the analysis, which imported it anyway

    lines = ["Relational algebra:", out["algebra_text"], ""]
    if out.get("workflow_sensitivity") and not out.get("public"):
        lines += _workflow_text(out["workflow_sensitivity"])
    if out["refused"]:
        where = out["refused"]["where"]
        lines.append(f"Refused{f' ({where})' if where else ''}: {out['refused']['reason']}")
    elif out["public"]:
        lines.append(f"Public: reads only public tables ({', '.join(out['tables'])}); answered exactly.")
    elif out.get("selection"):
        chosen = out["selection"]
        lines.append(f"Public rows chosen by private data ({chosen['where']}; docs/selection.md): {chosen['kind']}")
        lines.append(f"  bound:      {chosen['why']}")
        lines.append("SQL that runs (one snapshot), then the statement over public tables with the chosen values:")
        lines.extend(f"  {q}" for q in chosen["sql"])
    elif out.get("set_operation"):
        setop = out["set_operation"]
        lines.append(f"Set operation (docs/sql.md): {setop['composition']}")
        for i, branch in enumerate(setop["branches"], 1):
            lines.append("")
            lines.append(f"Branch {i}: {branch['branch']}")
            text = _text(branch).split("\n\n", 1)  # its own analysis, after its algebra
            lines.extend(f"  {line}" for line in text[-1].splitlines())
    else:
        a = out["analysis"]
        lines.append("Analysis form:")
        lines.append("  uses:       " + ", ".join(f"{u['table']} AS {u['alias']}" for u in a["uses"]))
        for c in a["conjuncts"]:
            lines.append(f"  {'private' if c['private'] else 'public '}     {c['sql']}")
        lines.append("  aggregates: " + ", ".join(a["aggregates"]))
        if a["group_by"]:
            lines.append("  group by:   " + ", ".join(a["group_by"]))
        lines.append("  outputs:    " + ", ".join(f"{o['name']} = {o['expr']}" for o in a["outputs"]))
        if a["order_by"] or a["limit"] is not None:
            order = ", ".join(o["output"] + (" DESC" if o["desc"] else "") for o in a["order_by"])
            limit = f" LIMIT {a['limit']}" if a["limit"] is not None else ""  # no LIMIT: none is applied
            lines.append(f"  after noise: ORDER BY {order or '-'}{limit}")
        if a["rewrites"]:
            lines.append("  rewrites:   " + "; ".join(a["rewrites"]))
        for agg, mech in out.get("mechanisms", {}).items():
            bound = out.get("bounds", {}).get(agg)
            lines.append(f"  noise:      {agg} → {mech}" + (f" (global bound: {bound})" if bound else ""))
        for agg, share in out.get("bar_share", {}).items():
            lines.append(
                f"  bar:        {agg}: {share:g} of its ε buys a noisy bound of its noise scale, for a ± bar "
                "(docs/privacy.md)"
            )
        for agg, u in out.get("units", {}).items():
            if u.get("bound") == "declared":  # no race: the keys and declared bounds (sqldp.sensitivity.unit_bounds)
                cuts = "".join(f"; {t}" for t in u["truncations"])
                lines.append(
                    f"  unit:       {agg}: {u['unit']} ({u['table']}.{u['key']}), at most "
                    f"{u['join_rows_per_unit']:g} join rows per unit{cuts}: Laplace at the declared bound, no race"
                )
                continue
            lines.append(
                f"  unit:       {agg}: {u['unit']} ({u['table']}.{u['key']}), GS {u['gs']:g}, {u['races']} races "
                f"τ = {BASE:g}, {BASE**2:g}, …, {BASE:g}^{u['races']} (R2T, β = {u['beta']:g})"
            )
            if u.get("truncation") == "across groups":
                lines.append(
                    f"              each unit truncated across groups; τ chosen by the race with "
                    f"{u['selection_share']:g}·ε (β = {u['selection_beta']:g}), the histogram released with "
                    "Laplace at τ/ε on the rest"
                )
            for j in u["joined"]:
                lines.append(f"              joined to find the unit: {j}")
        if out.get("global_sensitivity"):
            lines.append("Global sensitivity from the schema's keys (NR §3.3.13; data-independent):")
            for table, entry in out["global_sensitivity"].items():
                parts = [f"join rows {_global(entry['join_rows'])}"]
                if "groups" in entry:
                    parts.append(f"groups {_global(entry['groups'])}")
                lines.append(f"  {table}: " + ", ".join(parts))
        if out.get("truncation"):
            t = out["truncation"]
            cut = ", ".join(f"{c['table']} ≤ {c['max_rows']} rows per {c['column']}" for c in t["truncated"])
            floor = "≥ " if t["untruncated_is_floor"] else ""
            lines.append(
                f"Declared contribution bounds: {t['chosen']}{' (' + cut + ')' if cut else ''}; median |noise| "
                f"{t['truncated_median_noise']:.3g} truncated vs {floor}{t['untruncated_median_noise']:.3g} not"
            )
        lines.extend(f"Note: {n}" for n in out.get("notes", []))
        if out.get("budget"):
            b = out["budget"]
            if b.get("refused"):
                lines.append(f"Per-row budgets: refused for run_budgeted: {b['refused']}")
            else:
                lines.append(
                    f"Per-row budgets ({b['class']}): charges ε = {b['epsilon_per_row']} to each row of {b['table']} "
                    f"with {b['charged_rows']}; a row without room under its limit ({b['limit']}) is excluded "
                    "inside the statement (how many: Session.budget_counts, released with noise)"
                )
        if out.get("sql"):
            lines.append("SQL that runs (one snapshot):")
            lines.extend(f"  {q}" for q in out["sql"])
    return "\n".join(lines)


def _workflow_text(w: dict[str, Any]) -> list[str]:
    head = "Global sensitivity as a workflow (NR §3.3.13.9, Prop. 3.2; schema keys, data-independent):"
    if w.get("refused"):
        return [head, f"  not decomposed: {w['refused']}", ""]
    lines = [head]
    for step in w["steps"]:
        key = f", key {', '.join(step['key'])}" if step["key"] else ""
        direct = ", ".join(f"{t} {_value(g['sensitivity'])}" for t, g in step["direct"].items())
        unit = "join rows" if step["kind"] == "main" and w["measure"] == "join" else "rows"
        lines.append(f"  step {step['name']} ({step['kind']}{key}): {unit} per row of {direct or '-'}")
    lines.append("  composed, join rows per row of each private table (c′ + Σ c_D·r_D·S_D):")
    for table, value in w["total"].items():
        if table not in w["private"]:
            continue
        why = f" ({w['why'][table]})" if table in w["why"] else ""
        lines.append(f"    {table}: {_value(value)}{why}")
    released = [s["name"] for s in w["steps"] if s["kind"] == "released"]
    if released:
        lines.append(f"  released first, charged apart (not composed): {', '.join(released)}")
    if not w["enforced"]:
        lines.append("  (keys read from a schema file, not enforced by PostgreSQL: the release does not rely on them)")
    lines.append("")
    return lines


def _value(v: Any) -> str:
    return "∞" if v == "inf" else f"{v:g}"


def _global(g: dict[str, Any]) -> str:
    value = "∞" if g["sensitivity"] == "inf" else f"{g['sensitivity']:g}"
    return value if g["exact"] else f"≤ {value}"


def _with_flags(policy: Any, args: argparse.Namespace) -> Any:
    """The policy with the command line's ε, δ, β and mechanism as its defaults, checked as `run` checks
    them (a bad value is the same one-line error)."""
    flags = {k: getattr(args, k) for k in ("epsilon", "delta", "beta", "mechanism", "bar_share")}
    if all(v is None for v in flags.values()):
        return policy
    from dataclasses import replace

    from sqldp.params import resolve_params

    d = policy.defaults
    # the analysis needs no ε: without one anywhere the flags are checked at a nominal ε and none is set
    nominal = flags["epsilon"] is None and d.epsilon is None and d.advantage is None
    p = resolve_params(policy, **{**flags, "epsilon": 1.0} if nominal else flags)
    epsilon = d.epsilon if nominal else p.epsilon
    return replace(
        policy,
        defaults=replace(d, epsilon=epsilon, delta=p.delta, beta=p.beta, mechanism=p.mechanism, bar_share=p.bar_share),
    )


def run(args: argparse.Namespace) -> int:
    sql = read_query(args)
    from sqldp.context import load_context

    ctx = load_context(
        dsn=args.dsn, data_dir=args.data_dir, schema=args.schema, policy=args.policy, need_database=False
    )
    out = explain(sql, ctx.catalog, _with_flags(ctx.policy, args))
    payload = dict(out)
    payload.pop("algebra_text")
    emit(args, payload, lambda _: _text(out))
    return 2 if out["refused"] else 0  # `run` would refuse it
