"""The example datasets: TPC-H DDL, policy and queries, the cafeteria example, and their loaders.

The loaders run against a real PostgreSQL (see conftest.py). TPC-H is generated once per test session at
SF 0.01 into a database of its own (the ``tpch_dsn`` fixture); tests that must start from an empty database
use ``pg_dsn``.
"""

from __future__ import annotations

import datetime as dt
import math
import tomllib
from pathlib import Path

import psycopg
import pytest
import sqlglot
from psycopg import sql

from sqldp import datasets
from sqldp.catalog import Catalog
from sqldp.errors import DatabaseError, InputError, SqlSyntaxError
from sqldp.policy import Policy

SF = 0.01  # the scale factor of conftest's tpch_dsn fixture
QUERIES = Path(__file__).resolve().parents[2] / "benchmarks" / "tpch" / "queries"
TPCH_QUERIES = sorted(QUERIES.glob("q*.sql"))
NAPLES_QUERIES = sorted((QUERIES / "naples").glob("q*.sql"))


def _tables(dsn: str) -> set[str]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'").fetchall()
    return {r[0] for r in rows}


# -- files (no database) --------------------------------------------------------------------------


def test_dataset_path_finds_the_shipped_files() -> None:
    for name in ("tpch.sql", "tpch.toml", "cafeteria.sql", "cafeteria.toml", "cafeteria.csv"):
        assert datasets.dataset_path(name).is_file()
    with pytest.raises(InputError, match=r"no dataset file 'nope\.sql'"):
        datasets.dataset_path("nope.sql")
    with pytest.raises(InputError, match="plain file name"):
        datasets.dataset_path("../datasets.py")


def test_tpch_ddl_parses_into_the_spec_schema() -> None:
    text = datasets.dataset_path("tpch.sql").read_text(encoding="utf-8")
    assert all(s is not None for s in sqlglot.parse(text, read="postgres"))
    cat = Catalog.from_ddl(text)
    assert set(cat.tables) == set(datasets.TPCH_TABLES)
    assert cat.tables["lineitem"].primary_key == ("l_orderkey", "l_linenumber")
    assert cat.tables["partsupp"].primary_key == ("ps_partkey", "ps_suppkey")
    fks = {(t.name, fk.columns, fk.ref_table) for t in cat.tables.values() for fk in t.foreign_keys}
    assert ("lineitem", ("l_partkey", "l_suppkey"), "partsupp") in fks
    assert ("orders", ("o_custkey",), "customer") in fks
    assert ("nation", ("n_regionkey",), "region") in fks
    assert len(fks) == 10  # spec §1.4.2.3
    li = cat.tables["lineitem"].columns
    assert (li["l_shipdate"].kind, li["l_quantity"].type_sql, li["l_returnflag"].type_sql) == (
        "date",
        "DECIMAL(15, 2)",
        "CHAR(1)",
    )
    assert cat.tables["orders"].columns["o_orderkey"].type_sql == "BIGINT"


@pytest.mark.parametrize("path", TPCH_QUERIES + NAPLES_QUERIES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_query_files_parse(path: Path) -> None:
    tree = sqlglot.parse_one(path.read_text(encoding="utf-8"), read="postgres")
    assert isinstance(tree, sqlglot.exp.Query)


def test_there_are_22_tpch_and_21_naples_queries() -> None:
    assert [p.name for p in TPCH_QUERIES] == [f"q{i:02d}.sql" for i in range(1, 23)]
    assert len(NAPLES_QUERIES) == 21
    assert (QUERIES / "naples" / "README.md").is_file()
    limits = {"q02.sql": 100, "q03.sql": 10, "q10.sql": 20, "q18.sql": 100, "q21.sql": 100}
    for p in TPCH_QUERIES:
        limit = sqlglot.parse_one(p.read_text(encoding="utf-8"), read="postgres").args.get("limit")
        assert (int(limit.expression.name) if limit else None) == limits.get(p.name), p.name


def test_tpch_policy_mirrors_naples_norms() -> None:
    policy = Policy.from_file(datasets.dataset_path("tpch.toml"))
    policy.validate(Catalog.from_file(datasets.dataset_path("tpch.sql")))
    norms = {name: str(t.norm) if t.norm else None for name, t in policy.tables.items()}
    # NR §4.3.3.3, dates in days instead of 30-day months (the factor 30 drops out)
    assert norms == {
        "region": None,
        "nation": None,
        "part": "l1(p_size, 0.01*p_retailprice)",
        "partsupp": "l1(ps_availqty, 0.01*ps_supplycost)",
        "supplier": "l1(0.01*s_acctbal)",
        "customer": "l1(0.01*c_acctbal)",
        "orders": "l1(o_orderdate, 0.01*o_totalprice)",
        "lineitem": "l1(l_quantity, 0.0001*l_extendedprice, 50*l_discount, "
        "linf(l_shipdate, l_commitdate, l_receiptdate))",
    }
    assert policy.table("nation").public and policy.table("region").public
    for name in ("part", "partsupp", "supplier", "customer", "orders", "lineitem"):
        t = policy.table(name)
        assert t.rows_private and t.weight == 1.0
    li = policy.table("lineitem")
    # one day of change in the latest-moving date costs 1, as in NAPLES
    assert li.norm.evaluate({"l_shipdate": 1.0, "l_receiptdate": 1.0}) == 1.0
    assert math.isclose(li.norm.evaluate({"l_discount": 0.02}), 1.0)
    assert li.column("l_shipdate").unit == "day" and li.column("l_shipdate").range is not None
    assert policy.table("orders").column("o_orderpriority").domain == (
        "1-URGENT",
        "2-HIGH",
        "3-MEDIUM",
        "4-NOT SPECIFIED",
        "5-LOW",
    )
    # NAPLES' β = 0.1 is passed by benchmarks/naples_bench.py; the policy lets sqldp choose β (Thm 3.73), since
    # a fixed 0.1 is infeasible once ε is split over many aggregates (TPC-H Q1)
    assert (policy.defaults.epsilon, policy.defaults.beta, policy.defaults.mechanism) == (1.0, None, "cauchy")


def test_cafeteria_files() -> None:
    text = datasets.dataset_path("cafeteria.sql").read_text(encoding="utf-8")
    cat = Catalog.from_ddl(text)
    assert list(cat.tables["t"].columns) == ["name", "faculty", "time"]
    raw = tomllib.loads(datasets.dataset_path("cafeteria.toml").read_text(encoding="utf-8"))
    time_col = raw["tables"]["t"]["columns"]["time"]
    assert time_col["range"] == [0, 60]
    assert time_col["knowledge"] == {"kind": "range_uniform", "lo": 0, "hi": 60}
    assert raw["goals"] == [{"attributes": {"t.time": 2.0}, "combine": "and", "advantage": 0.05}]
    rows = datasets.dataset_path("cafeteria.csv").read_text(encoding="utf-8").splitlines()
    assert rows[0] == "name,faculty,time" and len(rows) == 41
    assert rows[1:4] == ["Alice,math,20", "Bob,math,15", "Eve,computer science,25"]  # the cafeteria example


def test_cafeteria_policy_loads() -> None:
    pytest.importorskip("sqldp.priors")
    pytest.importorskip("sqldp.advantage")
    policy = Policy.from_file(datasets.dataset_path("cafeteria.toml"))
    policy.validate(Catalog.from_file(datasets.dataset_path("cafeteria.sql")))
    assert str(policy.table("t").norm) == "l1(time)"
    assert policy.table("t").column("time").knowledge is not None
    assert len(policy.goals) == 1


@pytest.mark.parametrize("sf", [0, -0.5, math.nan, math.inf, "x"])
def test_bad_scale_factor_is_an_input_error(sf: object) -> None:
    with pytest.raises(InputError, match="scale factor"):
        datasets.load_tpch("postgresql://unused", sf)  # type: ignore[arg-type]


def test_scale_factors_with_duplicate_partsupp_keys_are_refused() -> None:
    # checked against tpchgen-cli's output: 0.001 … 0.005, 0.012 and 0.015 repeat (ps_partkey, ps_suppkey)
    candidates = (0.001, 0.005, 0.008, 0.01, 0.012, 0.015, 0.02, 0.1, 1, 10)
    assert [sf for sf in candidates if datasets.tpch_keys_unique(sf)] == [0.008, 0.01, 0.02, 0.1, 1, 10]
    with pytest.raises(InputError, match="duplicate partsupp keys"):
        datasets.load_tpch("postgresql://unused", 0.001)


def test_missing_tpchgen_is_an_input_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(datasets, "TPCHGEN", "tpchgen-cli-that-does-not-exist")
    with pytest.raises(InputError, match="not found"):
        datasets.find_tpchgen()


def test_tpchgen_is_found() -> None:
    assert datasets.find_tpchgen().name.startswith("tpchgen-cli")


# -- TPC-H loaded (one shared database) -----------------------------------------------------------


def test_row_counts_follow_the_spec(tpch_dsn) -> None:
    dsn, counts, _ = tpch_dsn
    expected = datasets.expected_tpch_rows(SF)
    assert list(counts) == list(datasets.TPCH_TABLES)
    for table in datasets.TPCH_TABLES:
        if table == "lineitem":  # 1..7 lines per order, 4 on average (spec §4.2.3)
            assert 3.8 * counts["orders"] <= counts[table] <= 4.2 * counts["orders"]
        else:
            assert counts[table] == expected[table], table
    assert (counts["nation"], counts["region"], counts["orders"]) == (25, 5, 15_000)
    with psycopg.connect(dsn) as conn:
        for table, n in counts.items():
            assert conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table))).fetchone()[0] == n


def test_progress_is_reported_per_table(tpch_dsn) -> None:
    _, _, reports = tpch_dsn
    assert list(reports) == list(datasets.TPCH_TABLES)
    for table, calls in reports.items():
        done = [d for d, _ in calls]
        assert done == sorted(done), table
        assert len({t for _, t in calls}) == 1 and calls[-1][0] == calls[-1][1] > 0, table
    assert len(reports["lineitem"]) > 2  # streamed in chunks


def test_foreign_keys_hold(tpch_dsn) -> None:
    dsn, _, _ = tpch_dsn
    cat = Catalog.from_file(datasets.dataset_path("tpch.sql"))
    with psycopg.connect(dsn) as conn:
        n_fk, n_valid = conn.execute(
            "SELECT count(*), count(*) FILTER (WHERE convalidated) FROM pg_constraint WHERE contype = 'f'"
        ).fetchone()
        assert n_fk == n_valid == 10
        for t in cat.tables.values():
            for fk in t.foreign_keys:
                on = sql.SQL(" AND ").join(
                    sql.SQL("r.{} = c.{}").format(sql.Identifier(rc), sql.Identifier(cc))
                    for cc, rc in zip(fk.columns, fk.ref_columns, strict=True)
                )
                orphans = conn.execute(
                    sql.SQL("SELECT count(*) FROM {} c WHERE NOT EXISTS (SELECT 1 FROM {} r WHERE {})").format(
                        sql.Identifier(t.name), sql.Identifier(fk.ref_table), on
                    )
                ).fetchone()[0]
                assert orphans == 0, (t.name, fk)
        live = Catalog.from_database(conn)
    for t in cat.tables.values():
        assert live.tables[t.name].primary_key == t.primary_key
        assert list(live.tables[t.name].columns) == list(t.columns)


@pytest.mark.parametrize("path", TPCH_QUERIES, ids=lambda p: p.name)
def test_tpch_query_runs_and_returns_rows(tpch_dsn, path: Path) -> None:
    dsn, _, _ = tpch_dsn
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(path.read_text(encoding="utf-8")).fetchall()
    assert rows


@pytest.mark.parametrize("path", NAPLES_QUERIES, ids=lambda p: p.name)
def test_naples_query_runs(tpch_dsn, path: Path) -> None:
    dsn, _, _ = tpch_dsn
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(path.read_text(encoding="utf-8")).fetchall()
    assert len(rows) == 1 and len(rows[0]) == 1


def test_data_stays_within_the_policy(tpch_dsn) -> None:
    """Every declared range and domain of tpch.toml holds on the generated data."""
    dsn, _, _ = tpch_dsn
    policy = Policy.from_file(datasets.dataset_path("tpch.toml"))
    epoch = dt.date(1970, 1, 1)
    with psycopg.connect(dsn) as conn:
        for t in policy.tables.values():
            for c in t.columns.values():
                col, tab = sql.Identifier(c.name), sql.Identifier(t.name)
                if c.range is not None:
                    lo, hi = conn.execute(sql.SQL("SELECT min({0}), max({0}) FROM {1}").format(col, tab)).fetchone()
                    if isinstance(lo, dt.date):
                        lo, hi = (lo - epoch).days, (hi - epoch).days
                    assert c.range[0] <= float(lo) <= float(hi) <= c.range[1], (t.name, c.name, lo, hi)
                if c.domain is not None:
                    rows = conn.execute(sql.SQL("SELECT DISTINCT {}::text FROM {}").format(col, tab)).fetchall()
                    values = {int(v) if isinstance(c.domain[0], int) else v for (v,) in rows}
                    assert values <= set(c.domain), (t.name, c.name, values - set(c.domain))


# -- loads that must leave nothing behind ---------------------------------------------------------


def test_bad_ddl_path_leaves_no_tables(pg_dsn: str, tmp_path: Path) -> None:
    with pytest.raises(InputError, match="cannot read schema file"):
        datasets.load_schema(pg_dsn, tmp_path / "missing.sql")
    broken = tmp_path / "broken.sql"
    broken.write_text("CREATE TABLE a (x INTEGER PRIMARY KEY);\nCREATE TABLE b (y INTEGER REFERENCES nowhere (z));\n")
    with pytest.raises(DatabaseError) as err:
        datasets.load_schema(pg_dsn, broken)
    assert "broken.sql:2" in str(err.value) and "\n" not in str(err.value)
    unparsable = tmp_path / "unparsable.sql"
    unparsable.write_text("CREATE TABLE a (x INTEGER);\nCREATE TABLE (;\n")
    with pytest.raises(SqlSyntaxError):
        datasets.load_schema(pg_dsn, unparsable)
    assert _tables(pg_dsn) == set()


def test_failed_copy_rolls_back_every_table(pg_dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    real = datasets.generate_tpch

    def corrupt(scale_factor: float, outdir: Path | str) -> dict[str, Path]:
        files = real(scale_factor, outdir)
        with files["lineitem"].open("a", encoding="utf-8") as f:  # the last table loaded
            f.write("1,2,3,not-a-line-number,1,1,0,0,N,O,1996-01-01,1996-01-01,1996-01-01,NONE,AIR,x\n")
        return files

    monkeypatch.setattr(datasets, "generate_tpch", corrupt)
    with pytest.raises(DatabaseError, match="table lineitem") as err:
        datasets.load_tpch(pg_dsn, SF)
    assert "\n" not in str(err.value)
    assert _tables(pg_dsn) == set()


def test_loading_twice_needs_replace(pg_dsn: str) -> None:
    assert datasets.load_cafeteria(pg_dsn) == {"t": 40}
    with pytest.raises(DatabaseError, match="already exists"):
        datasets.load_cafeteria(pg_dsn)
    assert datasets.load_cafeteria(pg_dsn, replace=True) == {"t": 40}
    assert _tables(pg_dsn) == {"t"}


def test_load_schema_creates_tables(pg_dsn: str) -> None:
    assert datasets.load_schema(pg_dsn, datasets.dataset_path("tpch.sql")) == list(datasets.TPCH_TABLES)
    assert _tables(pg_dsn) == set(datasets.TPCH_TABLES)


# -- the cafeteria example ------------------------------------------------------------------------


def test_cafeteria_loads_and_answers(pg_dsn: str) -> None:
    assert datasets.load_cafeteria(pg_dsn) == {"t": 40}
    with psycopg.connect(pg_dsn) as conn:
        (avg,) = conn.execute("SELECT AVG(time) FROM t WHERE faculty = 'math'").fetchone()
        assert float(avg) == 21.0  # 11 math students, 231 minutes
        assert conn.execute("SELECT faculty, time FROM t WHERE name = 'Alice'").fetchone() == ("math", 20)
        assert conn.execute("SELECT min(time) >= 0 AND max(time) <= 60 FROM t").fetchone() == (True,)


def test_load_of_another_scale_says_how_to_replace_it(pg_dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`sqldp load tpch --scale X` over TPC-H of another scale said "already loaded" and kept the old data;
    now it names the loaded scale and --reload (the demo keeps using what is there)."""
    from sqldp.commands.demo import load

    load(pg_dsn, "tpch", 0.008, strict_scale=True)
    # the phases that report no progress of their own are announced (tens of seconds each at SF 1)
    said = capsys.readouterr().err
    for phase in ("generating TPC-H SF 0.008 with tpchgen-cli", "adding foreign keys and indexes", "ANALYZE"):
        assert phase in said
    load(pg_dsn, "tpch", 0.008, strict_scale=True)  # the same scale: nothing to do
    assert "already loaded" in capsys.readouterr().err
    with pytest.raises(InputError, match=r"scale factor 0\.008 is loaded, not 0\.01; pass --reload") as err:
        load(pg_dsn, "tpch", 0.01, strict_scale=True)
    assert err.value.where == "--scale"
    load(pg_dsn, "tpch", 0.01)  # the demo's call: uses what is loaded
