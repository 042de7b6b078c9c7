"""SCRAM through ``scramp`` (issue 23): SCRAM-SHA-256-PLUS with channel binding over the proxy's TLS, plain
SCRAM-SHA-256 with and without TLS, real SASLprep when a verifier is made, and the verifier format kept
(PostgreSQL logs in with it). Clients: psycopg (libpq) and pg8000 (scramp's own client)."""

from __future__ import annotations

import shutil
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from proxy_support import PASSWORD, client_dsn, make_tables, write_policy

from sqldp.errors import InputError, PolicyError
from sqldp.policy import Policy
from sqldp.proxy import ThreadedProxy, build
from sqldp.proxy.config import load
from sqldp.proxy.scram import make_verifier, parse_verifier

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl makes the test certificate")


def _certificate(where: Path) -> None:
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost", "-days", "1",
         "-keyout", str(where / "server.key"), "-out", str(where / "server.crt")],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip


@pytest.fixture
def tls_proxy(pg_dsn: str, tmp_path: Path) -> Iterator[ThreadedProxy]:
    make_tables(pg_dsn)
    _certificate(tmp_path)
    extra = '[proxy]\ntls_cert = "server.crt"\ntls_key = "server.key"\n'
    # "I\u00adX": SASLprep maps the soft hyphen to nothing (RFC 3454 B.1), NFKC keeps it
    analysts = {
        "alice": {"epsilon_limit": 5.0},
        "carol": {"epsilon_limit": 5.0, "verifier": str(make_verifier("IX"))},
    }
    policy = write_policy(tmp_path / "policy.toml", analysts, extra=extra)
    with ThreadedProxy(build(pg_dsn, policy)) as p:
        yield p


def _login(port: int, **options: str) -> str:
    with psycopg.connect(client_dsn(port, **options)) as conn:
        assert conn.execute("SELECT n_name FROM nation WHERE n_nationkey = 2").fetchone() == ("ARGENTINA",)
        return "TLS" if conn.pgconn.ssl_in_use else "plain"


def test_channel_binding_over_tls_and_plain_scram_with_and_without_it(tls_proxy: ThreadedProxy) -> None:
    port = tls_proxy.port
    # libpq insists on SCRAM-SHA-256-PLUS with tls-server-end-point over TLS: it checks the proxy's binding
    assert _login(port, sslmode="require", channel_binding="require") == "TLS"
    assert _login(port, sslmode="require", channel_binding="disable") == "TLS"  # plain SCRAM over TLS
    assert _login(port, sslmode="disable") == "plain"
    with pytest.raises(psycopg.OperationalError, match="channel binding"):  # no TLS, no binding: libpq refuses
        _login(port, sslmode="disable", channel_binding="require")
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        _login(port, sslmode="require", channel_binding="require", password="wrong")
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        _login(port, user="mallory", sslmode="require", channel_binding="require")


def test_pg8000_uses_scram_sha_256_plus(tls_proxy: ThreadedProxy) -> None:
    pg8000 = pytest.importorskip("pg8000.native")
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    conn = pg8000.Connection(
        "alice", password=PASSWORD, host="127.0.0.1", port=tls_proxy.port, database="analytics", ssl_context=context
    )
    try:
        assert conn.run("SELECT n_name FROM nation WHERE n_nationkey = 3") == [["BRAZIL"]]
        assert conn.auth.mechanism_name == "SCRAM-SHA-256-PLUS"  # pg8000 picks the strongest offered
    finally:
        conn.close()


def test_saslprep_is_rfc_4013_not_nfkc(tls_proxy: ThreadedProxy) -> None:
    """carol's verifier was made for "IX"; libpq prepares "I\u00adX" to "IX" (the soft hyphen is mapped to
    nothing), as the verifier's maker must: NFKC alone kept it, and carol could not log in."""
    salt = b"0123456789abcdef"
    assert str(make_verifier("I\u00adX", salt=salt)) == str(make_verifier("IX", salt=salt))
    assert _login(tls_proxy.port, user="carol", password="I\u00adX", sslmode="disable") == "plain"
    assert _login(tls_proxy.port, user="carol", password="IX", sslmode="require", channel_binding="require") == "TLS"
    with pytest.raises(InputError, match="SASLprep"):  # a control character: prohibited output (RFC 4013 §2.3)
        make_verifier("bell\x07")


def test_verifiers_under_4096_iterations_are_refused_at_load(tmp_path: Path) -> None:
    """RFC 7677's minimum, which scramp and pg8000 enforce: refused with the key named when the policy is
    loaded, not at every login. The format is PostgreSQL's: a verifier made elsewhere parses as it was."""
    weak = "SCRAM-SHA-256$256:MDEyMzQ1Njc4OWFiY2RlZg==$" + "A" * 43 + "=:" + "B" * 43 + "="
    path = tmp_path / "p.toml"
    path.write_text(f'[analysts.a]\nverifier = "{weak}"\nepsilon_limit = 1\n', encoding="utf-8")
    with pytest.raises(PolicyError, match=r"analysts\.a\.verifier.*under 4096"):
        load(Policy.from_file(path))
    v = make_verifier("pw", salt=b"0123456789abcdef")
    assert parse_verifier(str(v), "here") == v and str(v).startswith("SCRAM-SHA-256$4096:MDEyMzQ1Njc4OWFiY2RlZg==$")
    with pytest.raises(InputError, match="4096"):
        make_verifier("pw", iterations=1000)
