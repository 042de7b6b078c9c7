"""Which of the 22 TPC-H queries the release answers with the workflow's composed global bound (NR §3.3.13.9,
Prop. 3.2; ``sqldp.sensitivity.global_bound.workflow_plan``), and their median relative errors before/after.

For each query and each policy — the two shipped ones (``tpch``, ``tpch_catalog``: value-level norms on every
private table) and the row-level ``benchmarks/tpch/policy_rows.toml`` (the neighbours the model checker counts)
— the query is prepared twice at ε = 1: *before*, with the workflow bound switched off (the single-block bound
of ``global_plan`` only, as on main before it), and *after*. A refusal asking for δ > 0 is retried with Laplace,
δ = 1e-6, as ``tpch22_bench.py`` does. Per query: each aggregate's mechanism and global bound each way and, where
a plan changed,
the median relative error of the released values over ``--runs`` runs each way (``tpch22_bench._errors``), and
the seconds the composition's analysis took (``workflow_plan``, first call: the model checker on every step).

Usage: ``PYTHONPATH=. python benchmarks/workflow_release_bench.py --scale 0.01 [--runs 10] [--out FILE]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg

import sqldp
from benchmarks.common import QUERIES, ROOT, machine, markdown_table, report, tpch_database
from benchmarks.tpch22_bench import DELTA, _errors, _plain_value
from sqldp import sensitivity
from sqldp.errors import RefusedError
from sqldp.result import GLOBAL
from sqldp.sensitivity import global_bound

POLICIES = ("tpch", "tpch_catalog", str(ROOT / "benchmarks" / "tpch" / "policy_rows.toml"))


SPENT = [0.0]  # seconds inside workflow_plan (the composition's analysis: the model checker on every step)


def _timed(rows: Any, catalog: Any, **kw: Any) -> Any:
    t0 = time.perf_counter()
    try:
        return _WORKFLOW_PLAN(rows, catalog, **kw)
    finally:
        SPENT[0] += time.perf_counter() - t0


_WORKFLOW_PLAN = sensitivity.workflow_plan
sensitivity.workflow_plan = _timed  # type: ignore[assignment]


@contextmanager
def without_workflow() -> Iterator[None]:
    """The release as before: the single-block global bound only."""
    saved = sensitivity.workflow_plan
    sensitivity.workflow_plan = lambda rows, catalog, **kw: None  # type: ignore[assignment]
    try:
        yield
    finally:
        sensitivity.workflow_plan = saved  # type: ignore[assignment]


def _plans(prepared: Any) -> list[Any]:
    # a workflow of uncorrelated scalar steps (sqldp.strategies.workflow.Workflow)
    if hasattr(prepared, "placeholder"):
        return [p for _, step in prepared.steps for p in step.plans] + list(prepared.placeholder.plans)
    return list(getattr(prepared, "plans", ()) or ())


def _how(plans: list[Any]) -> str:
    out = []
    for p in plans:
        if isinstance(p, global_bound.GlobalPlan):
            out.append(f"{GLOBAL} {p.bound:g} ({'workflow' if p.source == global_bound.WORKFLOW_SOURCE else 'keys'})")
        else:
            out.append("global (public rows)" if p.data_independent else "smooth")
    return ", ".join(dict.fromkeys(out)) or "-"


def _prepare(session: Any, sql: str) -> tuple[Any, dict[str, Any], float]:
    privacy: dict[str, Any] = {"epsilon": 1.0}
    t0 = time.perf_counter()
    try:
        prepared = session.prepare(sql, **privacy)
    except RefusedError as refusal:
        if "δ > 0" not in str(refusal):
            raise
        privacy = {"epsilon": 1.0, "mechanism": "laplace", "delta": DELTA}
        prepared = session.prepare(sql, **privacy)
    return prepared, privacy, time.perf_counter() - t0


def _median_error(session: Any, sql: str, privacy: dict[str, Any], plain: list[tuple], runs: int) -> float | None:
    errors: list[float] = []
    for _ in range(runs):
        out = session.run(sql, **privacy)
        errors += _errors(out, plain, out.columns)
    return statistics.median(errors) if errors else None


def bench(scale: float, runs: int) -> list[list[Any]]:
    dsn = tpch_database(scale)
    rows: list[list[Any]] = []
    sqldp.connect(dsn, policy="tpch").prepare("SELECT COUNT(*) FROM lineitem")  # imports, z3: not timed below
    for policy in POLICIES:
        name = policy.rsplit("/", 1)[-1]
        for path in sorted(QUERIES.glob("q*.sql")):
            sql = path.read_text(encoding="utf-8")
            global_bound._workflow_cache.clear()
            global_bound._cache.clear()
            try:
                with without_workflow():
                    before_session = sqldp.connect(dsn, policy=policy, seed=1)
                    before, privacy, _ = _prepare(before_session, sql)
                after_session = sqldp.connect(dsn, policy=policy, seed=2)
                SPENT[0] = 0.0
                after, _, _ = _prepare(after_session, sql)
            except RefusedError as refusal:
                rows.append([path.stem, name, "refused: " + str(refusal)[:90], "", "", "", "", ""])
                continue
            # public tables only, or a DP choice (sqldp.strategies.selection)
            if not _plans(before) and not _plans(after):
                how = "exact (public tables)" if getattr(after, "public", False) else "DP selection (no bound)"
                rows.append([path.stem, name, how, how, "no", "", "", SPENT[0]])
                continue
            how_before, how_after = _how(_plans(before)), _how(_plans(after))
            err_before = err_after = None
            if how_before != how_after:
                with psycopg.connect(dsn) as conn:
                    plain = [tuple(_plain_value(v) for v in r) for r in conn.execute(sql).fetchall()]
                with without_workflow():
                    err_before = _median_error(before_session, sql, privacy, plain, runs)
                err_after = _median_error(after_session, sql, privacy, plain, runs)
            changed = "yes" if how_before != how_after else "no"
            rows.append([path.stem, name, how_before, how_after, changed, err_before, err_after, SPENT[0]])
            print(f"# {name} {path.stem}: {how_before} → {how_after}", file=sys.stderr)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scale", type=float, default=0.01)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    t0 = time.perf_counter()
    rows = bench(args.scale, args.runs)
    header = [
        "query",
        "policy",
        "before (mechanism, bound)",
        "after",
        "changed",
        "median rel. error before",
        "after",
        "workflow analysis (s)",
    ]
    changed = [f"{r[0]} ({r[1]})" for r in rows if r[4] == "yes"]
    text = "\n".join(
        [
            f"Machine: {machine()} (shared with other jobs). SF {args.scale:g}, ε = 1, {args.runs} runs each way.",
            f"Command: `PYTHONPATH=. python benchmarks/workflow_release_bench.py --scale {args.scale:g} "
            f"--runs {args.runs}`. Total {time.perf_counter() - t0:.1f} s.",
            "",
            markdown_table(header, rows),
            "",
            f"Released with the workflow's bound now: {', '.join(changed) or 'none'}.",
        ]
    )
    report(text, args.out)


if __name__ == "__main__":
    main()
