"""Several proxies on one upstream: they share one shadow catalog database, none drops it
while another uses it, and every client's catalog discovery keeps working whichever is started or stopped
first — psql's ``\\dt`` and ``\\d``, SQLAlchemy's ``inspect()``. A proxy with another catalog has a shadow of
its own. (Before, each start dropped the shadow WITH (FORCE), killing the others' connections, and each stop
dropped it for good: \\dt through the others failed with XX000 until they restarted.)"""

from __future__ import annotations

import shutil
import signal
import subprocess
from pathlib import Path

import psycopg
import pytest
from proxy_support import client_dsn, start_proxy
from psycopg import sql

from sqldp.proxy import ThreadedProxy, build

pytestmark = pytest.mark.skipif(shutil.which("psql") is None, reason="psql (postgresql-client) is not installed")


def listed(port: int) -> list[str]:
    """The tables psql's \\dt lists through the proxy on ``port``, after \\d visits described one."""
    out = subprocess.run(
        ["psql", client_dsn(port), "-X", "-At", "-c", "\\dt", "-c", "\\d visits"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "minutes|integer||not null|" in out.stdout, out.stdout
    return [line.split("|")[1] for line in out.stdout.splitlines() if line.startswith("public|")]


def shadows(upstream: str) -> list[str]:
    """The shadow databases of the upstream (their comment names it)."""
    with psycopg.connect(upstream, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT datname FROM pg_database WHERE shobj_description(oid, 'pg_database') LIKE %s ORDER BY 1",
            (f"sqldp catalog of database {conn.info.dbname}: %",),
        ).fetchall()
    return [r[0] for r in rows]


def test_three_proxies_started_and_stopped_in_any_order(upstream: str, policy: Path) -> None:
    # a `sqldp proxy` process with two workers, and two in this process
    proc, port = start_proxy(upstream, policy, workers=2)
    b = ThreadedProxy(build(upstream, policy)).start()
    c = ThreadedProxy(build(upstream, policy)).start()
    d: ThreadedProxy | None = None
    try:
        (shared,) = shadows(upstream)  # one for all three
        for p in (port, b.port, c.port):
            assert listed(p) == ["nation", "visits"]
        # a client connected throughout, and one to the proxy process, which SIGTERM stops (a proxy
        # with worker processes; tests/clients/test_clients_shutdown.py has the single process)
        with psycopg.connect(client_dsn(b.port), autocommit=True) as kept, psycopg.connect(client_dsn(port)) as cut:
            cut.execute("SELECT COUNT(*) FROM visits").fetchone()  # in a transaction block
            proc.send_signal(signal.SIGTERM)  # the first started stops first
            assert proc.wait(timeout=30) == 0
            assert proc.stderr is not None
            log = proc.stderr.read()
            assert "Traceback" not in log and "CancelledError" not in log, log
            with pytest.raises(psycopg.OperationalError, match="administrator command"):
                cut.execute("SELECT 1")
            assert shadows(upstream) == [shared]
            assert listed(b.port) == listed(c.port) == ["nation", "visits"]
            b.stop()  # then the middle one
            with pytest.raises(psycopg.OperationalError):
                kept.execute("SELECT 1")
        assert shadows(upstream) == [shared] and listed(c.port) == ["nation", "visits"]
        d = ThreadedProxy(build(upstream, policy)).start()  # a new one attaches to the same
        assert shadows(upstream) == [shared] and listed(d.port) == ["nation", "visits"]
        c.stop()
        assert listed(d.port) == ["nation", "visits"]
        with psycopg.connect(client_dsn(d.port), autocommit=True) as conn:  # SQLAlchemy-style reflection query
            keys = conn.execute(
                "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid "
                "AND a.attnum = ANY(i.indkey) WHERE i.indrelid = 'visits'::regclass AND i.indisprimary"
            ).fetchall()
            assert keys == [("id",)]
        d.stop()
        d = None
        assert shadows(upstream) == []  # the last one to stop drops it
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for p in (b, c, d):
            if p is not None and p._thread.is_alive():
                p.stop()


def test_another_catalog_has_a_shadow_of_its_own(upstream: str, policy: Path, tmp_path: Path) -> None:
    schema = tmp_path / "nation.sql"  # a catalog from a DDL file: nation only
    schema.write_text("CREATE TABLE nation (n_nationkey integer PRIMARY KEY, n_name text NOT NULL);\n")
    narrow = tmp_path / "narrow.toml"
    analysts = "[analysts." + policy.read_text().split("[analysts.", 1)[1].split("[tables.")[0]
    narrow.write_text('[defaults]\nepsilon = 1.0\n[tables.nation]\nrows = "public"\n' + analysts)
    with ThreadedProxy(build(upstream, policy)) as wide, ThreadedProxy(build(upstream, narrow, schema=schema)) as one:
        assert len(shadows(upstream)) == 2
        out = subprocess.run(["psql", client_dsn(one.port), "-X", "-At", "-c", "\\dt"], capture_output=True, text=True)
        assert [line.split("|")[1] for line in out.stdout.splitlines()] == ["nation"], out.stdout + out.stderr
        assert listed(wide.port) == ["nation", "visits"]
    assert shadows(upstream) == []


def test_a_shadow_left_behind_is_rebuilt_or_dropped(upstream: str, policy: Path, pg_server_dsn: str) -> None:
    """A proxy killed while building its shadow leaves it without its comment: the next one builds it anew. A
    shadow of the earlier naming (``sqldp_catalog_<database>``) nobody uses is dropped. A shadow dropped under
    a running proxy is built again at its next catalog query."""
    with ThreadedProxy(build(upstream, policy)) as first:
        name = first.built.server.shadow.name if first.built.server.shadow else ""
    dbname = psycopg.conninfo.conninfo_to_dict(upstream)["dbname"]
    assert isinstance(dbname, str)
    with psycopg.connect(pg_server_dsn, autocommit=True) as owner:
        owner.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))  # half built: empty, no comment
        owner.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(f"sqldp_catalog_{dbname}"[:63])))
        with ThreadedProxy(build(upstream, policy)) as again:
            assert shadows(upstream) == [name] and listed(again.port) == ["nation", "visits"]
            left = owner.execute("SELECT count(*) FROM pg_database WHERE datname = %s", (f"sqldp_catalog_{dbname}",))
            assert left.fetchone() == (0,)
            owner.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))  # under it
            assert listed(again.port) == ["nation", "visits"]  # built again
            assert shadows(upstream) == [name]
    assert shadows(upstream) == []


def test_information_schema_names_the_database_the_client_sees(proxy: ThreadedProxy) -> None:
    """``table_catalog`` and every other catalog column of information_schema is ``current_database()`` as the
    client sees it (the database it connected to), not the shadow's name."""
    # ibis' list_tables(): its catalog from SELECT current_database(), then this (sqlglot-written) query
    ibis = (
        "SELECT DISTINCT table_name FROM information_schema.tables WHERE TRUE AND table_schema = 'public' "
        "AND table_catalog = 'analytics'"
    )
    with psycopg.connect(client_dsn(proxy.port), autocommit=True) as conn:
        assert conn.execute("SELECT current_database()").fetchone() == ("analytics",)
        assert sorted(r[0] for r in conn.execute(ibis)) == ["nation", "visits"]
        got = conn.execute(
            "SELECT DISTINCT table_catalog FROM information_schema.tables WHERE table_catalog = current_database()"
        ).fetchall()
        assert got == [("analytics",)]
        # several views, aliases, a join and a parameter (the extended protocol: Describe, then Bind)
        rows = conn.execute(
            "SELECT c.table_catalog, c.udt_catalog, k.constraint_catalog, c.column_name "
            "FROM information_schema.columns c JOIN information_schema.key_column_usage AS k "
            "ON k.table_name = c.table_name AND k.column_name = c.column_name WHERE c.table_name = %s",
            ("visits",),
        ).fetchall()
        assert rows == [("analytics", "analytics", "analytics", "id")]
        assert conn.execute("SELECT catalog_name FROM information_schema.schemata WHERE schema_name = 'public'")
        everything = conn.execute("SELECT * FROM information_schema.tables WHERE table_schema = 'public'")
        columns = [d.name for d in everything.description or []]
        assert columns[:3] == ["table_catalog", "table_schema", "table_name"]  # the view's columns, in order
        assert {r[0] for r in everything} == {"analytics"}
    out = subprocess.run(
        [
            "psql",
            client_dsn(proxy.port),
            "-X",
            "-At",
            "-c",
            "SELECT table_catalog, table_name FROM information_schema.tables WHERE table_schema = 'public' ORDER BY 2",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.stdout.split() == ["analytics|nation", "analytics|visits"], out.stdout + out.stderr
