"""``sqldp policy init --estimate-epsilon E --estimate-delta D`` through the real entry point, on a tiny database:
the file it writes records every estimate in ``[estimates]`` (shares adding up to E and D), ``policy check``
accepts it, and a query the catalog alone cannot answer (GROUP BY a text column, SUM of an unbounded NUMERIC,
EXTRACT(YEAR) of a DATE) answers under it."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from pg_support import loaded_database

SCHEMA = """
CREATE TABLE shop (id INTEGER PRIMARY KEY, town VARCHAR(40));
CREATE TABLE sale (
    id      INTEGER PRIMARY KEY,
    shop_id INTEGER NOT NULL REFERENCES shop (id),
    amount  NUMERIC(9,2),
    day     DATE,
    kind    VARCHAR(10)
);
INSERT INTO shop SELECT i, 'town ' || i FROM generate_series(1, 200) AS i;
INSERT INTO sale
SELECT i, 1 + i % 200, (i % 97) * 3.5, DATE '2020-01-01' + (i % 700), (ARRAY['food', 'toys', 'books'])[1 + i % 3]
FROM generate_series(1, 6000) AS i;
"""
QUERY = "SELECT kind, EXTRACT(YEAR FROM day) AS y, COUNT(*) AS n, SUM(amount) AS total FROM sale GROUP BY kind, y"


def sqldp(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sqldp.cli", *args], capture_output=True, text=True, timeout=180, env=dict(os.environ)
    )


@pytest.mark.pg
def test_estimates_are_recorded_checked_and_answer(pg_server_dsn: str, tmp_path: Path) -> None:
    with loaded_database(pg_server_dsn, SCHEMA) as conn:
        dsn = conn.info.dsn
        plain, estimated = tmp_path / "plain.toml", tmp_path / "estimated.toml"
        r = sqldp("policy", "init", "--dsn", dsn, "--private", "shop,sale", "-o", str(plain))
        assert r.returncode == 0, r.stderr
        refused = sqldp("explain", "--dsn", dsn, "--policy", str(plain), QUERY)
        assert refused.returncode == 2, refused.stdout  # no domain for kind, no range for day: refused
        r = sqldp(
            "policy", "init", "--dsn", dsn, "--private", "shop,sale", "-o", str(estimated),
            "--estimate-epsilon", "3", "--estimate-delta", "1e-6",
        )  # fmt: skip
        assert r.returncode == 0, r.stderr
        text = estimated.read_text()
        raw = tomllib.loads(text)
        record = raw["estimates"]
        assert record["epsilon"] == 3 and record["delta"] == 1e-6 and record["date"]
        figures = {f["what"].split(" (")[0]: f for f in record["figures"]}
        # amount and day: two ends each; kind: a domain; sale.shop_id (a key to private shop): max_rows_per;
        # shop.town is too wide for a domain, and the keys get no range
        assert set(figures) == {
            "sale.amount range low",
            "sale.amount range high",
            "sale.day range low",
            "sale.day range high",
            "sale.kind domain",
            "sale.shop_id max_rows_per",
        }
        assert math.isclose(sum(f["epsilon"] for f in figures.values()), 3.0)
        assert math.isclose(sum(f["delta"] for f in figures.values()), 1e-6)
        sale = raw["tables"]["sale"]
        assert sorted(sale["columns"]["kind"]["domain"]) == ["books", "food", "toys"]
        lo, hi = sale["columns"]["amount"]["range"]
        # the values are 0 … 336: every grid point from 400 up ties, the base measure halving each step (past 10⁶:
        # probability below 2⁻³⁰); every point below 300 is ≥ 600 rows off the quantile
        assert -(10**6) <= lo <= 10 and 300 <= hi <= 10**6
        assert sale["columns"]["day"]["range"][0] <= "2020-01-01" and sale["columns"]["day"]["unit"] == "day"
        assert 1 <= sale["max_rows_per"]["shop_id"] <= 64  # 30 rows per shop
        for line in text.splitlines():  # every estimated declaration says so beside it
            if "DP estimate," in line:
                assert "[estimates]" in line
        check = sqldp("policy", "check", "--dsn", dsn, "--policy", str(estimated), "--format", "json")
        assert check.returncode == 0, check.stderr
        assert json.loads(check.stdout)["valid"]
        answer = sqldp("run", "--dsn", dsn, "--policy", str(estimated), "--epsilon", "1", "--format", "json", QUERY)
        assert answer.returncode == 0, answer.stdout + answer.stderr
        # estimates read the data: not from a schema file; a zero ε is refused, in one line
        for bad in (["--schema", "x.sql"], ["--dsn", dsn, "--estimate-delta", "2"]):
            r = sqldp("policy", "init", *bad, "--estimate-epsilon", "1")
            assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
        r = sqldp("policy", "init", "--dsn", dsn, "--estimate-epsilon", "0")
        assert r.returncode == 2 and "--estimate-epsilon" in r.stderr, r.stderr
