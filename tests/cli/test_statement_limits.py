"""`sqldp run` on statements PostgreSQL rejects and on the operational limits, through
the real entry point on TPC-H at SF 0.01 with its shipped policy. A rejected statement exited 1, which the README
documents as an unreachable database; it is bad input (exit 2), refused before any charge."""

from __future__ import annotations

import subprocess
import sys

import pytest


def run(dsn: str, sql: str, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sqldp", "run", "--dsn", dsn, "--policy", "tpch", "--epsilon", "1", *flags, sql],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def one_line_error(done: subprocess.CompletedProcess[str], code: int = 2) -> str:
    lines = done.stderr.splitlines()
    assert done.returncode == code and len(lines) == 1 and done.stdout == "", (done.returncode, done.stderr[-500:])
    assert lines[0].startswith("sqldp: error: ")
    return lines[0]


@pytest.mark.parametrize(
    ("sql", "message"),
    [
        ("SELECT COUNT(SUM(o_totalprice)) FROM orders", "PostgreSQL refused the query: aggregate function calls"),
        ("SELECT COUNT(*) FROM orders WHERE o_orderpriority > 5", "PostgreSQL refused the query: operator does not"),
        # public data runs as written: PostgreSQL's error is still about the statement, not the connection
        ("SELECT n_name FROM nation WHERE n_name > 5", "PostgreSQL failed on the query: operator does not exist"),
    ],
)
def test_a_statement_postgres_rejects_exits_2(tpch_dsn: tuple[str, object, object], sql: str, message: str) -> None:
    assert message in one_line_error(run(tpch_dsn[0], sql))


def test_an_unreachable_database_still_exits_1(tmp_path: object) -> None:
    done = run(f"postgresql://nobody@/none?host={tmp_path}&port=1", "SELECT COUNT(*) FROM orders")
    assert "cannot connect" in one_line_error(done, code=1)


def test_the_row_estimate_limit_refuses_a_cross_join_before_it_runs(tpch_dsn: tuple[str, object, object]) -> None:
    # orders × lineitem × customer: PostgreSQL expects 10¹³ rows, over the default limit of 10⁹
    line = one_line_error(run(tpch_dsn[0], "SELECT COUNT(*) FROM orders, lineitem, customer"))
    assert "PostgreSQL's planner expects a step of" in line and "limit of 1e+09" in line
    assert "nothing was run or charged" in line
    line = one_line_error(run(tpch_dsn[0], "SELECT COUNT(*) FROM orders, customer", "--max-estimated-rows", "1e6"))
    assert "2.25e+07 rows" in line and "limit of 1e+06" in line
    assert run(tpch_dsn[0], "SELECT COUNT(*) FROM orders", "--max-estimated-rows", "1e6").returncode == 0


def test_the_statement_timeout_is_an_option(tpch_dsn: tuple[str, object, object]) -> None:
    # orders × customer: 2.25·10⁷ rows, over a second to count; 10 ms is not enough
    slow = "SELECT COUNT(*) FROM orders, customer"
    line = one_line_error(run(tpch_dsn[0], slow, "--statement-timeout", "0.01"))
    assert "statement timeout" in line and "--statement-timeout" in line
    for flag in ("--statement-timeout", "--max-estimated-rows"):
        assert f"{flag}: must be a finite number ≥ 0" in one_line_error(run(tpch_dsn[0], slow, flag, "-1"))
