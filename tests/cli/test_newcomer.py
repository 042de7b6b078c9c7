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
    if policy == "tpch_catalog":  # the text says what the JSON says (one case: each CLI call takes seconds)
        assert f"mechanism = {ran['mechanism']}" in ok(sqldp(tpch, "analyze", "--policy", policy, sql))


@pytest.mark.parametrize(
    ("policy", "flags", "sql"),
    [
        ("tpch_catalog", (), "SELECT COUNT(*) FROM orders"),
        ("tpch_catalog", ("--epsilon", "0.3", "--confidence", "0.95"), "SELECT SUM(l_quantity) FROM lineitem"),
        ("tpch_catalog", (), "SELECT COUNT(*) FROM orders, lineitem WHERE o_orderkey = l_orderkey"),  # schema keys
        ("tpch", ("--epsilon", "2"), "SELECT o_orderpriority, COUNT(*), AVG(o_totalprice) FROM orders GROUP BY 1"),
    ],
)
def test_analyze_gives_the_error_run_will_have(tpch: str, policy: str, flags: tuple[str, ...], sql: str) -> None:
    """Where the bound is a number the query, the schema and the policy fix, analyze (nothing read) gives the
    noise scale and bar per value that run then calibrates, for every group."""
    plan = json.loads(ok(sqldp(tpch, "analyze", "--policy", policy, "--format", "json", *flags, sql)))["plan"]
    ran = json.loads(ok(sqldp(tpch, "run", "--policy", policy, "--seed", "1", "--format", "json", *flags, sql)))
    assert all("half_width" in step for step in plan), plan
    for group in ran["measurements"]:
        for step, m in zip(plan, group, strict=True):
            assert step["aggregate"] == m["aggregate"]
            assert (step["noise_scale"], step["half_width"]) == (m["noise_scale"], m["half_width"])
    if flags:  # the text gives the same figure (two cases: each CLI call takes seconds)
        text = ok(sqldp(tpch, "analyze", "--policy", policy, *flags, sql))
        assert f"± {plan[0]['half_width']:.3g} per value at {ran['confidence']:.0%} confidence" in text


def test_analyze_says_the_form_of_an_error_it_cannot_give(tpch: str) -> None:
    public_rows = "SELECT COUNT(*) FROM lineitem, part WHERE l_partkey = p_partkey AND p_size > 3"
    smoothed = "SELECT COUNT(*) FROM orders a, orders b WHERE a.o_custkey = b.o_custkey"
    text = ok(sqldp(tpch, "analyze", "--policy", "tpch_catalog", public_rows))  # part is public there
    assert "laplace-global: a data-independent ± bar comes with each value" in text
    text = ok(sqldp(tpch, "analyze", "--policy", "tpch", smoothed))
    assert "cauchy: no ± bar (the noise is scaled to a bound computed from the data)" in text
    plan = json.loads(ok(sqldp(tpch, "analyze", "--policy", "tpch", "--format", "json", smoothed)))["plan"]
    assert "half_width" not in plan[0] and "noise_scale" not in plan[0]


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


def one_line(r: subprocess.CompletedProcess[str]) -> str:
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    return lines[0]


def test_run_with_a_budget_file_is_charged_and_refused_once_spent(pg_dsn: str, tmp_path: Path) -> None:
    import psycopg

    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE t (id INT PRIMARY KEY, x INT); INSERT INTO t SELECT g, g % 7 FROM generate_series(1, 50) g"
        )
    budget = tmp_path / "mine.toml"
    budget.write_text("epsilon_limit = 2.5\n")
    query = "SELECT COUNT(*) FROM t"

    def show() -> dict[str, Any]:
        out = json.loads(ok(sqldp(pg_dsn, "budget", "show", "--budget", str(budget), "--format", "json")))
        (entry,) = out["analysts"]
        return dict(entry)

    # nothing charged yet, no ledger in the database yet: the file's limit, nothing spent
    assert show() == {
        "analyst": "cli:mine", "epsilon_limit": 2.5, "epsilon_spent": 0.0, "epsilon_left": 2.5,
        "delta_limit": 0.0, "delta_spent": 0.0, "queries": 0,
    }  # fmt: skip
    for spent in (1.0, 2.0):
        out = json.loads(ok(sqldp(pg_dsn, "run", "--budget", str(budget), "--epsilon", "1", "--format", "json", query)))
        assert isinstance(out["answer"], float)
        assert out["budget"]["epsilon_spent"] == spent and out["budget"]["queries"] == spent
        assert out["budget"]["epsilon_left"] == 2.5 - spent and out["budget"]["entry"] == "cli:mine"
    text = ok(sqldp(pg_dsn, "run", "--budget", str(budget), "--epsilon", "0.25", query))
    assert text.splitlines()[-1].startswith("budget cli:mine: ε 2.25 of 2.5 spent, 0.25 left (3 runs;")
    # the next run does not fit: refused before anything is read, and nothing is charged
    line = one_line(sqldp(pg_dsn, "run", "--budget", str(budget), "--epsilon", "1", query))
    assert "privacy budget exhausted" in line and "0.25 of 2.5 left" in line
    # a query refused by the analysis is refused before the charge
    one_line(sqldp(pg_dsn, "run", "--budget", str(budget), "--epsilon", "0.1", "SELECT x FROM t"))
    shown = show()
    assert shown["epsilon_spent"] == 2.25 and shown["queries"] == 3
    # the file is the limit's source: raising it lets the next run through; what was spent is kept
    budget.write_text('name = "mine"\nepsilon_limit = 4\n')
    ok(sqldp(pg_dsn, "run", "--budget", str(budget), "--epsilon", "1", query))
    assert show()["epsilon_spent"] == 3.25
    # without --budget nothing is charged (the command line keeps no budget)
    ok(sqldp(pg_dsn, "run", "--epsilon", "1", query))
    assert show()["epsilon_spent"] == 3.25
    listed = json.loads(ok(sqldp(pg_dsn, "budget", "show", "--format", "json")))
    assert [a["analyst"] for a in listed["analysts"]] == ["cli:mine"]


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (None, "cannot read budget file: No such file or directory"),
        ("epsilon_limt = 2\n", "unknown key 'epsilon_limt'"),
        ("delta_limit = 0\n", "epsilon_limit is missing"),
        ("epsilon_limit = -1\n", "epsilon_limit must be a number in [0, 1e+06], got -1"),
        ("epsilon_limit = 1\ndelta_limit = 2\n", "delta_limit must be a number in [0, 1], got 2"),
        ("epsilon_limit = [\n", "not a TOML budget file"),
    ],
)
def test_a_bad_budget_file_is_one_line_naming_it(tmp_path: Path, content: str | None, expected: str) -> None:
    budget = tmp_path / "b.toml"
    if content is not None:
        budget.write_text(content)
    # no database is reached: the file is checked first
    line = one_line(sqldp("postgresql://nobody@127.0.0.1:1/none", "run", "--budget", str(budget), "SELECT 1"))
    assert line.startswith(f"sqldp: error: {budget}") and expected in line, line


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sqldp.cli", *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(
    ("args", "error", "where"),
    [
        (("explain", "SELEC 1"), "syntax error", "query:1:7"),
        (("explain", "-f", "missing.sql"), "cannot read query file: No such file or directory", "missing.sql"),
        (("explain", "--bogus", "SELECT 1"), "unrecognized arguments: --bogus", None),
        (("run", "--budget", "missing.toml", "SELECT 1"), "cannot read budget file", "missing.toml"),
    ],
)
def test_errors_under_format_json_are_one_json_object(
    tmp_path: Path, args: tuple[str, ...], error: str, where: str | None
) -> None:
    ddl = tmp_path / "s.sql"
    ddl.write_text("CREATE TABLE t (id INT PRIMARY KEY, x INT);\n")
    for form in (("--format", "json"), ("--format=json",)):
        r = _cli(*args, "--schema", str(ddl), *form)
        assert r.returncode == 2 and r.stdout == "" and len(r.stderr.splitlines()) == 1, r.stderr
        obj = json.loads(r.stderr)
        assert set(obj) == {"error", "where"} and error in obj["error"] and obj["where"] == where, obj
    text = _cli(*args, "--schema", str(ddl))  # without --format json: the one line of text, as before
    assert text.returncode == 2 and text.stderr.startswith("sqldp: error: ") and error in text.stderr


def test_char_group_keys_are_trimmed_in_json(tpch: str) -> None:
    """CHAR(n) pads its values; a group is what PostgreSQL's = makes it, so its key is the unpadded value,
    whether the groups are declared (o_orderpriority CHAR(15)), a public table's (n_name CHAR(25)) or chosen
    by partition selection (p_brand CHAR(10))."""
    selection = ("--mechanism", "laplace", "--delta", "1e-6")
    cases = [
        ((), "SELECT o_orderpriority, COUNT(*) FROM orders GROUP BY 1", "o_orderpriority"),
        ((), "SELECT n_name, COUNT(*) FROM customer, nation WHERE c_nationkey = n_nationkey GROUP BY 1", "n_name"),
        (selection, "SELECT p_brand, COUNT(*) FROM part GROUP BY 1", "p_brand"),
    ]
    for flags, sql, key in cases:
        out = json.loads(ok(sqldp(tpch, "run", "--policy", "tpch", "--seed", "2", "--format", "json", *flags, sql)))
        keys = [row["key"][key] for row in out["rows"]]
        assert keys and all(k == k.rstrip(" ") for k in keys), keys


def test_an_avgs_audit_error_is_its_own_bar(tpch: str) -> None:
    """The audit's top-level error of AVG(o_totalprice) was its centred SUM's half-width (about 1.2·10⁶ at SF
    0.01), not the AVG's bar (about 190): it is the released answer's own bar, and says whose."""
    sql = "SELECT AVG(o_totalprice) AS avg_price FROM orders"
    out = json.loads(ok(sqldp(tpch, "run", "--policy", "tpch", "--seed", "4", "--audit", "--format", "json", sql)))
    assert out["error"]["absolute"] == out["errors"]["avg_price"] and out["error"]["of"] == "avg_price"
    widest = max(m["half_width"] for m in out["measurements"][0])
    assert out["error"]["absolute"] < widest / 100  # the SUM's bar is in the SUM's units
    text = ok(sqldp(tpch, "run", "--policy", "tpch", "--seed", "4", "--audit", sql))
    assert f"± {out['error']['absolute']:.6g} (avg_price)" in text


def test_the_plot_flag_says_it_needs_matplotlib() -> None:
    listing = _cli("--help").stdout
    assert "--plot needs matplotlib" in " ".join(listing.split())
    assert "needs matplotlib (pip install 'sqldp[plot]')" in " ".join(_cli("epsilon", "--help").stdout.split())


def _proxy(upstream: str, policy: str) -> tuple[subprocess.Popen[str], int, list[str]]:
    """``sqldp proxy`` (one process) on a free port, once it says it listens; with what it said before."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = ["proxy", "--upstream", upstream, "--policy", policy, "--listen", f"127.0.0.1:{port}", "--workers", "1"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "sqldp.cli", *argv, "--log-level", "warning"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    said: list[str] = []
    while not said or "listening" not in said[-1]:
        line = proc.stderr.readline()
        if not line:
            proc.kill()
            raise RuntimeError(f"proxy did not start: {said}")
        said.append(line.rstrip("\n"))
    return proc, port, said[:-1]


def _stop(proc: subprocess.Popen[str]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _with_password(args: list[str], password: str) -> subprocess.CompletedProcess[str]:
    """``sqldp ARGS`` (no database) with ``password`` on standard input, as ``--password-stdin`` reads it."""
    return subprocess.run(
        [sys.executable, "-m", "sqldp.cli", *args], input=f"{password}\n", capture_output=True, text=True, timeout=60
    )


def test_an_analyst_added_by_the_command_can_log_in_to_the_proxy(tpch: str, tmp_path: Path) -> None:
    import psycopg

    policy = tmp_path / "mine.toml"
    add = ["analyst", "add", "alice", "--policy", str(policy), "--password-stdin", "--epsilon-limit", "2"]
    ok(_with_password([*add, "--from", "tpch"], "correct horse"))
    assert "correct horse" not in policy.read_text() and "SCRAM-SHA-256$4096:" in policy.read_text()
    # the shipped policy's tables are all there, with the analyst after them
    shipped = (ROOT / "schemas" / "tpch.toml").read_text()
    assert policy.read_text().startswith(shipped.rstrip("\n"))
    again = _with_password(add, "x")
    assert one_line(again).endswith("analysts.alice: analyst 'alice' is in the policy already")
    proc, port, said = _proxy(tpch, str(policy))
    try:
        assert said == []  # an analyst can log in: no warning
        client = f"host=127.0.0.1 port={port} dbname=tpch user=alice"
        with psycopg.connect(f"{client} password='correct horse'", autocommit=True) as conn:
            (value,) = conn.execute("SELECT COUNT(*) FROM orders").fetchone() or (None,)
        assert isinstance(value, float)
        with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
            psycopg.connect(f"{client} password='wrong horse'").close()
    finally:
        _stop(proc)
    shown = json.loads(ok(sqldp(tpch, "budget", "show", "alice", "--format", "json")))["analysts"][0]
    assert shown["epsilon_limit"] == 2.0 and shown["queries"] == 1 and shown["epsilon_spent"] > 0


def test_the_proxy_warns_when_no_analyst_can_log_in(tpch: str) -> None:
    proc, _, said = _proxy(tpch, "tpch")  # the shipped policy names no analyst
    _stop(proc)
    assert len(said) == 1 and said[0].startswith("sqldp proxy: warning: the policy names no analyst")
    assert "sqldp analyst add NAME --policy FILE" in said[0] and "--from tpch" in said[0]


def test_analyst_add_keeps_verifiers_in_the_credentials_file(tmp_path: Path) -> None:
    from sqldp.policy.document import Policy
    from sqldp.proxy.config import load

    policy = tmp_path / "p.toml"
    policy.write_text('[proxy]\ncredentials = "creds.toml"\n\n[tables.t]\nrows = "private"\n')
    for name, limit in (("alice", "3"), ("bob o'neil", "0.5")):
        add = ["analyst", "add", name, "--policy", str(policy), "--password-stdin", "--epsilon-limit", limit]
        ok(_with_password([*add, "--delta-limit", "1e-6"], "pw"))
    creds = tmp_path / "creds.toml"
    assert "SCRAM-SHA-256$" not in policy.read_text() and creds.read_text().count("SCRAM-SHA-256$") == 2
    assert creds.stat().st_mode & 0o777 == 0o600  # verifiers stay the owner's
    config = load(Policy.from_file(policy))
    assert {a: (x.epsilon_limit, x.delta_limit) for a, x in config.analysts.items()} == {
        "alice": (3.0, 1e-6),
        "bob o'neil": (0.5, 1e-6),
    }
    assert {p.name for p in tmp_path.iterdir()} == {"p.toml", "creds.toml"}  # no staging file left behind


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("--policy", "none.toml"), "none.toml: no such file; give --from POLICY"),
        (("--policy", "none.toml", "--from", "nosuch"), "cannot read policy file"),
        (("--policy", "none.toml", "--from", "tpch", "--epsilon-limit", "-1"), "--epsilon-limit: must be a number"),
    ],
)
def test_analyst_add_refuses_with_one_line(tmp_path: Path, args: tuple[str, ...], expected: str) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "sqldp.cli", "analyst", "add", "alice", "--password-stdin", *args],
        input="pw\n",
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert expected in one_line(r)
    assert not (tmp_path / "none.toml").exists()


def test_the_demo_answers_and_says_what_next(pg_dsn: str) -> None:
    """The README's first command, on a fresh database: it loads both data sets, every answer it prints has
    its bar or the mark that says why not, and it ends by saying where to go next."""
    r = subprocess.run(
        [sys.executable, "-m", "sqldp.cli", "demo", "--dsn", pg_dsn], capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr
    answers = [line.strip() for line in r.stdout.splitlines() if line.strip().startswith("answer = ")]
    assert len(answers) >= 5
    assert all("±" in a or a.endswith(" *") or a.endswith(" †") for a in answers), answers
    assert r.stdout.rstrip().splitlines()[-5].strip() == "== what next"
    assert "Traceback" not in r.stderr
