"""What shells and drivers send on connecting: ``SHOW time zone`` in its standard spelling,
``SET TIME ZONE``/``SET TimeZone``/``SET NAMES``/``DateStyle``/``client_encoding`` with quoted or unquoted
values naming what is in effect are accepted; another value is refused in one line that names the setting and
its value through the proxy. pgcli, which sets the machine's zone on connecting, connects and queries."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import psycopg
import pytest
from proxy_support import PASSWORD, client_dsn

from sqldp.proxy import ThreadedProxy

# every spelling of the zone UTC (links to one zone in the time zone database), as settings equal to each other
UTC = {"UTC", "Etc/UTC", "GMT", "Etc/GMT", "UCT", "Universal", "Zulu"}


def test_show_time_zone_in_every_spelling(proxy: ThreadedProxy) -> None:
    with psycopg.connect(client_dsn(proxy.port), autocommit=True) as conn:
        zone = conn.info.parameter_status("TimeZone")
        assert zone
        for spelling in ("SHOW time zone", "SHOW TIME ZONE", "SHOW TimeZone", "show timezone"):
            cur = conn.execute(spelling)
            assert cur.fetchall() == [(zone,)], spelling
            assert [d.name for d in cur.description or []] == ["TimeZone"]


def test_settings_naming_what_is_in_effect_are_accepted(proxy: ThreadedProxy) -> None:
    with psycopg.connect(client_dsn(proxy.port), autocommit=True) as conn:
        zone = conn.info.parameter_status("TimeZone") or ""
        quoted = zone.replace("'", "''")
        accepted = [
            f"SET TIME ZONE '{quoted}'",
            f"SET TimeZone = '{quoted}'",
            f'SET time zone "{zone}"',  # pgcli's spelling (an identifier)
            f"SET SESSION TimeZone TO '{quoted.lower()}'",  # the zone's name is case-insensitive
            "SET TIME ZONE LOCAL",
            "SET TIME ZONE DEFAULT",
            "RESET TIME ZONE",
            "RESET TimeZone",
            "SET DateStyle = 'ISO'",
            "SET DateStyle TO 'ISO, MDY'",
            "SET datestyle TO ISO, MDY",
            "SET client_encoding = 'UTF8'",
            "SET client_encoding TO 'utf-8'",
            "SET client_encoding = UNICODE",
            "SET NAMES 'utf8'",
            "SET NAMES UTF8",
            "RESET client_encoding",
        ]
        if zone in UTC:  # the standard's and the other names of this zone
            accepted += ["SET TIME ZONE 'UTC'", "SET TIMEZONE = UTC", "SET TimeZone = 'Etc/UTC'", "SET TIME ZONE 'GMT'"]
        for sql in accepted:
            conn.execute(sql)
            assert conn.execute("SHOW time zone").fetchone() == (zone,), sql
        assert conn.info.parameter_status("TimeZone") == zone
        assert conn.info.parameter_status("DateStyle") == "ISO, MDY"
        assert conn.execute("SELECT n_name FROM nation WHERE n_nationkey = 1").fetchone() == ("ALGERIA",)


REFUSED = [
    ("SET TIME ZONE 'America/Los_Angeles'", "SET TimeZone TO America/Los_Angeles is not available through sqldp"),
    ("SET TIME ZONE INTERVAL '-08:00' HOUR TO MINUTE", "SET TimeZone: could not read the value"),
    ("SET datestyle = 'ISO, DMY'", "SET DateStyle TO ISO, DMY is not available through sqldp"),
    ("SET DateStyle = 'German'", "SET DateStyle TO German is not available"),
    ("SET client_encoding = 'LATIN1'", "SET client_encoding TO LATIN1 is not available"),
    ("SET NAMES 'SQL_ASCII'", "SET client_encoding TO SQL_ASCII is not available"),
]


def test_other_values_are_refused_in_one_line(proxy: ThreadedProxy) -> None:
    with psycopg.connect(client_dsn(proxy.port), autocommit=True) as conn:
        zone = conn.info.parameter_status("TimeZone")
        for sql, text in REFUSED:
            if zone == "America/Los_Angeles" and "Los_Angeles" in sql:
                continue  # the server's own zone
            with pytest.raises(psycopg.errors.InsufficientPrivilege) as got:
                conn.execute(sql)
            message = got.value.diag.message_primary or ""
            assert message.startswith(text) and "\n" not in message, message
            # nothing changed: the session goes on with the server's settings
            assert conn.execute("SHOW TimeZone").fetchone() == (zone,)
            assert conn.execute("SHOW DateStyle").fetchone() == ("ISO, MDY",)


@pytest.mark.skipif(shutil.which("pgcli") is None, reason="pgcli (a test dependency) is not installed")
def test_pgcli_connects_lists_and_queries(proxy: ThreadedProxy, tmp_path: Path) -> None:
    """pgcli reads ``SHOW time zone`` on connecting and, when the machine's zone is spelt otherwise, sets it
    (``set time zone "UTC"``): run with a zone equal to the server's but spelt differently where there is one."""
    with psycopg.connect(client_dsn(proxy.port), autocommit=True) as conn:
        zone = conn.info.parameter_status("TimeZone") or ""
    local = next((z for z in sorted(UTC) if z != zone), zone) if zone in UTC else zone
    env = {
        **os.environ,
        "TZ": local,
        "PGPASSWORD": PASSWORD,
        "XDG_CONFIG_HOME": str(tmp_path),  # its config and history there, not in the user's home
        "HOME": str(tmp_path),
    }
    argv = ["pgcli", "-h", "127.0.0.1", "-p", str(proxy.port), "-U", "alice", "-d", "analytics", "--less-chatty"]
    argv += ["-c", "SELECT n_name, n_nationkey FROM nation ORDER BY n_nationkey", "-c", "\\dt"]
    argv += ["-c", "SELECT COUNT(*) FROM visits"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env, stdin=subprocess.DEVNULL)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stdout + out.stderr
    lines = [[c.strip() for c in line.strip("|").split("|")] for line in out.stdout.splitlines() if "|" in line]
    assert ["ALGERIA", "1"] in lines and ["BRAZIL", "3"] in lines, out.stdout
    listed = {row[1] for row in lines if len(row) == 4 and row[0] == "public"}  # \\dt: schema, name, type, owner
    assert listed == {"nation", "visits"}, out.stdout
    assert "this statement spent ε = 1" in out.stdout + out.stderr  # the private answer's NOTICE
    counts = [row[0] for row in lines if len(row) == 1 and row[0].replace(".", "", 1).replace("-", "", 1).isdigit()]
    assert len(counts) == 1 and float(counts[0]).is_integer(), out.stdout
