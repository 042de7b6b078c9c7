"""The runner end to end on a real PostgreSQL: answers with noise, the JSON contract, GROUP BY groups and
composition, refusals, and the library API."""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest

import sqldp
from sqldp.commands.analyze import _describe_term, format_text
from sqldp.engine.postgres import engine as postgres
from sqldp.errors import ForbiddenError, RefusedError
from sqldp.policy import Policy

DDL = """
CREATE TABLE t (name TEXT PRIMARY KEY, faculty TEXT, time INT);
CREATE TABLE f (faculty TEXT PRIMARY KEY, building TEXT);
"""
POLICY = """
[defaults]
epsilon = 1.0
[tables.f]
rows = "public"
[tables.t.columns.time]
range = [0, 60]
[tables.t.columns.faculty]
domain = ["math", "cs", "art"]
"""


@pytest.fixture
def db(pg_dsn: str, tmp_path: Path) -> tuple[str, Path]:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(DDL)
        conn.execute(
            "INSERT INTO t SELECT 's' || g, CASE WHEN g % 3 = 0 THEN 'math' ELSE 'cs' END, g % 61 "
            "FROM generate_series(1, 300) g"
        )
        conn.execute("INSERT INTO f VALUES ('math', 'X'), ('cs', 'Y'), ('art', 'Z')")
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY)
    return pg_dsn, policy


def test_count_is_noisy_and_calibrated(db: tuple[str, Path]) -> None:
    dsn, policy = db
    session = sqldp.connect(dsn, policy)
    answers = [session.run("SELECT COUNT(*) FROM t").answer for _ in range(30)]
    out = session.run("SELECT COUNT(*) FROM t", audit=True).to_json()  # the data owner's view
    assert out["audit"] is True and "not be handed to analysts" in out["warning"]
    for key in ("epsilon", "delta", "beta", "mechanism", "sensitivity", "noise_scale", "error", "tables", "answer"):
        assert key in out
    assert out["sensitivity"] == 1.0 and out["mechanism"] == "laplace-global" and out["test_mode"] is False
    # a single-table COUNT's bound is global: Laplace at 1/ε (no smoothing, β = 0), where generalized Cauchy
    # needed 1/(ε/5 − β) ≥ 5
    assert out["noise_scale"] == 1.0 and out["beta"] == 0.0
    # the Laplace half-width −ln(1 − c) = 1.51, plus 0.5 for the release's rounding of the count to an integer
    # (sqldp.aggregates.counted)
    assert out["error"]["absolute"] == pytest.approx(-math.log(1 - 0.78) + 0.5, rel=1e-9)
    assert all(float(a).is_integer() and a >= 0 for a in answers)
    assert len(set(answers)) > 3  # fresh noise every time (rounded to integers at scale 1: some repeat)
    assert abs(statistics.median(answers) - 300) < 5 * out["noise_scale"]
    assert "true_value" not in json.dumps(out)


def test_seeded_runs_are_reproducible_and_marked(db: tuple[str, Path]) -> None:
    dsn, policy = db
    a = sqldp.connect(dsn, policy, seed=3).run("SELECT SUM(time) FROM t")
    b = sqldp.connect(dsn, policy, seed=3).run("SELECT SUM(time) FROM t")
    assert a.answer == b.answer and a.to_json()["test_mode"] is True
    assert a.to_json(audit=True)["sensitivity"] == 60.0  # max |time| over the declared range [0, 60]


def test_group_by_answers_every_declared_group(db: tuple[str, Path]) -> None:
    dsn, policy = db
    out = sqldp.connect(dsn, policy).run("SELECT faculty, COUNT(*) AS n FROM t GROUP BY faculty ORDER BY faculty")
    js = out.to_json()
    keys = [r["key"]["faculty"] for r in js["rows"]]
    assert keys == ["art", "cs", "math"]  # 'art' has no rows and is answered too; ORDER BY on the output
    # one private use, groups tied to its row: parallel composition, each group gets the full ε
    assert all(m["epsilon"] == 1.0 for group in js["measurements"] for m in group)
    cols, rows = out.table()
    assert cols == ["faculty", "n"] and len(rows) == 3


def test_group_by_over_a_join_is_one_histogram_release(db: tuple[str, Path]) -> None:
    dsn, policy = db
    js = (
        sqldp.connect(dsn, policy)
        .analyze("SELECT a.faculty, COUNT(*) FROM t a, t b WHERE a.faculty = b.faculty GROUP BY a.faculty")
        .to_json()
    )
    # a self-join: one row moves one group, but its data-dependent bound is shared by the 3 groups: one
    # generalized-Cauchy release of the histogram (ℓ1, m-fold dilation, sqldp.release.dilated) at the full ε
    assert all(m["epsilon"] == pytest.approx(1.0) for group in js["measurements"] for m in group)
    planned = sqldp.connect(dsn, policy).analyze(
        "SELECT a.faculty, COUNT(*) FROM t a, t b WHERE a.faculty = b.faculty GROUP BY a.faculty", audit=False
    )
    assert [p["groups"] for p in planned.to_json()["plan"]] == [
        "full share (ℓ1 over the groups, one generalized-Cauchy release of the histogram)"
    ]
    assert "answer" not in js and "rows" not in js  # analyze releases nothing


def test_avg_is_two_measurements(db: tuple[str, Path]) -> None:
    dsn, policy = db
    js = sqldp.connect(dsn, policy).run("SELECT AVG(time) FROM t WHERE faculty = 'math'").to_json()
    # time has range [0, 60]: the sum is centred on 30 (half the sensitivity of SUM(time))
    assert [m["aggregate"] for m in js["measurements"][0]] == ["SUM(t.time - 30)", "COUNT(t.time)"]
    assert all(m["epsilon"] == 0.5 for m in js["measurements"][0])
    assert "AVG → 30 + SUM(x − 30)/COUNT(x), clamped to [0, 60]" in js["notes"]


def test_public_tables_are_answered_exactly(db: tuple[str, Path]) -> None:
    dsn, policy = db
    out = sqldp.connect(dsn, policy).run("SELECT building FROM f WHERE faculty = 'cs'")
    assert out.public and out.table() == (["building"], [("Y",)])


@pytest.mark.parametrize(
    ("sql", "error", "reason"),
    [
        ("SELECT name FROM t", ForbiddenError, "releases rows of private table"),
        ("SELECT MAX(time) FROM t", RefusedError, "MIN and MAX need the value-level analysis"),
        ("SELECT SUM(LENGTH(name)) FROM t", RefusedError, "cannot bound"),
        ("SELECT building, COUNT(*) FROM t, f WHERE t.faculty = f.faculty GROUP BY building", None, None),
        ("SELECT name, COUNT(*) FROM t GROUP BY name", RefusedError, "declare the column's domain"),
    ],
)
def test_refusals_name_the_reason(db: tuple[str, Path], sql: str, error: type | None, reason: str | None) -> None:
    dsn, policy = db
    session = sqldp.connect(dsn, policy)
    if error is None:
        assert session.analyze(sql).to_json()["sensitivity"] > 0  # a public key column: allowed
        return
    with pytest.raises(error, match=reason):
        session.analyze(sql)


def test_value_sensitive_columns_get_the_combined_analysis(db: tuple[str, Path], tmp_path: Path) -> None:
    dsn, _ = db
    policy = tmp_path / "values.toml"
    policy.write_text('[tables.t]\nnorm = "l1(time)"\n[tables.t.columns.time]\nrange = [0, 60]\n')
    session = sqldp.connect(dsn, policy)
    # no sensitive value read: the row analysis alone (sensitivity 1)
    assert session.analyze("SELECT COUNT(*) FROM t WHERE faculty = 'cs'", epsilon=1).to_json()["sensitivity"] == 1
    # a filter on a protected value: rows and values both protected (NR §3.3.9), never less than the row bound
    out = session.analyze("SELECT COUNT(*) FROM t WHERE time > 30", epsilon=1, beta=0.1).to_json()
    assert math.isfinite(out["sensitivity"]) and out["sensitivity"] >= 1
    # the text output prints each part of the table's term, with the JSON's numbers, and no raw dict
    term = out["tables"]["t"]
    text = format_text(out)
    assert "{'" not in text, text
    # rows private and the filter an exact step: a global combined bound, which reads no value-level scan
    assert "value_sensitivity" not in term
    assert "values under l1(time) (rows private): global bound, c3·c4 below (no value-level scan)" in text
    assert f"rows: sensitivity {term['rows']['sensitivity']:.6g}" in text
    assert f"combined: {term['combined_sensitivity']:.6g} (NR §3.3.9: c3 = {term['c3']:.6g}" in text
    assert "private filters' slopes: time 1" in text
    # shapes the value analysis does not cover stay refused with a reason
    with pytest.raises(RefusedError):
        session.analyze("SELECT MAX(time) FROM t", epsilon=1)


def test_a_global_row_term_is_described_without_a_derivative_at_the_data() -> None:
    """A data-independent row bound reads no count at the data (sqldp.sensitivity.rows, "what a global bound
    reads"): its term has no derivative, and the text says so instead of printing the dict; a combined bound's
    table with private rows and no value read (TPC-H Q12's orders) prints its row term likewise."""
    term = {"uses": ["orders"], "weight": 1.0, "smooth_derivative": 7.0, "sensitivity": 7.0}
    line = "sensitivity 7 (global derivative bound 7, no count read at the data; G = 1; uses orders)"
    assert _describe_term(term) == [line]
    assert _describe_term({"rows": term}) == ["rows: " + line]
    with_derivative = {**term, "derivative": 6.0}
    assert _describe_term(with_derivative) == [
        "sensitivity 7 (derivative 6 at the data, 7 smoothed; G = 1; uses orders)"
    ]


def test_prepare_reads_no_data_and_refuses_early(db: tuple[str, Path]) -> None:
    dsn, policy = db
    session = sqldp.connect(dsn, policy)
    prepared = session.prepare("SELECT COUNT(*) FROM t", epsilon=0.5)
    assert prepared.params is not None and prepared.params.epsilon == 0.5 and not prepared.public
    with pytest.raises(RefusedError):
        session.prepare("SELECT MIN(time) FROM t")
    assert prepared.run().released


def test_cli_run_json_contract(db: tuple[str, Path]) -> None:
    dsn, policy = db
    r = subprocess.run(
        [sys.executable, "-m", "sqldp.cli", "run", "--dsn", dsn, "--policy", str(policy), "--format", "json",
         "--mechanism", "laplace", "--delta", "1e-6", "SELECT COUNT(*) FROM t"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    # a single-table COUNT has a global bound: Laplace at 1/ε, pure ε-DP, whatever mechanism was asked for
    assert out["mechanism"] == "laplace-global" and out["delta"] == 1e-6 and isinstance(out["answer"], float)
    r = subprocess.run(
        [sys.executable, "-m", "sqldp.cli", "run", "--dsn", dsn, "--policy", str(policy), "--beta", "0.5",
         "SELECT COUNT(*) FROM t a, t b WHERE a.faculty = b.faculty"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "β = 0.5 is too large" in r.stderr


def test_a_repeated_query_reuses_its_analysis(db: tuple[str, Path]) -> None:
    dsn, policy = db
    session = sqldp.connect(dsn, policy=policy, seed=3)
    first = session.prepare("SELECT COUNT(*) FROM t WHERE time > 10", epsilon=1.0)
    again = session.prepare("SELECT COUNT(*) FROM t WHERE time > 10", epsilon=1.0)
    other = session.prepare("SELECT COUNT(*) FROM t WHERE time > 10", epsilon=0.5)
    assert again.plans is first.plans and again.statements.answer == first.statements.answer
    assert other.plans is not first.plans and other.params.epsilon == 0.5  # type: ignore[union-attr]
    assert again.run().timings["analysis"] < first.run().timings["analysis"]
    session.close()


def test_sensitivity_queries_read_the_answers_snapshot(db: tuple[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """The sensitivity queries run on a second connection that imports the answer's snapshot: a row committed
    after the snapshot was exported (here, just before the second connection starts) is seen by neither."""
    dsn, policy = db
    session = sqldp.connect(dsn, policy=policy, seed=3)
    prepared = session.prepare("SELECT COUNT(*) FROM t", epsilon=1.0)
    prepared.speed.last = 10.0  # a slow query: the two-connection path
    spare = session.engine._spare_connection

    @contextmanager
    def late() -> Iterator[psycopg.Connection]:
        with psycopg.connect(dsn, autocommit=True) as writer:
            writer.execute("INSERT INTO t VALUES ('late', 'math', 5)")
        with spare() as conn:
            yield conn

    monkeypatch.setattr(session.engine, "_spare_connection", late)
    with session.connection() as conn:
        before = conn.execute("SELECT COUNT(*) FROM t").fetchone()[0]
        queries = ("SELECT COUNT(*) FROM t", "SELECT 1")
        statements = dataclasses.replace(prepared.statements, queries=queries, domains=())
        rows, _, _ = session.engine._answer_and_queries(conn, statements, prepared.speed)
        postgres.end(conn)
        after = conn.execute("SELECT COUNT(*) FROM t").fetchone()[0]
    assert rows == [[(before,)], [(before,)], [(1,)]] and after == before + 1
    session.close()


def test_session_connections_are_read_only_and_keep_their_prepared_statements(db: tuple[str, Path]) -> None:
    """The session reads through autocommit connections with default_transaction_read_only (a write fails,
    in a statement of its own or in the snapshot's transaction); its transactions end with COMMIT, which,
    unlike psycopg's rollback(), keeps the statements psycopg prepared after a few runs (re-planning the
    analysis queries would cost more than running them on small queries)."""
    dsn, policy = db
    session = sqldp.connect(dsn, policy=policy, seed=3)
    query = "SELECT f.building, COUNT(*) FROM t, f WHERE t.faculty = f.faculty GROUP BY f.building"
    prepared = session.prepare(query, epsilon=1.0)
    assert prepared.statements.queries or any(prepared.statements.domains)  # several statements: BEGIN … COMMIT
    for _ in range(8):
        session.run(query, epsilon=1.0)
    with session.connection() as conn:
        prepared = conn.execute("SELECT count(*) FROM pg_prepared_statements").fetchone()[0]
        assert prepared >= 1
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
            conn.execute("CREATE TABLE written (a int)")
        conn.execute(postgres.BEGIN)
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
            conn.execute("INSERT INTO t VALUES ('x', 'math', 1)")
        conn.execute("ROLLBACK")
    session.close()


def test_a_row_level_self_join_runs_unfolded(db: tuple[str, Path]) -> None:
    """A row plan's own ``grouped`` queries (pattern maps of a self-join) are not the value plan's grouped
    scans the runner folds into the answer (a name clash once sent them to the fold and failed)."""
    dsn, policy = db
    session = sqldp.connect(dsn, policy=policy, seed=3)
    query = "SELECT COUNT(*) FROM t AS a, t AS b WHERE a.faculty = b.faculty"
    prepared = session.prepare(query, epsilon=1.0)
    assert prepared.statements.queries and not prepared.statements.folded
    m = prepared.analyze().measurements[0][0]
    # NR §3.3.7: the derivative of Σ_f m_f² in the multiplicity of a cs row is 2·200 (then smoothed)
    assert m.true_value == 100**2 + 200**2 and m.sensitivity >= 2 * 200
    session.close()


def test_nulls_are_skipped_not_clamped(pg_dsn: str) -> None:
    """SUM clamps its columns to the declared range; a NULL must stay NULL (skipped by SUM and COUNT), not
    become the range's low end (LEAST(GREATEST(NULL, 18), 99) is 18 in PostgreSQL: SUM was 24,000 here)."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE n (id INT PRIMARY KEY, age INT, w NUMERIC(6, 2))")
        conn.execute(
            "INSERT INTO n SELECT g, CASE WHEN g % 2 = 0 THEN NULL ELSE 30 END, CASE WHEN g % 3 = 0 THEN NULL "
            "ELSE 1.5 END FROM generate_series(1, 1000) g"
        )
        plain = conn.execute("SELECT SUM(age), COUNT(age), SUM(age * w) FROM n").fetchone()
    policy = Policy.from_toml(
        '[tables.n]\nrows = "private"\nnorm = "l1(w)"\n[tables.n.columns.age]\nrange = [18, 99]\n'
        "[tables.n.columns.w]\nrange = [1, 2]\n"
    )
    session = sqldp.connect(pg_dsn, policy=policy, seed=1)
    assert session.run("SELECT SUM(n.age) FROM n", epsilon=1.0).measurements[0][0].true_value == plain[0]
    avg = session.run("SELECT AVG(n.age) FROM n", epsilon=1.0).measurements[0]
    # centred on 58.5, the middle of [18, 99]: SUM(age − 58.5) over the non-NULL ages, and their count
    assert [m.true_value for m in avg] == [float(plain[0]) - 58.5 * plain[1], plain[1]]
    # combined row and value privacy clamps too (w is value-sensitive, rows private)
    combined = session.run("SELECT SUM(n.age * n.w) FROM n", epsilon=1.0).measurements[0][0]
    assert combined.true_value == pytest.approx(float(plain[2]))


def test_having_filters_the_noisy_groups(db: tuple[str, Path]) -> None:
    """HAVING runs on the released (noisy) aggregates — post-processing — and its own aggregates are measured
    and paid like the SELECT list's: SUM(time) here is a third measurement at ε/2 besides COUNT(*)."""
    dsn, policy = db
    session = sqldp.connect(dsn, policy, seed=4)
    sql = "SELECT faculty, COUNT(*) AS n FROM t GROUP BY faculty HAVING COUNT(*) > 150 AND SUM(time) > 0"
    out = session.run(sql, epsilon=2.0)
    assert [r["key"]["faculty"] for r in out.rows] == ["cs"]  # 200 cs rows, 100 math, 0 art
    assert [m.aggregate for m in out.measurements[0]] == ["COUNT(*)", "SUM(t.time)"]
    assert {m.epsilon for g in out.measurements for m in g} == {1.0}
    assert "HAVING evaluated on the noisy aggregates (post-processing)" in out.notes
    # a condition no group meets releases no row, and costs the same
    assert session.run(sql.replace("> 150", "> 1000000"), epsilon=2.0).rows == []
