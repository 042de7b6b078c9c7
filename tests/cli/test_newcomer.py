"""What a new user meets first, through the real entry points: ``analyze`` and ``explain`` name the mechanism
``run`` uses; text output marks every released value it prints without an error bar and shows the notes; a
``Result`` prints the analyst's view only; the example in ``examples/`` runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
Q01 = ROOT / "benchmarks" / "tpch" / "queries" / "q01.sql"


def sqldp(dsn: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sqldp.cli", *args, "--dsn", dsn],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


def ok(r: subprocess.CompletedProcess[str]) -> str:
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.fixture
def tpch(tpch_dsn: tuple[str, Any, Any]) -> str:
    return tpch_dsn[0]


@pytest.mark.parametrize(
    ("policy", "sql"),
    [
        ("tpch_catalog", "SELECT COUNT(*) FROM orders"),  # the policy's default is cauchy: run uses laplace-global
        ("tpch", "SELECT COUNT(*) FROM orders a, orders b WHERE a.o_custkey = b.o_custkey"),  # a smoothed bound
        ("tpch", "SELECT l_returnflag, SUM(l_quantity), AVG(l_discount) FROM lineitem GROUP BY 1"),
    ],
)
def test_analyze_and_explain_name_the_mechanism_run_uses(tpch: str, policy: str, sql: str) -> None:
    ran = json.loads(ok(sqldp(tpch, "run", "--policy", policy, "--seed", "1", "--format", "json", sql)))
    used = {m["mechanism"] for group in ran["measurements"] for m in group}
    analyzed = json.loads(ok(sqldp(tpch, "analyze", "--policy", policy, "--format", "json", sql)))
    assert analyzed["mechanism"] == ran["mechanism"] == ", ".join(sorted(used))
    assert {step["mechanism"] for step in analyzed["plan"]} == used
    explained = json.loads(ok(sqldp(tpch, "explain", "--policy", policy, "--format", "json", sql)))
    assert set(explained["mechanisms"].values()) == used
    text = ok(sqldp(tpch, "analyze", "--policy", policy, sql))
    assert f"mechanism = {ran['mechanism']}" in text


def test_explain_prints_no_limit_it_does_not_apply(tpch: str) -> None:
    text = ok(sqldp(tpch, "explain", "--policy", "tpch", "SELECT COUNT(*) FROM orders ORDER BY 1"))
    assert "after noise: ORDER BY count" in text and "LIMIT" not in text
    text = ok(sqldp(tpch, "explain", "--policy", "tpch", "SELECT COUNT(*) FROM orders ORDER BY 1 LIMIT 3"))
    assert "LIMIT 3" in text


def test_text_output_marks_values_without_a_bar_and_shows_the_notes(tpch: str) -> None:
    """TPC-H Q1 at SF 0.01 has two empty groups (A/O, R/O): their AVGs have no finite bar and print the clamp
    bounds; each such cell must say so, and the AVG notes must be printed."""
    text = ok(sqldp(tpch, "run", "--policy", "tpch", "--seed", "3", "-f", str(Q01)))
    out = json.loads(ok(sqldp(tpch, "run", "--policy", "tpch", "--seed", "3", "--format", "json", "-f", str(Q01))))
    lines = text.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith(" l_returnflag"))
    names = [c.strip() for c in lines[header].split("|")]
    rows = [[c.strip() for c in line.split("|")] for line in lines[header + 2 : header + 2 + len(out["rows"])]]
    released = set(out["rows"][0]["values"])
    unbarred = 0
    for row in rows:
        for name, cell in zip(names, row, strict=True):
            if name in released:
                # every released number carries its bar or the mark that says why it has none
                assert "±" in cell or cell.endswith(" †"), (name, cell)
                unbarred += cell.endswith(" †")
    assert unbarred == sum(len(r["values"]) - len(r["errors"]) for r in out["rows"]) > 0
    assert any(line.startswith("† no finite ± bar") for line in lines)
    assert [line for line in lines if line.startswith("note: ")] == [f"note: {n}" for n in out["notes"]]
    assert any("clamped to [1, 50]" in n for n in out["notes"])


def test_a_smoothed_answer_says_why_it_has_no_bar(tpch: str) -> None:
    sql = "SELECT COUNT(*) FROM orders a, orders b WHERE a.o_custkey = b.o_custkey"
    lines = ok(sqldp(tpch, "run", "--policy", "tpch", "--seed", "1", sql)).splitlines()[1:]  # after TEST MODE
    assert lines[0].startswith("ε = 1 (pure ε-DP), mechanism = cauchy")
    assert lines[1].startswith("answer = ") and lines[1].endswith(" *") and "±" not in lines[1]
    assert lines[2].startswith("* no ± bar: the noise is scaled to a bound computed from the data")


def test_printing_a_result_shows_the_analysts_view_only(tpch: str) -> None:
    import sqldp as lib

    session = lib.connect(tpch, policy="tpch", seed=5)
    try:
        sql = "SELECT COUNT(*) FROM orders a, orders b WHERE a.o_custkey = b.o_custkey"
        result = session.run(sql, audit=True, epsilon=1.0)  # audit mode: its JSON carries everything
        m = result.measurements[0][0]
        assert m.true_value is not None and m.sensitivity > 0
        for shown in (repr(result), str(result), result._repr_html_(), repr(m), repr([result])):
            for secret in ("true_value", "sensitivity", "timings", "AUDIT", repr(m.true_value), f"{m.sensitivity}"):
                assert secret not in shown, (secret, shown)
            assert "noise_scale" not in shown  # a smoothed measurement's scale is data-dependent
        assert "\nε = 1 (pure ε-DP), mechanism = cauchy\nanswer = " in repr(result)
        assert result._repr_html_().startswith("<pre>TEST MODE") and result._repr_html_().endswith("</pre>")
        audit = result.audit_view()
        assert audit["audit"] is True and audit["sensitivity"] == m.sensitivity and "warning" in audit
        grouped = session.run("SELECT o_orderpriority, COUNT(*) AS n FROM orders GROUP BY 1", epsilon=1.0)
        records = grouped.records()
        assert [r["o_orderpriority"] for r in records] == sorted(r["o_orderpriority"] for r in records)
        assert all(set(r) == {"o_orderpriority", "n", "n_error"} for r in records) and len(records) == 5
        assert "±" in repr(grouped) and "(5 rows)" in repr(grouped)
    finally:
        session.close()


def test_the_quickstart_example_runs(tpch: str) -> None:
    r = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "quickstart.py")],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "SQLDP_DSN": tpch},
        cwd=ROOT.parent,  # not the clone: the example names the shipped policy, no path into the repository
    )
    assert r.returncode == 0, r.stderr
    assert "answer = " in r.stdout and " ± " in r.stdout and "(5 rows)" in r.stdout
    assert "refused: budget: the query costs ε = 1.5" in r.stdout
    assert "spent 2.0 remaining (1.0, None)" in r.stdout
    assert "Traceback" not in r.stderr and "sensitivity" not in r.stdout
