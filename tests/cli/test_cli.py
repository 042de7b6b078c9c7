"""The CLI's error contract: bad input → exit 2 and exactly one line on stderr, never a traceback."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

DDL = "CREATE TABLE t (id INT PRIMARY KEY, faculty TEXT, time INT);\nCREATE TABLE u (k INT PRIMARY KEY, v INT);\n"


def sqldp(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sqldp.cli", *args], capture_output=True, text=True, input=stdin, timeout=120
    )


@pytest.fixture
def schema(tmp_path: Path) -> Path:
    p = tmp_path / "schema.sql"
    p.write_text(DDL)
    return p


def one_line_error(r: subprocess.CompletedProcess[str], code: int = 2) -> str:
    assert r.returncode == code, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert "Traceback" not in r.stderr
    return lines[0]


def test_explain_json_self_join(schema: Path) -> None:
    r = sqldp("explain", "--schema", str(schema), "--format", "json", "SELECT COUNT(*) FROM t a, t b WHERE a.id = b.id")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert [u["table"] for u in out["analysis"]["uses"]] == ["t", "t"]
    assert out["algebra"]["op"] == "aggregate"


def test_explain_reads_query_from_file_and_stdin(schema: Path, tmp_path: Path) -> None:
    q = tmp_path / "q.sql"
    q.write_text("SELECT COUNT(*) FROM t")
    assert sqldp("explain", "--schema", str(schema), "-f", str(q)).returncode == 0
    q.write_text("SELECT SUM(time) FROM t")  # no declared range: run refuses it, and so does explain
    refused = sqldp("explain", "--schema", str(schema), "-f", str(q))
    assert refused.returncode == 2 and "needs a value range" in refused.stdout
    r = sqldp("explain", "--schema", str(schema), "-f", "-", stdin="SELECT COUNT(*) FROM u")
    assert r.returncode == 0 and "COUNT(*)" in r.stdout


def test_refused_query_is_explained_with_reason(schema: Path) -> None:
    r = sqldp("explain", "--schema", str(schema), "--format", "json", "SELECT COUNT(*) FROM t LEFT JOIN u ON id = k")
    assert r.returncode == 2  # what `run` would refuse: exit 2, the full explanation on stdout
    assert "LEFT JOIN" in json.loads(r.stdout)["refused"]["reason"]
    # refusals of the sensitivity analysis and the groups are found without data too
    r = sqldp(
        "explain", "--schema", str(schema), "--format", "json", "SELECT faculty, COUNT(*) FROM t GROUP BY faculty"
    )
    assert r.returncode == 2 and "which groups exist" in json.loads(r.stdout)["refused"]["reason"]
    ok = sqldp("explain", "--schema", str(schema), "--format", "json", "SELECT COUNT(*) FROM t")
    assert ok.returncode == 0 and json.loads(ok.stdout)["mechanisms"] == {"COUNT(*)": "laplace-global"}


def test_explain_takes_the_flags_its_refusal_names(schema: Path) -> None:
    """The refusal says "allow δ > 0 (--mechanism laplace --delta D)"; explain takes those flags and then shows
    what `run` with them would do (DP partition selection), not the refusal again."""
    query = "SELECT faculty, COUNT(*) FROM t GROUP BY faculty"
    refused = sqldp("explain", "--schema", str(schema), query)
    assert refused.returncode == 2 and "--mechanism laplace --delta D" in refused.stdout
    assert "Refused (query:1:" in refused.stdout  # the GROUP BY item's line and column
    flags = ("--mechanism", "laplace", "--delta", "1e-6")
    r = sqldp("explain", "--schema", str(schema), "--format", "json", *flags, query)
    assert r.returncode == 0, r.stdout
    out = json.loads(r.stdout)
    assert out["refused"] is None and set(out["mechanisms"].values()) <= {"laplace", "laplace-global"}
    # checked as run checks them: a bad value is the same one-line error
    assert "--epsilon" in one_line_error(sqldp("explain", "--schema", str(schema), "--epsilon", "1e9", query))


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("SELECT COUNT(* FROM t", "query:1:"),
        ("SELECT 1 FROM t; SELECT 2 FROM t", "exactly one statement"),
        ("SELECT COUNT(*) FROM missing", "table 'missing' does not exist"),
        ("SELECT SUM(nope) FROM t", "column 'nope' does not exist"),
        ("", "empty query"),
    ],
)
def test_bad_sql(schema: Path, query: str, expected: str) -> None:
    assert expected in one_line_error(sqldp("explain", "--schema", str(schema), query))


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ("[tables.t\n", "invalid TOML"),
        ("[tables.t]\nrows = 'maybe'\n", "tables.t.rows"),
        ("[tables.t]\nnorm = 'l1(time, nope)'\n", "column 'nope' is not in table 't'"),
        ("[tables.t]\nnorm = 'l7x(time)'\n", "tables.t.norm"),
        ("[tables.zzz]\nrows = 'public'\n", "table 'zzz' is not in the schema"),
        ("[defaults]\nepsilon = 'one'\n", "defaults.epsilon"),
    ],
)
def test_broken_policy(schema: Path, tmp_path: Path, policy: str, expected: str) -> None:
    p = tmp_path / "policy.toml"
    p.write_text(policy)
    line = one_line_error(sqldp("explain", "--schema", str(schema), "--policy", str(p), "SELECT COUNT(*) FROM t"))
    assert expected in line and str(p) in line


def test_bad_flag_and_missing_files(schema: Path) -> None:
    # the mistyped flag alone, once prefixed (not "sqldp: error: sqldp: … --nope SELECT 1")
    assert one_line_error(sqldp("explain", "--nope", "SELECT 1")) == "sqldp: error: unrecognized arguments: --nope"
    assert "cannot read schema file" in one_line_error(sqldp("explain", "--schema", "missing.sql", "SELECT 1"))
    assert "cannot read query file" in one_line_error(sqldp("explain", "--schema", str(schema), "-f", "missing.sql"))


def test_python_dash_m_sqldp_and_absurd_epsilon(schema: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "sqldp", "--version"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("sqldp ")
    from sqldp.errors import InputError
    from sqldp.params import resolve_params
    from sqldp.policy import Policy

    assert resolve_params(Policy(), epsilon=100.0).epsilon == 100.0
    with pytest.raises(InputError, match="protects nothing") as err:
        resolve_params(Policy(), epsilon=1e9)
    assert err.value.where == "--epsilon"


def test_help_imports_no_analysis_library() -> None:
    """`sqldp --help` builds every command's parser; it must not import the analyses' libraries (scipy, z3,
    gmpy2, numpy, sqlglot: about 0.9 s before commands imported them lazily), nor shtab (only `sqldp
    completion` needs it)."""
    heavy = "{'scipy', 'z3', 'gmpy2', 'numpy', 'sqlglot', 'shtab'}"
    code = (
        "import sys\nfrom sqldp.cli import build_parser\nbuild_parser()\n"
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & {heavy}))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "[]"


def test_shipped_policy_and_schema_by_name(tmp_path: Path) -> None:
    """`--policy tpch --schema tpch` reads the files shipped in the package, from any directory; an unknown
    bare name says which ones are shipped."""
    query = "SELECT COUNT(*) FROM orders"
    done = subprocess.run(
        [sys.executable, "-m", "sqldp", "explain", "--policy", "tpch", "--schema", "tpch", "--format", "json", query],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["analysis"]["uses"] == [{"table": "orders", "alias": "orders"}]
    wrong = subprocess.run(
        [sys.executable, "-m", "sqldp", "explain", "--policy", "tpcx", "--schema", "tpch", query],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert wrong.returncode != 0 and "shipped: cafeteria, tpcds, tpch, tpch_catalog" in wrong.stderr
    assert "Traceback" not in wrong.stderr


def test_an_option_given_twice_is_an_error_not_the_last_one() -> None:
    twice = subprocess.run(
        [sys.executable, "-m", "sqldp", "run", "--epsilon", "1", "--epsilon", "100", "SELECT 1"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert twice.returncode == 2
    assert twice.stderr.strip() == "sqldp: error: sqldp run: --epsilon is given more than once"
    repeated = subprocess.run(  # options that collect a list may repeat
        [sys.executable, "-m", "sqldp", "epsilon", "--advantage", "0.1", "--prior", "range_uniform:0:60", "--radius",
         "2", "--prior", "range_uniform:0:60", "--radius", "3", "--format", "json"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert repeated.returncode == 0, repeated.stderr


def test_completion_scripts_complete_subcommands_and_policy_names(tmp_path: Path) -> None:
    """`sqldp completion bash` (shtab, static): bash registers it for `sqldp` and completes the subcommands,
    flags, and --policy/--schema with the shipped names and the .toml/.sql files at hand."""
    script = tmp_path / "completion.bash"
    done = sqldp("completion", "bash")
    assert done.returncode == 0, done.stderr
    script.write_text(done.stdout, encoding="utf-8")
    (tmp_path / "mine.toml").touch()
    (tmp_path / "mine.sql").touch()
    probe = f"""
source {shlex.quote(str(script))}
complete -p sqldp
c() {{ COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); COMP_LINE="$*"; COMP_POINT=${{#COMP_LINE}}; COMPREPLY=()
  _shtab_sqldp; echo "${{COMPREPLY[*]}}"; }}
c sqldp ""
c sqldp ep
c sqldp run --po
c sqldp run --policy ""
c sqldp proxy --policy t
c sqldp explain --schema ""
"""
    out = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, timeout=60, cwd=tmp_path, check=True)
    lines = out.stdout.splitlines()
    assert lines[0] == "complete -o bashdefault -F _shtab_sqldp sqldp", out.stdout + out.stderr
    assert set(lines[1].split()) >= {"run", "explain", "proxy", "budget", "epsilon", "demo", "load", "completion"}
    assert lines[2:] == [
        "epsilon",
        "--policy",
        "cafeteria tpcds tpch tpch_catalog mine.toml",
        "tpcds tpch tpch_catalog",
        "cafeteria tpcds tpch mine.sql",
    ]
    zsh = sqldp("completion", "zsh")
    assert zsh.returncode == 0 and zsh.stdout.startswith("#compdef sqldp")
    assert "compadd -- cafeteria tpcds tpch" in zsh.stdout
    if shutil.which("zsh"):
        subprocess.run(["zsh", "-n"], input=zsh.stdout, text=True, check=True, timeout=60)
    assert sqldp("completion", "fish").returncode == 2
