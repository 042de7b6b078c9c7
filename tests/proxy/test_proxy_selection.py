"""Public rows picked by private data (sqldp.strategies.selection) through the proxy: PostgreSQL parses the statement
the choice runs before the ledger is charged, the charge is the statement's ε once, and the rows come back as a
result set with the NOTICE; a refusal of the shape costs nothing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from proxy_support import client_dsn, make_tables, write_policy

from sqldp.proxy import ThreadedProxy, build, ledger

STAYS = """
[tables.stays]
rows = "private"
[tables.stays.columns.minutes]
range = [0, 60]
"""
ARGMAX = (
    "WITH t (k, total) AS (SELECT n_nationkey, SUM(minutes) FROM stays GROUP BY n_nationkey) "
    "SELECT n_name, total FROM nation, t WHERE nation.n_nationkey = k AND total = (SELECT MAX(total) FROM t)"
)
WITNESSES = (
    "SELECT n_name FROM nation WHERE n_nationkey IN (SELECT n2.n_nationkey FROM nation n2 WHERE n2.n_nationkey > "
    "(SELECT 0.01 * SUM(minutes) FROM stays WHERE stays.n_nationkey = n2.n_nationkey)) ORDER BY n_name"
)


@pytest.fixture
def proxy(pg_dsn: str, tmp_path: Path) -> Iterator[tuple[ThreadedProxy, str]]:
    make_tables(pg_dsn)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE stays (id integer PRIMARY KEY, n_nationkey integer NOT NULL, minutes integer NOT NULL)"
        )
        conn.execute("INSERT INTO stays SELECT g, 1 + g % 3, g % 60 FROM generate_series(1, 90) g")
    policy = write_policy(tmp_path / "policy.toml", {"alice": {"epsilon_limit": 10.0}}, extra=STAYS)
    with ThreadedProxy(build(pg_dsn, policy)) as p:
        yield p, pg_dsn


def _spent(dsn: str) -> float:
    with psycopg.connect(dsn) as conn:
        b = ledger.balance(conn, "alice")
        assert b is not None
        return float(b.epsilon_spent)


def test_argmax_and_witness_selection_through_the_proxy(proxy: tuple[ThreadedProxy, str]) -> None:
    p, upstream = proxy
    notices: list[str] = []
    with psycopg.connect(client_dsn(p.port), autocommit=True) as conn:
        conn.add_notice_handler(lambda d: notices.append(d.message_detail or ""))
        cur = conn.execute(ARGMAX)
        assert [d.name for d in cur.description or []] == ["n_name", "total"]
        ((name, total),) = cur.fetchall()
        assert name in {"ALGERIA", "ARGENTINA", "BRAZIL"} and total is not None
        assert _spent(upstream) == pytest.approx(1.0)
        assert any("total ±" in n for n in notices), notices  # the total's bar is data-independent
        names = [r[0] for r in conn.execute(WITNESSES).fetchall()]
        assert set(names) <= {"ALGERIA", "ARGENTINA", "BRAZIL"}
        assert _spent(upstream) == pytest.approx(2.0)
        # a shape the argmax does not analyse is refused before the charge
        with pytest.raises(psycopg.Error, match="HAVING in the WITH query is not analysed"):
            conn.execute(ARGMAX.replace("GROUP BY n_nationkey", "GROUP BY n_nationkey HAVING COUNT(*) > 1"))
        assert _spent(upstream) == pytest.approx(2.0)
