"""Key expressions through the proxy (docs/sql.md, "Expressions of group keys"): an output computed from the
group keys keeps the type PostgreSQL's Describe gives it (text, integer) — it is a key, not a noisy value —
and a HAVING conjunct over the keys drops groups before anything leaves; noisy values arrive as float8."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from proxy_support import client_dsn, make_tables, write_policy

from sqldp.proxy import ThreadedProxy, build


@pytest.fixture
def proxy(pg_dsn: str, tmp_path: Path) -> Iterator[ThreadedProxy]:
    make_tables(pg_dsn)
    extra = '[tables.visits.columns.faculty]\ndomain = ["cs", "math", "law"]\n'
    policy = write_policy(tmp_path / "policy.toml", {"alice": {"epsilon_limit": 100.0}}, extra=extra)
    with ThreadedProxy(build(pg_dsn, policy)) as p:
        yield p


def test_key_outputs_keep_their_type_and_having_over_keys_filters(proxy: ThreadedProxy) -> None:
    sql = (
        "SELECT UPPER(faculty) AS f, LENGTH(faculty) AS l, COUNT(*) AS n FROM visits GROUP BY faculty "
        "HAVING faculty <> 'cs' ORDER BY 1"
    )
    with psycopg.connect(client_dsn(proxy.port)) as conn:
        for binary in (False, True):
            rows = conn.execute(sql, binary=binary).fetchall()
            assert [(f, n) for f, n, _ in rows] == [("LAW", 3), ("MATH", 4)]
            assert all(isinstance(v, float) for *_, v in rows)
