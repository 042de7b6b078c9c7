"""Issue 26's traceback reproducers ("Errors and tracebacks") through the library and the CLI, on TPC-H with
its shipped policy; tests/proxy/test_proxy_errors.py sends the same statements through the proxy (and the
extended protocol's ``$0`` Parse/Bind). Each was a traceback (a ValueError, IndexError, OverflowError or
struct.error; CLI exit 70) or a dropped connection; each is now a one-line refusal before any data is read."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import sqldp
from sqldp.errors import SqldpError

TPCH_POLICY = Path(__file__).parents[2] / "schemas" / "tpch.toml"
# the SQL reproducers of issue 26, as in the proxy's test
REPRODUCERS = {
    "interval NULL": "SELECT COUNT(*) FROM lineitem WHERE l_shipdate <= date '1998-12-01' - interval 'NULL' day",
    "-infinity": "SELECT COUNT(*) FROM orders WHERE o_orderdate > '-infinity'::date",
    "RANGE_AGG(*)": "SELECT o_orderpriority, RANGE_AGG(*) FROM orders GROUP BY o_orderpriority",
    "interval 1e400": "SELECT COUNT(*) FROM lineitem WHERE l_shipdate <= date '1998-12-01' + interval '1"
    + "0" * 400
    + "' day",
    "100,000 COUNT(*)": "SELECT " + ", ".join(["COUNT(*)"] * 100_000) + " FROM orders",
}


@pytest.mark.parametrize("name", list(REPRODUCERS))
def test_library_refuses_each_reproducer_in_one_line(tpch_dsn: tuple[str, object, object], name: str) -> None:
    session = sqldp.connect(tpch_dsn[0], str(TPCH_POLICY))
    with pytest.raises(SqldpError) as info:
        session.run(REPRODUCERS[name])
    assert "\n" not in str(info.value) and info.value.sqlstate[:2] not in ("08", "XX"), str(info.value)


@pytest.mark.parametrize("name", list(REPRODUCERS))
def test_cli_refuses_each_reproducer_in_one_line(tpch_dsn: tuple[str, object, object], name: str) -> None:
    """`sqldp run` with the query on stdin (the 100,000 COUNT(*) are 900 kB, past one argument's limit)."""
    done = subprocess.run(
        [sys.executable, "-m", "sqldp", "run", "--dsn", tpch_dsn[0], "--policy", "tpch", "-f", "-"],
        input=REPRODUCERS[name], capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 2, (done.returncode, done.stderr[-500:])
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("sqldp: error: ") and done.stdout == "", done.stderr[-500:]
