"""``sqldp policy init`` and ``sqldp policy check`` through the real entry point: a policy written from the TPC-H
DDL and from the loaded database loads, validates and answers the TPC-H queries; what the catalog proves
(types, CHECK constraints, enums, composite keys) becomes ranges and domains with their reasons; ``check``
says per table what protects it and warns about the declarations that silently weaken a policy."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
from pg_support import loaded_database

from sqldp.catalog import Catalog
from sqldp.policy import Policy

ROOT = Path(__file__).resolve().parents[2]
QUERIES = sorted((ROOT / "benchmarks" / "tpch" / "queries").glob("q*.sql"))
PRIVATE = "customer,orders,lineitem"

# the queries `explain` answers under a policy init writes from the TPC-H schema with PRIVATE private: what the
# schema proves (no text domains, no date ranges) answers these; the hand-written tpch_catalog answers 18
ANSWERED_FROM_SCHEMA = {"q02", "q05", "q06", "q11", "q12", "q14", "q15", "q16", "q17", "q19", "q20", "q21"}


def sqldp(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sqldp.cli", *args], capture_output=True, text=True, timeout=180, env=dict(os.environ)
    )


def ok(r: subprocess.CompletedProcess[str]) -> str:
    assert r.returncode == 0, r.stderr
    return r.stdout


def one_line_error(r: subprocess.CompletedProcess[str]) -> str:
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    return lines[0]


def declarations_have_reasons(text: str) -> None:
    """Every declaration init writes says where it came from: a comment on its line or just above it."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith(("rows =", "range =", "domain =", "max_rows_per =")):
            assert "#" in line or lines[i - 1].startswith("#"), line


def test_init_from_the_tpch_ddl() -> None:
    text = ok(sqldp("policy", "init", "--schema", "tpch", "--private", PRIVATE))
    declarations_have_reasons(text)
    policy = Policy.from_toml(text)
    policy.validate(Catalog.from_file("tpch"))
    raw = tomllib.loads(text)["tables"]
    assert {t for t, spec in raw.items() if spec["rows"] == "private"} == set(PRIVATE.split(","))
    assert policy.table("part").public and policy.table("nation").public
    li = raw["lineitem"]
    assert li["max_rows_per"] == {"l_orderkey": 7}  # primary key (l_orderkey, l_linenumber), CHECK 1 … 7
    assert li["columns"]["l_quantity"]["range"] == [1, 50]  # CHECK BETWEEN 1 AND 50 narrows NUMERIC(15,2)
    assert li["columns"]["l_linenumber"]["domain"] == list(range(1, 8))
    assert raw["orders"]["columns"]["o_custkey"]["range"] == [-(2**31), 2**31 - 1]  # INTEGER's own range
    assert raw["orders"]["columns"]["o_shippriority"] == {"range": [0, 0], "domain": [0]}  # CHECK (… = 0)
    assert "l_returnflag" not in li["columns"]  # CHAR(1) proves no set of values: nothing is guessed
    assert "the schema file's claim" in text  # a DDL file's CHECK is a claim, and the file says so


@pytest.mark.pg
def test_init_from_the_database_answers_the_tpch_queries(tpch_dsn: tuple[str, Any, Any], tmp_path: Path) -> None:
    dsn = tpch_dsn[0]
    out = tmp_path / "init.toml"
    said = ok(sqldp("policy", "init", "--dsn", dsn, "--private", PRIVATE, "-o", str(out)))
    assert f"wrote {out}: 3 private and 5 public table(s)" in said
    text = out.read_text()
    declarations_have_reasons(text)
    assert "the schema file's claim" not in text  # the database enforces its CHECKs
    assert "# foreign key (l_partkey, l_suppkey) → partsupp(ps_partkey, ps_suppkey)" in text
    assert tomllib.loads(text)["tables"]["lineitem"]["max_rows_per"] == {"l_orderkey": 7}
    again = sqldp("policy", "init", "--dsn", dsn, "-o", str(out))
    assert "--force" in one_line_error(again)  # an existing file is not replaced without --force
    answered = set()
    for q in QUERIES:
        r = sqldp("explain", "--dsn", dsn, "--policy", str(out), "--format", "json", "-f", str(q))
        assert r.returncode in (0, 2), r.stderr  # answered, or refused with its reason: never an internal error
        if r.returncode == 0:
            answered.add(q.stem)
        else:
            assert json.loads(r.stdout)["refused"], r.stdout
    assert answered >= ANSWERED_FROM_SCHEMA, sorted(answered)


SCHEMA = """
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
CREATE TABLE person (
    id      INTEGER PRIMARY KEY,
    mood    mood NOT NULL,
    vip     BOOLEAN,
    age     SMALLINT CHECK (age >= 0 AND age < 130),
    score   NUMERIC(5,2) CHECK (score > 0),
    grade   VARCHAR(2) CHECK (grade IN ('A', 'B', 'C')),
    level   INTEGER CHECK (level = 1 OR level = 2 OR level = 5),
    born    DATE CHECK (born BETWEEN '1900-01-01' AND '2030-12-31'),
    note    TEXT
);
CREATE TABLE visit (
    person_id INTEGER REFERENCES person (id),
    slot      INTEGER CHECK (slot BETWEEN 1 AND 3),
    amount    NUMERIC(7,2),
    PRIMARY KEY (person_id, slot)
);
CREATE TABLE later (
    l_slot   INTEGER,
    l_person INTEGER,
    FOREIGN KEY (l_slot, l_person) REFERENCES visit (slot, person_id)
);
"""


def _expected(raw: dict[str, Any]) -> None:
    person = raw["person"]["columns"]
    assert raw["person"]["rows"] == "private" and raw["visit"]["rows"] == "public"
    assert person["mood"] == {"domain": ["sad", "ok", "happy"]}  # the enum's labels, in its order
    assert person["vip"] == {"domain": [False, True]}
    assert person["age"]["range"] == [0, 129]  # the strict < on an integer column: 129
    assert person["score"]["range"] == [0, 999.99]  # NUMERIC(5,2) for the high end, the CHECK for the low
    assert person["grade"] == {"domain": ["A", "B", "C"]}
    assert person["level"] == {"range": [1, 5], "domain": [1, 2, 5]}
    assert person["born"]["range"] == ["1900-01-01", "2030-12-31"] and person["born"]["unit"] == "day"
    assert "note" not in person and "max_rows_per" not in raw["person"]
    assert raw["visit"]["columns"]["amount"]["range"] == [-99999.99, 99999.99]
    assert "max_rows_per" not in raw["visit"]  # public: no truncation declared


@pytest.mark.pg
def test_init_reads_types_checks_and_enums(pg_server_dsn: str, tmp_path: Path) -> None:
    ddl = tmp_path / "schema.sql"
    ddl.write_text(SCHEMA)
    from_file = ok(sqldp("policy", "init", "--schema", str(ddl), "--private", "person"))
    _expected(tomllib.loads(from_file)["tables"])
    private = ok(sqldp("policy", "init", "--schema", str(ddl), "--private", "person,visit"))
    assert tomllib.loads(private)["tables"]["visit"]["max_rows_per"] == {"person_id": 3}  # (person_id, slot)
    with loaded_database(pg_server_dsn, SCHEMA) as conn:
        dsn = conn.info.dsn
        policy = tmp_path / "db.toml"
        ok(sqldp("policy", "init", "--dsn", dsn, "--private", "person", "-o", str(policy)))
        _expected(tomllib.loads(policy.read_text())["tables"])
        # a composite foreign key pairs each column with the one it references, in the constraint's order
        assert "# foreign key (l_slot, l_person) → visit(slot, person_id)" in policy.read_text()
        conn.execute("INSERT INTO person (id, mood) VALUES (1, 'ok'), (2, 'sad')")
        # the enum's domain answers GROUP BY over the private table
        r = sqldp("explain", "--dsn", dsn, "--policy", str(policy), "SELECT mood, COUNT(*) FROM person GROUP BY mood")
        assert r.returncode == 0, r.stdout + r.stderr
    assert "no table 'nobody'" in one_line_error(sqldp("policy", "init", "--schema", str(ddl), "--private", "nobody"))


def test_check_says_what_each_table_declares() -> None:
    out = ok(sqldp("policy", "check", "--policy", "tpch", "--schema", "tpch"))
    lines = {line.split()[0]: line for line in out.splitlines()[2:]}
    assert "valid against the schema tpch.sql shipped with sqldp" in out.splitlines()[0]
    assert "defaults: ε 1, mechanism cauchy, 78% error bars" in out
    assert lines["nation"].split(None, 1)[1].startswith("public: rows and values released exactly")
    assert "row-private (weight 1); values private under l1(0.01*c_acctbal)" in lines["customer"]
    assert "c_acctbal [-999.99, 9999.99]" in lines["customer"] and "c_mktsegment (5 values)" in lines["customer"]
    assert "o_orderdate [1992-01-01, 1998-08-02]" in lines["orders"]
    assert "warning" not in out
    payload = json.loads(
        ok(sqldp("policy", "check", "--policy", "tpch_catalog", "--schema", "tpch", "--format", "json"))
    )
    assert payload["tables"]["part"].startswith("public") and payload["warnings"] == []


DDL = """
CREATE TABLE customer (c_custkey INTEGER PRIMARY KEY, c_acctbal NUMERIC(15,2));
CREATE TABLE orders (o_orderkey INTEGER PRIMARY KEY, o_custkey INTEGER REFERENCES customer (c_custkey), n INTEGER);
CREATE TABLE stats (s_key INTEGER PRIMARY KEY, v INTEGER);
"""


@pytest.mark.pg
def test_check_warns_of_the_silent_mistakes(pg_server_dsn: str, tmp_path: Path) -> None:
    ddl = tmp_path / "schema.sql"
    ddl.write_text(DDL)
    policy = tmp_path / "p.toml"
    policy.write_text(
        '[tables.customer]\nrows = "private"\n'
        '[tables.orders]\nrows = "public"\n'  # public, but referencing private customers
        '[tables.stats]\nrows = "public"\nweight = 2.0\nnorm = "l1(v)"\n'  # value-private without a word
    )
    out = ok(sqldp("policy", "check", "--policy", str(policy), "--schema", str(ddl)))
    warnings = [line for line in out.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 3, out
    assert 'tables.stats: rows = "public" with a norm: stats is value-private' in warnings[0]
    assert "tables.stats.weight: has no effect" in warnings[1]
    assert "tables.orders: public, but references private customer through (o_custkey)" in warnings[2]
    assert "value-private: rows public (counted exactly), the values of l1(v) protected" in out
    with loaded_database(pg_server_dsn, DDL) as conn:  # `run` says it too, in one line, and answers
        run = sqldp(
            "run", "--dsn", conn.info.dsn, "--policy", str(policy), "--epsilon", "1", "SELECT COUNT(*) FROM stats"
        )
    assert run.returncode == 0, run.stderr
    assert run.stderr.startswith("sqldp: note: ") and len(run.stderr.splitlines()) == 1
    assert 'rows = "public" with a norm: stats is value-private' in run.stderr


def test_a_fractional_range_on_an_integer_column_is_refused_at_load(tmp_path: Path) -> None:
    ddl = tmp_path / "schema.sql"
    ddl.write_text(DDL)
    policy = tmp_path / "p.toml"
    policy.write_text("[tables.orders.columns.n]\nrange = [0.5, 10]\n")
    for command in (("policy", "check"), ("explain", "SELECT COUNT(*) FROM customer")):
        line = one_line_error(sqldp(*command, "--policy", str(policy), "--schema", str(ddl)))
        assert "tables.orders.columns.n.range: column orders.n is INT: its range must be whole numbers" in line
    policy.write_text("[tables.orders.columns.n]\nrange = [1, 10.0]\n")  # whole numbers written as floats: fine
    ok(sqldp("policy", "check", "--policy", str(policy), "--schema", str(ddl)))
