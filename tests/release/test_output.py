"""What sqldp's output reveals (docs/output.md, "What each output field reveals"): without audit mode, the output of
``run`` and ``analyze`` and the proxy's result sets carry nothing computed from the private data but the noisy
answer; every refusal that does not need the data comes before the proxy charges the analyst."""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from proxy_support import client_dsn, make_tables, raw_login, recv_message, write_policy

import sqldp
from sqldp.cli import main
from sqldp.errors import InputError
from sqldp.proxy import ThreadedProxy, build, ledger

# a self-join: its smooth sensitivity grows with the largest group (9.818 → 10.739 for one row more here)
JOIN = "SELECT COUNT(*) FROM priv a, priv b WHERE a.g = b.g"
POLICY = "[defaults]\nepsilon = 1.0\n[tables.priv.columns.g]\nrange = [0, 9]\n"


@pytest.fixture
def tiny(pg_dsn: str, tmp_path: Path) -> tuple[str, Path]:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE priv (id INT PRIMARY KEY, g INT NOT NULL)")
        conn.execute("INSERT INTO priv SELECT i, i % 3 FROM generate_series(1, 20) i")
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY)
    return pg_dsn, policy


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


def _json(capsys: pytest.CaptureFixture[str], dsn: str, policy: Path, command: str, *extra: str) -> dict[str, Any]:
    return json.loads(_cli(capsys, command, "--dsn", dsn, "--policy", str(policy), "--format", "json", *extra, JOIN))


def _without_answer(out: dict[str, Any]) -> dict[str, Any]:
    """The output with the noisy answer taken out: what must not change when one private row is added."""
    rest = {k: v for k, v in out.items() if k not in ("answer", "values")}
    groups = out["measurements"]
    rest["measurements"] = [[{k: v for k, v in m.items() if k != "noisy_value"} for m in g] for g in groups]
    return rest


def _add_row(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO priv VALUES (21, 1)")  # into the largest group


def test_output_without_audit_is_the_same_on_neighbouring_databases(
    tiny: tuple[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """One row added: the non-audit output of ``run`` differs only in the noisy answer, that of ``analyze``
    not at all; the audit output does differ (so the comparison can see a leak)."""
    dsn, policy = tiny
    before = {cmd: _json(capsys, dsn, policy, cmd) for cmd in ("run", "analyze")}
    audit_before = _json(capsys, dsn, policy, "run", "--audit")
    text_before = _cli(capsys, "run", "--dsn", dsn, "--policy", str(policy), JOIN).splitlines()
    _add_row(dsn)
    after = {cmd: _json(capsys, dsn, policy, cmd) for cmd in ("run", "analyze")}
    audit_after = _json(capsys, dsn, policy, "run", "--audit")
    text_after = _cli(capsys, "run", "--dsn", dsn, "--policy", str(policy), JOIN).splitlines()

    assert audit_before["sensitivity"] != audit_after["sensitivity"]  # the figure that leaked before
    assert _without_answer(before["run"]) == _without_answer(after["run"])
    assert before["analyze"] == after["analyze"]
    assert [x for x in text_before if not x.startswith("answer")] == [
        x for x in text_after if not x.startswith("answer")
    ]
    for out in (*before.values(), *after.values()):
        assert out["audit"] is False
        assert not {"sensitivity", "noise_scale", "error", "tables", "timings_ms", "warning"} & out.keys()
        assert out["beta"] is None  # β chosen per answer (NR Theorem 3.73): not shown
        assert all(
            set(m) <= {"aggregate", "epsilon", "delta", "mechanism", "noisy_value"}
            for g in out["measurements"]
            for m in g
        )
    assert isinstance(after["run"]["answer"], float) and "answer" not in after["analyze"]
    assert after["analyze"]["plan"] == [
        {"aggregate": "COUNT(*)", "groups": "full share", "epsilon": 1.0, "delta": None, "mechanism": "cauchy"}
    ]


def test_audit_mode_says_so(tiny: tuple[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    dsn, policy = tiny
    out = _json(capsys, dsn, policy, "analyze", "--audit")
    assert out["audit"] is True and "AUDIT MODE" in out["warning"] and out["sensitivity"] > 1
    assert out["beta"] > 0 and out["measurements"][0][0]["noise_scale"] == out["noise_scale"]
    text = _cli(capsys, "run", "--audit", "--dsn", dsn, "--policy", str(policy), JOIN)
    assert text.splitlines()[0].startswith("AUDIT MODE") and "sensitivity = " in text
    plain = _cli(capsys, "run", "--dsn", dsn, "--policy", str(policy), JOIN)
    assert "AUDIT" not in plain and "sensitivity" not in plain and "β" not in plain and "error" not in plain
    # the library: run's serialisation is the analyst's unless asked; the attributes stay for the data owner
    result = sqldp.connect(dsn, policy).run(JOIN)
    assert "sensitivity" not in result.to_json() and result.to_json(audit=True)["sensitivity"] > 1
    assert result.measurements[0][0].sensitivity > 1


@pytest.mark.parametrize("query", [JOIN, "SELECT AVG(a.g) FROM priv a, priv b WHERE a.g = b.g"])
def test_a_beta_too_large_is_refused_at_prepare_naming_what_the_user_set(
    tiny: tuple[str, Path], tmp_path: Path, query: str
) -> None:
    """ε = 0.5 and β = 0.1: generalized Cauchy needs β < ε_share/(γ+1) = 0.1 (COUNT) or 0.05 (AVG's two
    measurements, NR Theorem 3.53). Refused before anything is read, with ``where`` the flag or policy key.
    (A self-join: its bound is smoothed. A single-table COUNT has a global bound and uses no β.)"""
    dsn, policy = tiny
    session = sqldp.connect(dsn, policy)
    with pytest.raises(InputError, match="too large") as given:
        session.prepare(query, epsilon=0.5, beta=0.1)
    assert given.value.where == "--beta"
    from_policy = tmp_path / "beta.toml"
    from_policy.write_text(POLICY.replace("epsilon = 1.0", "epsilon = 0.5\nbeta = 0.1"))
    with pytest.raises(InputError, match="too large") as err:
        sqldp.connect(dsn, from_policy).prepare(query)
    assert err.value.where == "defaults.beta" and "--beta" not in str(err.value)
    assert session.prepare(query, epsilon=0.5).params is not None  # β chosen by sqldp: feasible
    # a data-independent bound is released with Laplace at c/ε and no β: a fixed β is no constraint on it
    assert session.prepare("SELECT COUNT(*) FROM priv", epsilon=0.5, beta=0.1).params is not None


# -- the proxy ------------------------------------------------------------------------------------


@pytest.fixture
def proxied(pg_dsn: str, tmp_path: Path) -> Iterator[tuple[ThreadedProxy, str]]:
    make_tables(pg_dsn, rows=20)
    analysts = {"alice": {"epsilon_limit": 3.5}, "carol": {"epsilon_limit": 3.5, "epsilon": 0.5, "beta": 0.1}}
    policy = write_policy(tmp_path / "policy.toml", analysts)
    with ThreadedProxy(build(pg_dsn, policy)) as p:
        yield p, pg_dsn


def _spent(dsn: str, analyst: str) -> float:
    with psycopg.connect(dsn) as conn:
        b = ledger.balance(conn, analyst)
        return 0.0 if b is None else float(b.epsilon_spent)


@pytest.mark.parametrize(
    "query",
    [
        f"SELECT {items} FROM visits a, visits b WHERE a.faculty = b.faculty"  # self-joins: smoothed bounds
        for items in ("COUNT(*)", "AVG(a.minutes)", "COUNT(*), SUM(a.minutes)")
    ],
)
def test_proxy_refuses_a_beta_too_large_before_the_charge(proxied: tuple[ThreadedProxy, str], query: str) -> None:
    """The proxy charged ε and then failed at calibration; now the refusal comes first and the ledger is
    unchanged. The message names the analyst's configuration key, not a command-line flag."""
    proxy, dsn = proxied
    with (
        psycopg.connect(client_dsn(proxy.port, user="carol"), autocommit=True) as conn,
        pytest.raises(psycopg.Error) as err,
    ):
        conn.execute(query)
    assert _spent(dsn, "carol") == 0.0
    message = str(err.value)
    assert "too large" in message and "analysts.carol.beta" in message and "--beta" not in message


def _simple_query(port: int, sql: str) -> list[tuple[bytes, bytes]]:
    """Every message the proxy sends for one simple Query, up to ReadyForQuery."""
    sock = raw_login(port)
    try:
        body = sql.encode() + b"\0"
        sock.sendall(b"Q" + struct.pack("!i", len(body) + 4) + body)
        out = []
        while True:
            kind, payload = recv_message(sock)
            out.append((kind, payload))
            if kind == b"Z":
                return out
    finally:
        sock.close()


def test_proxy_sends_the_noisy_rows_and_nothing_data_dependent(proxied: tuple[ThreadedProxy, str]) -> None:
    """The same NOTICE, RowDescription and CommandComplete on neighbouring databases: only the DataRow (the
    noisy value) may differ. The NOTICE says what the statement spent and the analyst's balance (the ledger,
    which moves with every charge, not with the data: masked here) and, for this data-dependent noise, no
    error bar."""
    proxy, dsn = proxied
    sql = "SELECT COUNT(*) AS n FROM visits a, visits b WHERE a.faculty = b.faculty"
    before = _simple_query(proxy.port, sql)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO visits VALUES (21, 'math', 5)")
    after = _simple_query(proxy.port, sql)
    assert [k for k, _ in before] == [k for k, _ in after] == [b"N", b"T", b"D", b"C", b"Z"]

    def shown(messages: list[tuple[bytes, bytes]]) -> list[bytes]:
        return [re.sub(rb"has \xce\xb5 = [0-9.e+-]+ of", b"has balance of", p) for k, p in messages if k != b"D"]

    assert shown(before) == shown(after)
    assert b"no error bars" in dict(before)[b"N"]
    assert _spent(dsn, "alice") == 2.0
