"""The PostgreSQL wire-protocol proxy with real clients (psycopg 3, psql, SQLAlchemy) against a real upstream."""

from __future__ import annotations

import shutil
import socket
import struct
import subprocess
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from proxy_support import (
    PASSWORD,
    _msg,
    client_dsn,
    error_fields,
    make_tables,
    raw_login,
    recv_message,
    start_proxy,
    write_policy,
)
from psycopg import errors as pg_errors

from sqldp.cli import main
from sqldp.errors import PolicyError
from sqldp.policy import Policy
from sqldp.proxy import ThreadedProxy, build, ledger
from sqldp.proxy.config import load
from sqldp.proxy.scram import make_verifier


@pytest.fixture
def upstream(pg_dsn: str) -> str:
    make_tables(pg_dsn)
    return pg_dsn


@pytest.fixture
def proxy(upstream: str, tmp_path: Path) -> Iterator[ThreadedProxy]:
    policy = write_policy(tmp_path / "policy.toml", {"alice": {"epsilon_limit": 3.5}, "bob": {"epsilon_limit": 100.0}})
    with ThreadedProxy(build(upstream, policy)) as p:
        yield p


def spent(dsn: str, analyst: str) -> float:
    with psycopg.connect(dsn) as conn:
        b = ledger.balance(conn, analyst)
        assert b is not None
        return float(b.epsilon_spent)


# -- psycopg 3 ------------------------------------------------------------------------------------


def test_psycopg_public_answers_are_exact_with_and_without_parameters(proxy: ThreadedProxy, upstream: str) -> None:
    with psycopg.connect(client_dsn(proxy.port), autocommit=True) as conn:
        cur = conn.execute("SELECT n_name, n_nationkey FROM nation ORDER BY n_nationkey")
        assert cur.fetchall() == [("ALGERIA", 1), ("ARGENTINA", 2), ("BRAZIL", 3)]
        assert [d.name for d in cur.description or []] == ["n_name", "n_nationkey"]
        assert cur.description[0].type_code == 25  # text
        # extended protocol with parameters, int and text
        assert conn.execute("SELECT n_name FROM nation WHERE n_nationkey = %s", (2,)).fetchall() == [("ARGENTINA",)]
        assert conn.execute("SELECT n_nationkey FROM nation WHERE n_name = %s", ("BRAZIL",)).fetchall() == [(3,)]
        # a quote in a parameter stays a value
        assert conn.execute("SELECT n_nationkey FROM nation WHERE n_name = %s", ("x' OR '1'='1",)).fetchall() == []
        # named server-side prepared statements (psycopg prepares after repeated use, or when asked)
        for key in (1, 3):
            got = conn.execute("SELECT n_name FROM nation WHERE n_nationkey = %s", (key,), prepare=True).fetchall()
            assert got == [("ALGERIA",)] if key == 1 else [("BRAZIL",)]
    assert spent(upstream, "alice") == 0.0  # public data costs nothing


def test_psycopg_private_count_is_noisy_and_charged(proxy: ThreadedProxy, upstream: str) -> None:
    with psycopg.connect(client_dsn(proxy.port)) as conn:  # not autocommit: psycopg sends BEGIN
        cur = conn.execute("SELECT COUNT(*) FROM visits WHERE faculty = %s", ("math",))
        (value,) = cur.fetchone() or (None,)
        assert cur.description[0].type_code == 701  # float8: a noisy count is not an integer
        assert isinstance(value, float) and value.is_integer() and value >= 0  # a released count (noisy, rounded)
        conn.commit()
    assert spent(upstream, "alice") == 1.0


def test_scalar_subquery_workflow_is_charged_once_in_total(proxy: ThreadedProxy, upstream: str) -> None:
    """An uncorrelated scalar subquery is a workflow step (sqldp.strategies.workflow.Workflow) with its own share of ε:
    the ledger is charged the statement's total ε, once, before anything is read, and the NOTICE says so."""
    notices: list[str] = []
    with psycopg.connect(client_dsn(proxy.port), autocommit=True) as conn:
        conn.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
        sql = "SELECT COUNT(*) FROM visits WHERE minutes > (SELECT AVG(minutes) FROM visits)"
        (value,) = conn.execute(sql).fetchone() or (None,)
        assert isinstance(value, float)
    assert spent(upstream, "alice") == 1.0
    assert any("spent ε = 1," in n for n in notices), notices


def test_session_chatter_is_answered_without_the_runner(proxy: ThreadedProxy, upstream: str) -> None:
    with psycopg.connect(client_dsn(proxy.port), autocommit=True) as conn:
        assert conn.execute("SELECT version()").fetchone()[0].startswith("PostgreSQL")  # type: ignore[index]
        assert conn.execute("SELECT current_user, current_database()").fetchone() == ("alice", "analytics")
        assert conn.execute("SHOW standard_conforming_strings").fetchone() == ("on",)
        assert conn.execute("SHOW transaction isolation level").fetchone() is not None
        assert conn.execute("SELECT 1").fetchone() == (1,)
        conn.execute("SET application_name = 'dashboards'")
        assert conn.execute("SHOW application_name").fetchone() == ("dashboards",)
        assert conn.info.parameter_status("server_version")
    assert spent(upstream, "alice") == 0.0


def test_refusals_keep_the_connection_usable(proxy: ThreadedProxy) -> None:
    cases = [
        ("INSERT INTO nation VALUES (9, 'X')", pg_errors.InsufficientPrivilege, "INSERT"),
        ("DROP TABLE visits", pg_errors.InsufficientPrivilege, "DROP"),
        ("COPY visits TO STDOUT", pg_errors.InsufficientPrivilege, "COPY"),
        ("SET work_mem = '1GB'", pg_errors.InsufficientPrivilege, "work_mem"),
        ("SHOW data_directory", pg_errors.InsufficientPrivilege, "data_directory"),
        ("BEGIN READ WRITE", pg_errors.InsufficientPrivilege, "write"),
        ("SELECT 1; SELECT 2", pg_errors.FeatureNotSupported, "several statements"),
        ("SELEC 1 FROM nation", pg_errors.SyntaxError, "selec"),
        ("SELECT minutes FROM visits", psycopg.Error, ""),
        ("SELECT * FROM sqldp.budget_ledger", psycopg.Error, "budget_ledger"),
    ]
    with psycopg.connect(client_dsn(proxy.port), autocommit=True) as conn:
        for sql, error, word in cases:
            with pytest.raises(error) as info:
                conn.execute(sql)
            assert word.lower() in str(info.value).lower(), sql
            # the message is one line; libpq adds its own LINE/caret lines below it when the error has a position
            assert "\n" not in (info.value.diag.message_primary or "")
            assert str(info.value).startswith(info.value.diag.message_primary or "")
            assert conn.execute("SELECT n_name FROM nation WHERE n_nationkey = 1").fetchone() == ("ALGERIA",)


def test_failed_transaction_block_until_rollback(proxy: ThreadedProxy) -> None:
    with psycopg.connect(client_dsn(proxy.port)) as conn:
        with pytest.raises(pg_errors.InsufficientPrivilege):
            conn.execute("DELETE FROM nation")
        with pytest.raises(pg_errors.InFailedSqlTransaction):
            conn.execute("SELECT n_name FROM nation")
        conn.rollback()
        assert conn.execute("SELECT COUNT(*) FROM nation").fetchone() == (3,)


def test_budget_exhaustion(proxy: ThreadedProxy, upstream: str) -> None:
    answered = 0
    with psycopg.connect(client_dsn(proxy.port), autocommit=True) as conn:
        for _ in range(5):
            try:
                conn.execute("SELECT COUNT(*) FROM visits").fetchone()
                answered += 1
            except pg_errors.ConfigurationLimitExceeded as exc:  # 53400
                assert "budget exhausted" in str(exc) and "alice" in str(exc)
        assert conn.execute("SELECT n_name FROM nation WHERE n_nationkey = 2").fetchone() == ("ARGENTINA",)
    assert answered == 3  # limit 3.5 at ε = 1 per query
    assert spent(upstream, "alice") == 3.0


def test_wrong_password_and_unknown_user_look_the_same(proxy: ThreadedProxy) -> None:
    messages = []
    for user, password in (("alice", "wrong"), ("mallory", PASSWORD)):
        with pytest.raises(psycopg.OperationalError) as info:
            psycopg.connect(client_dsn(proxy.port, user=user, password=password))
        assert "password authentication failed" in str(info.value)
        messages.append(str(info.value).replace(user, "U"))
    assert messages[0] == messages[1]
    with psycopg.connect(client_dsn(proxy.port)) as conn:  # the proxy is still up
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_ssl_is_refused_without_a_certificate(proxy: ThreadedProxy) -> None:
    with pytest.raises(psycopg.OperationalError) as info:
        psycopg.connect(client_dsn(proxy.port, sslmode="require"))
    assert "SSL" in str(info.value)


def test_cancel_request_does_not_disturb_the_proxy(proxy: ThreadedProxy) -> None:
    with psycopg.connect(client_dsn(proxy.port), autocommit=True) as conn:
        conn.cancel_safe(timeout=5)  # a CancelRequest on a second connection, while idle: nothing to cancel
        assert conn.execute("SELECT n_nationkey FROM nation WHERE n_name = 'BRAZIL'").fetchone() == (3,)


# -- psql and SQLAlchemy --------------------------------------------------------------------------


@pytest.mark.skipif(shutil.which("psql") is None, reason="psql (Debian's postgresql-client) is not installed")
def test_psql_simple_mode(proxy: ThreadedProxy, upstream: str) -> None:
    dsn = client_dsn(proxy.port)
    out = subprocess.run(
        ["psql", dsn, "-X", "-A", "-t", "-c", "SELECT n_name FROM nation ORDER BY n_nationkey", "-c", "\\conninfo"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[:3] == ["ALGERIA", "ARGENTINA", "BRAZIL"]
    assert 'as user "alice"' in out.stdout
    script = "UPDATE visits SET minutes = 0;\nSELECT COUNT(*) FROM visits;\n"
    out = subprocess.run(["psql", dsn, "-X", "-A", "-t"], input=script, capture_output=True, text=True, timeout=30)
    assert "ERROR:  UPDATE is not allowed" in out.stderr
    assert float(out.stdout.strip()).is_integer()  # the next statement was answered: a released count
    assert spent(upstream, "alice") == 1.0
    bad = subprocess.run(
        ["psql", client_dsn(proxy.port, password="nope"), "-X", "-c", "SELECT 1"], capture_output=True, text=True
    )
    assert bad.returncode == 2 and "password authentication failed" in bad.stderr


def test_sqlalchemy_text_queries(proxy: ThreadedProxy, upstream: str) -> None:
    sqlalchemy = pytest.importorskip("sqlalchemy")
    url = f"postgresql+psycopg://alice:{PASSWORD.replace(' ', '%20')}@127.0.0.1:{proxy.port}/analytics"
    engine = sqlalchemy.create_engine(url, poolclass=sqlalchemy.pool.NullPool)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                sqlalchemy.text("SELECT n_name FROM nation WHERE n_nationkey < :k ORDER BY n_name"), {"k": 3}
            )
            assert [r.n_name for r in rows] == ["ALGERIA", "ARGENTINA"]
            noisy = conn.execute(sqlalchemy.text("SELECT COUNT(*) AS n FROM visits WHERE faculty = :f"), {"f": "cs"})
            assert isinstance(noisy.scalar_one(), float)
            with pytest.raises(sqlalchemy.exc.ProgrammingError):
                conn.execute(sqlalchemy.text("DELETE FROM visits"))
    finally:
        engine.dispose()
    assert spent(upstream, "alice") == 1.0


# -- malformed protocol messages ------------------------------------------------------------------


def _closed(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except (ConnectionResetError, TimeoutError):
        return True


def test_malformed_messages_get_an_error_and_the_proxy_stays_up(proxy: ThreadedProxy) -> None:
    # unknown message type after login
    sock = raw_login(proxy.port)
    sock.sendall(_msg(b"Y", b"junk"))
    kind, body = recv_message(sock)
    assert (
        kind == b"E"
        and error_fields(body)["C"] == "08P01"
        and "invalid frontend message type" in error_fields(body)["M"]
    )
    assert _closed(sock)
    # oversized length word: refused before anything is read (54000 program_limit_exceeded; the body would be
    # skipped and the connection kept, test_proxy_isolation.test_oversized_messages_are_skipped)
    sock = raw_login(proxy.port)
    sock.sendall(b"Q" + struct.pack("!i", 0x7FFFFFF0))
    kind, body = recv_message(sock)
    assert error_fields(body)["C"] == "54000" and "over the limit" in error_fields(body)["M"]
    # a length shorter than the length word itself
    sock = raw_login(proxy.port)
    sock.sendall(b"Q" + struct.pack("!i", 2))
    assert error_fields(recv_message(sock)[1])["C"] == "08P01"
    # a Bind whose fields are truncated inside a well-framed message
    sock = raw_login(proxy.port)
    sock.sendall(_msg(b"P", b"\0SELECT 1\0\0\0") + _msg(b"B", b"\0\0\0\x01\0"))
    assert recv_message(sock)[0] == b"1"  # ParseComplete
    kind, body = recv_message(sock)
    assert kind == b"E" and "truncated Bind" in error_fields(body)["M"]
    # a truncated message: the client goes away mid-message
    sock = raw_login(proxy.port)
    sock.sendall(b"Q" + struct.pack("!i", 100) + b"SELECT")
    sock.close()
    # garbage instead of a startup packet
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as raw:
        raw.sendall(struct.pack("!i", 999_999) + b"xxxx")
        kind, body = recv_message(raw)
        assert kind == b"E" and "startup packet length" in error_fields(body)["M"]
    # after all that, real clients are served
    with psycopg.connect(client_dsn(proxy.port), autocommit=True) as conn:
        assert conn.execute("SELECT n_name FROM nation WHERE n_nationkey = 3").fetchone() == ("BRAZIL",)


def test_extended_protocol_error_skips_to_sync(proxy: ThreadedProxy) -> None:
    sock = raw_login(proxy.port)
    sock.sendall(
        _msg(b"P", b"\0INSERT INTO nation VALUES (1, 'x')\0\0\0")
        + _msg(b"B", b"\0\0\0\0\0\0\0\0")
        + _msg(b"E", b"\0\0\0\0\0")
        + _msg(b"S", b"")
        + _msg(b"Q", b"SELECT n_nationkey FROM nation WHERE n_name = 'ALGERIA'\0")
    )
    kinds = []
    while len(kinds) < 12:
        kind, body = recv_message(sock)
        kinds.append(kind)
        if kind == b"D":
            assert body.endswith(b"1")
        if kinds.count(b"Z") == 2:
            break
    # Parse and Bind succeed, Execute is refused, then ReadyForQuery; the next query is answered
    assert kinds == [b"1", b"2", b"E", b"Z", b"T", b"D", b"C", b"Z"]
    sock.close()


# -- concurrency and crashes ----------------------------------------------------------------------


def test_concurrent_sessions_never_overspend(upstream: str, tmp_path: Path) -> None:
    import threading

    policy = write_policy(tmp_path / "p.toml", {"carol": {"epsilon_limit": 5.0, "epsilon": 0.5}})
    answered: list[int] = []
    errors: list[str] = []

    def worker() -> None:
        n = 0
        with psycopg.connect(client_dsn(proxy.port, user="carol"), autocommit=True) as conn:
            for _ in range(6):
                try:
                    conn.execute("SELECT COUNT(*) FROM visits").fetchone()
                    n += 1
                except pg_errors.ConfigurationLimitExceeded:
                    pass
                except psycopg.Error as exc:
                    errors.append(str(exc))
        answered.append(n)

    with ThreadedProxy(build(upstream, policy)) as proxy:
        threads = [threading.Thread(target=worker) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
    assert not errors
    assert sum(answered) == 10  # 8 × 6 attempts, exactly 5.0 / 0.5 of them paid for
    assert spent(upstream, "carol") == 5.0
    with psycopg.connect(upstream) as conn:
        assert ledger.audit(conn) == []


def test_kill_9_mid_run_leaves_a_consistent_ledger(upstream: str, tmp_path: Path) -> None:
    import os
    import signal
    import threading
    import time

    policy = write_policy(tmp_path / "p.toml", {"dave": {"epsilon_limit": 1000.0, "epsilon": 0.25}})
    proc, port = start_proxy(upstream, policy)
    try:
        received = [0]
        lock = threading.Lock()
        stop = threading.Event()

        def worker() -> None:
            try:
                with psycopg.connect(client_dsn(port, user="dave"), autocommit=True) as conn:
                    for _ in range(500):
                        if stop.is_set():
                            return
                        conn.execute("SELECT COUNT(*) FROM visits").fetchone()
                        with lock:
                            received[0] += 1
            except psycopg.Error:
                return  # the proxy died under us: expected

        threads = [threading.Thread(target=worker) for _ in range(6)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 30
        while received[0] < 20 and time.monotonic() < deadline:
            time.sleep(0.01)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        stop.set()
        for t in threads:
            t.join(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    assert received[0] >= 20
    with psycopg.connect(upstream) as conn:
        assert ledger.audit(conn) == []  # SUM(charges) = spent
        b = ledger.balance(conn, "dave")
        n_charges = conn.execute("SELECT COUNT(*) FROM sqldp.budget_charges WHERE analyst = 'dave'").fetchone()[0]
    assert b is not None and float(b.epsilon_spent) == 0.25 * n_charges
    assert received[0] <= n_charges  # every answer a client got was paid for first


# -- configuration, ledger CLI, SCRAM -------------------------------------------------------------


def test_policy_sections_are_checked_strictly(tmp_path: Path) -> None:
    v = make_verifier("pw")
    bad = {
        f'[analysts.a]\nverifier = "{v}"\nepsilon_limit = 1\nepsilon_limt = 2\n': (
            "analysts.a: unknown key 'epsilon_limt'"
        ),
        f'[analysts.a]\nverifier = "{v}"\n': "analysts.a: missing key 'epsilon_limit'",
        '[analysts.a]\nverifier = "md5abc"\nepsilon_limit = 1\n': "analysts.a.verifier",
        '[proxy]\nlisten = "nowhere"\n': "proxy.listen",
        "[proxy]\nport = 1\n": "proxy: unknown key 'port'",
        "[proxy]\nstatement_timeout = 0\n": "proxy.statement_timeout",
        f'[analysts.a]\nverifier = "{v}"\nepsilon_limit = 1\nstatement_timeout = "1s"\n': "a.statement_timeout",
    }
    for text, key in bad.items():
        path = tmp_path / "p.toml"
        path.write_text(text)
        with pytest.raises(PolicyError) as info:
            load(Policy.from_file(path))
        assert str(path) in str(info.value) and key in str(info.value), str(info.value)


def test_credentials_file(tmp_path: Path) -> None:
    (tmp_path / "creds.toml").write_text(f'alice = "{make_verifier("pw")}"\n')
    path = tmp_path / "p.toml"
    path.write_text('[proxy]\ncredentials = "creds.toml"\n[analysts.alice]\nepsilon_limit = 2\n')
    cfg = load(Policy.from_file(path))
    assert cfg.analysts["alice"].epsilon_limit == 2.0
    (tmp_path / "creds.toml").write_text(f'alice = "{make_verifier("pw")}"\neve = "{make_verifier("pw")}"\n')
    with pytest.raises(PolicyError, match="eve"):
        load(Policy.from_file(path))


def test_verifiers_are_postgres_compatible(pg_dsn: str) -> None:
    """A verifier made by sqldp logs in to PostgreSQL itself, so the format and the SCRAM maths agree."""
    role = "sqldp_verifier_check"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"DROP ROLE IF EXISTS {role}")
        conn.execute(f"CREATE ROLE {role} LOGIN PASSWORD '{make_verifier('s3cret')}'")
    try:
        params = psycopg.conninfo.conninfo_to_dict(pg_dsn)
        if not params.get("host", "").startswith("/"):
            params.update(user=role, password="s3cret")
            with psycopg.connect(**params) as c:  # type: ignore[arg-type]
                assert c.execute("SELECT current_user").fetchone() == (role,)
        with psycopg.connect(pg_dsn) as conn:
            stored = conn.execute("SELECT rolpassword FROM pg_authid WHERE rolname = %s", (role,)).fetchone()[0]
            assert stored.startswith("SCRAM-SHA-256$4096:")
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(f"DROP ROLE IF EXISTS {role}")


def test_budget_command_shows_and_resets(
    proxy: ThreadedProxy, upstream: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with psycopg.connect(client_dsn(proxy.port), autocommit=True) as conn:
        conn.execute("SELECT COUNT(*) FROM visits").fetchone()
    assert main(["budget", "show", "--dsn", upstream, "--format", "json"]) == 0
    out = capsys.readouterr().out
    assert '"analyst": "alice"' in out and '"epsilon_spent": 1.0' in out
    assert main(["budget", "reset", "alice", "--dsn", upstream]) == 0
    assert spent(upstream, "alice") == 0.0
    with psycopg.connect(upstream) as conn:
        assert ledger.audit(conn) == []  # the reset is logged as a negative charge
    assert main(["budget", "reset", "--dsn", upstream]) == 2
    assert "name one analyst" in capsys.readouterr().err


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is needed to make a test certificate")
def test_tls_is_offered_with_a_certificate(upstream: str, tmp_path: Path) -> None:
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=localhost",
            "-days",
            "1",
            "-keyout",
            str(tmp_path / "server.key"),
            "-out",
            str(tmp_path / "server.crt"),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    extra = '[proxy]\ntls_cert = "server.crt"\ntls_key = "server.key"\n'
    policy = write_policy(tmp_path / "p.toml", {"alice": {"epsilon_limit": 1.0}}, extra=extra)
    with ThreadedProxy(build(upstream, policy)) as p, psycopg.connect(client_dsn(p.port, sslmode="require")) as conn:
        assert conn.pgconn.ssl_in_use
        assert conn.execute("SELECT n_name FROM nation WHERE n_nationkey = 1").fetchone() == ("ALGERIA",)


def test_driver_catalog_probes_get_no_rows(proxy: ThreadedProxy) -> None:
    with psycopg.connect(client_dsn(proxy.port), autocommit=True) as conn:
        cur = conn.execute("SELECT typname, oid FROM pg_catalog.pg_type WHERE typname = %s", ("hstore",))
        assert cur.fetchall() == [] and [d.name for d in cur.description or []] == ["typname", "oid"]
        with pytest.raises(psycopg.Error):  # a user table joined in is not a catalog probe: the runner decides
            conn.execute("SELECT n_name FROM nation, pg_catalog.pg_type")
