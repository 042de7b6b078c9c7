"""TPC-DS: the DDL, the shipped ``tpcds`` policy, the 99 committed queries, and ``sqldp load tpcds``.

The loader test generates SF 0.01 with DuckDB's dsdgen (the ``tpcds`` extra, which the test extra installs)
and loads all 24 tables into a database of its own on the real PostgreSQL: a few seconds.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import psycopg
import pytest
import sqlglot

import sqldp
from sqldp import datasets
from sqldp.catalog import Catalog
from sqldp.cli import main
from sqldp.errors import InputError
from sqldp.policy import Policy

QUERIES = sorted((Path(__file__).resolve().parents[1] / "benchmarks" / "tpcds" / "queries").glob("q*.sql"))
PRIVATE = {
    "customer",
    "customer_address",
    "store_sales",
    "store_returns",
    "catalog_sales",
    "catalog_returns",
    "web_sales",
    "web_returns",
}


def _catalog() -> Catalog:
    return Catalog.from_file(datasets.dataset_path("tpcds.sql"))


def test_ddl_has_the_spec_tables_and_keys() -> None:
    cat = _catalog()
    assert len(cat.tables) == 24 and set(datasets.tpcds_tables()) == set(cat.tables)
    assert cat.tables["store_sales"].primary_key == ("ss_item_sk", "ss_ticket_number")
    assert cat.tables["inventory"].primary_key == ("inv_date_sk", "inv_item_sk", "inv_warehouse_sk")
    fks = {(t.name, fk.columns, fk.ref_table) for t in cat.tables.values() for fk in t.foreign_keys}
    assert ("store_sales", ("ss_customer_sk",), "customer") in fks
    assert ("catalog_sales", ("cs_bill_cdemo_sk",), "customer_demographics") in fks
    assert ("web_returns", ("wr_item_sk", "wr_order_number"), "web_sales") in fks
    assert ("household_demographics", ("hd_income_band_sk",), "income_band") in fks
    # every surrogate key but a table's own references a table
    for t in cat.tables.values():
        own = set(t.primary_key) if len(t.primary_key) == 1 else set()
        referenced = {c for fk in t.foreign_keys for c in fk.columns}
        assert {c for c in t.columns if c.endswith("_sk")} - own <= referenced, t.name


def test_policy_validates_against_the_ddl() -> None:
    policy = Policy.from_file("tpcds")  # a shipped name, as sqldp.connect(policy="tpcds") reads it
    policy.validate(_catalog())
    private = {name for name in _catalog().tables if not policy.table(name).public}
    assert private == PRIVATE
    assert policy.table("store_sales").column("ss_quantity").range is not None
    raw = tomllib.loads(datasets.dataset_path("tpcds.toml").read_text(encoding="utf-8"))
    assert raw["tables"]["store_sales"]["columns"]["ss_net_profit"]["range"] == [-10000.0, 20000.0]
    assert len(raw["tables"]["customer_address"]["columns"]["ca_state"]["domain"]) == 51


@pytest.mark.parametrize("path", QUERIES, ids=[p.stem for p in QUERIES])
def test_committed_query_parses_as_postgres(path: Path) -> None:
    trees = sqlglot.parse(path.read_text(encoding="utf-8"), read="postgres")
    assert len([t for t in trees if t is not None]) == 1


def test_all_99_queries_are_committed() -> None:
    assert [p.stem for p in QUERIES] == [f"q{n:02d}" for n in range(1, 100)]


def test_extension_of_another_duckdb_is_a_one_line_error() -> None:
    with pytest.raises(InputError, match=r"no tpcds extension for DuckDB 0\.0\.0 .*sqldp\[tpcds\]"):
        datasets.tpcds_extension("0.0.0")


def test_load_tpcds_sf_0_01(pg_dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["load", "tpcds", "--dsn", pg_dsn, "--scale", "0.01"]) == 0
    with psycopg.connect(pg_dsn) as conn:
        n = dict(conn.execute("SELECT relname, n_live_tup FROM pg_stat_user_tables").fetchall())
        counts = {t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in datasets.tpcds_tables()}  # type: ignore[index]
        fks = conn.execute("SELECT count(*) FROM pg_constraint WHERE contype = 'f'").fetchone()
        nulls = conn.execute("SELECT count(*) FROM store_sales WHERE ss_customer_sk IS NULL").fetchone()
        empty = conn.execute("SELECT count(*) FROM customer WHERE c_login = ''").fetchone()
        comment = conn.execute("SELECT obj_description('public.store_sales'::regclass, 'pg_class')").fetchone()
    assert len(counts) == 24 and len(n) == 24
    # dsdgen's row counts at SF 0.01 (the dimensions of fixed size and the scaled facts)
    assert counts["date_dim"] == 73049 and counts["time_dim"] == 86400
    assert counts["customer"] == 1000 and counts["store_sales"] == 28810 and counts["web_returns"] == 679
    assert fks is not None and fks[0] == 107  # every foreign key of tpcds.sql, validated over the data
    assert nulls is not None and nulls[0] > 0  # an empty CSV field is NULL …
    assert empty is not None and empty[0] == counts["customer"] - _nulls(pg_dsn, "customer", "c_login")  # … "" is ""
    assert comment == ("sqldp tpcds scale 0.01",)
    # loaded once: a second `load` of the same scale says so; another scale asks for --reload
    assert main(["load", "tpcds", "--dsn", pg_dsn, "--scale", "0.01"]) == 0
    assert "already loaded" in capsys.readouterr().err
    assert main(["load", "tpcds", "--dsn", pg_dsn, "--scale", "0.1"]) == 2
    assert "pass --reload" in capsys.readouterr().err
    # the shipped policy answers over the loaded data: one DP count of a private table
    session = sqldp.connect(pg_dsn, policy="tpcds")
    result = session.run("SELECT COUNT(*) FROM store_sales", epsilon=1.0)
    assert abs(result.rows[0]["values"]["count"] - counts["store_sales"]) < 1000


def _nulls(dsn: str, table: str, column: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(f"SELECT count(*) FROM {table} WHERE {column} IS NULL").fetchone()
    assert row is not None
    return int(row[0])
