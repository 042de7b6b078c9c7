"""Refusals that name their cause, through the real entry point (`python -m sqldp explain`, the shipped TPC-H
schema file: no database is read). Each was a traceback (CLI exit 70) or a refusal naming the wrong cause
found by an outside fuzzing run; and the proxy's policy check of an analyst's mechanism."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sqldp.proxy.scram import make_verifier


def explain(sql: str, *flags: str, policy: str = "tpch_catalog") -> tuple[int, dict[str, object], str]:
    done = subprocess.run(
        [sys.executable, "-m", "sqldp", "explain", "--format", "json", "--schema", "tpch", "--policy", policy,
         *flags, sql],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    out = json.loads(done.stdout) if done.stdout.strip() else {}
    return done.returncode, out, done.stderr


def refusal(sql: str, *flags: str, policy: str = "tpch_catalog") -> str:
    code, out, err = explain(sql, *flags, policy=policy)
    assert code == 2 and err == "", (code, err[-500:])
    refused = out["refused"]
    assert isinstance(refused, dict)
    reason = str(refused["reason"])
    assert "\n" not in reason
    return reason


def test_an_outer_query_over_aggregates_is_not_said_to_release_rows() -> None:
    """ibis' shape: the private rows are read only under the derived table's GROUP BY; the refusal named
    "releases rows of private table 'orders'", which is not what the query does."""
    reason = refusal(
        "SELECT t1.o_orderpriority, t1.n FROM (SELECT o_orderpriority, COUNT(*) AS n FROM orders GROUP BY 1) "
        "AS t1 ORDER BY t1.o_orderpriority"
    )
    assert "releases rows" not in reason
    assert "outer query reads the aggregated results" in reason and "'orders'" in reason
    assert "not supported yet" in reason
    # the same through WITH
    reason = refusal("WITH t AS (SELECT o_orderpriority, COUNT(*) AS n FROM orders GROUP BY 1) SELECT * FROM t")
    assert "outer query reads the aggregated results" in reason


@pytest.mark.parametrize(
    ("sql", "table"),
    [
        ("SELECT o_orderpriority FROM orders", "orders"),
        # the aggregated derived table is fine; customer's rows are listed as they are
        ("SELECT t1.n, c_name FROM (SELECT COUNT(*) AS n FROM orders) AS t1, customer", "customer"),
        ("SELECT t.o_orderkey FROM (SELECT o_orderkey FROM orders) AS t", "orders"),
    ],
)
def test_a_query_listing_private_rows_still_says_so(sql: str, table: str) -> None:
    reason = refusal(sql)
    assert reason.startswith(f"the query releases rows of private table {table!r}"), reason


@pytest.mark.parametrize(
    ("where", "message"),
    [
        ("ps_supplycost > 1e309", "the number 1e309 in a private filter is beyond double precision"),
        ("ps_supplycost < -1e309", "beyond double precision"),
        ("ps_supplycost > 1e308 + 1e308", "beyond double precision"),
        # finite, but 1e307 / 0.01 (the column's grid) is not
        ("ps_supplycost > 1e307", "too large for its column's grid"),
    ],
)
def test_a_huge_constant_in_a_private_filter_is_a_refusal(where: str, message: str) -> None:
    """OverflowError in sensitivity.filters._on_grid (round(inf)): exit 70 in the CLI, XX000 in the proxy."""
    assert message in refusal(f"SELECT COUNT(*) FROM partsupp WHERE {where}", policy="tpch")


def test_group_by_without_aggregates_is_partition_selection_not_an_index_error() -> None:
    """No aggregate meant no plan, and compile_form indexed the plans' first WHERE (TPC-DS q37/q82).
    GROUP BY without aggregates lists the groups present, as SELECT DISTINCT does: refused under pure ε,
    and with δ its groups are chosen by partition selection where the analysis allows it."""
    sql = "SELECT p_brand FROM part, lineitem WHERE l_partkey = p_partkey GROUP BY p_brand"
    assert "SELECT DISTINCT over private tables releases which values occur" in refusal(sql)
    # with δ: a lineitem row joins one part, but part is public and unkeyed in a schema file: the same
    # refusal SELECT DISTINCT gets
    distinct = refusal("SELECT DISTINCT p_brand FROM part, lineitem WHERE l_partkey = p_partkey", "--mechanism",
                       "laplace", "--delta", "1e-6")  # fmt: skip
    assert refusal(sql, "--mechanism", "laplace", "--delta", "1e-6") == distinct
    # one private table: its groups are selected (a hidden COUNT(*) measured)
    code, out, err = explain(
        "SELECT o_orderpriority FROM orders GROUP BY o_orderpriority", "--mechanism", "laplace", "--delta", "1e-6"
    )
    assert code == 0 and out["refused"] is None, (code, err, out["refused"])
    assert out["mechanisms"] == {"COUNT(*)": "laplace-global"}


def test_the_proxy_refuses_a_laplace_analyst_without_delta_when_it_loads_the_policy(tmp_path: Path) -> None:
    """It loaded, then every private query of the analyst failed naming --delta, a flag no analyst has."""
    policy = tmp_path / "policy.toml"
    verifier = make_verifier("pw")
    policy.write_text(f'[analysts.alice]\nverifier = "{verifier}"\nepsilon_limit = 1\nmechanism = "laplace"\n')
    done = subprocess.run(
        [sys.executable, "-m", "sqldp", "proxy", "--upstream", f"postgresql://nobody@/none?host={tmp_path}&port=1",
         "--policy", str(policy), "--listen", "127.0.0.1:0"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    lines = done.stderr.splitlines()
    assert done.returncode == 2 and len(lines) == 1, (done.returncode, done.stderr[-500:])
    assert f"{policy}: analysts.alice.mechanism: mechanism = 'laplace' gives (ε, δ)-DP" in lines[0]
    assert "set delta here or in [defaults]" in lines[0] and "--delta" not in lines[0]
