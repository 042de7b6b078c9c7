"""The proxy's analysts share upstream connections but nothing else: session state left on a pooled connection
never reaches the next analyst (sqldp.proxy.upstream)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from proxy_support import client_dsn, make_tables, write_policy

from sqldp.proxy import ThreadedProxy, build, upstream


@pytest.fixture
def one_connection_proxy(pg_dsn: str, tmp_path: Path) -> Iterator[ThreadedProxy]:
    """A proxy whose runner has exactly one upstream connection, so every analyst uses the same one."""
    make_tables(pg_dsn)
    policy = write_policy(
        tmp_path / "policy.toml",
        {"alice": {"epsilon_limit": 100.0}, "bob": {"epsilon_limit": 100.0}},
        extra="[proxy]\npool_size = 1\n",
    )
    with ThreadedProxy(build(pg_dsn, policy)) as p:
        yield p


def test_state_left_on_the_upstream_connection_does_not_reach_the_next_analyst(
    one_connection_proxy: ThreadedProxy, pg_dsn: str
) -> None:
    pool = one_connection_proxy.built.pools[-1]  # the reading pool (the ledger's is the owner's)
    with pool.connection() as conn:  # what alice's statement could have done to the shared connection
        backend = conn.info.backend_pid
        # as the analyst role, which may SET but may not call set_config or take advisory locks (sqldp.db)
        conn.execute("SET statement_timeout = '42s'")  # not 1 ms: the next statements would time out under load
        conn.execute("SET search_path = nowhere")
        conn.execute("SET sqldp.note = 'from alice'")
    with psycopg.connect(client_dsn(one_connection_proxy.port, user="bob"), autocommit=True) as bob:
        # both read through the one upstream connection: the public lookup and the noisy count
        assert bob.execute("SELECT n_name FROM nation WHERE n_nationkey = 1").fetchone() == ("ALGERIA",)
        (count,) = bob.execute("SELECT COUNT(*) FROM visits").fetchone() or (None,)
        assert isinstance(count, float)
    with pool.connection() as conn:
        assert conn.info.backend_pid == backend  # the same connection, reset rather than replaced
        row = conn.execute(
            "SELECT current_setting('statement_timeout'), current_setting('search_path'), "
            "current_setting('sqldp.note', true), current_setting('default_transaction_read_only')"
        ).fetchone()
        assert row == ("0", "public, pg_catalog, pg_temp", "", "on")  # the analyst role's own set-up is back
    with psycopg.connect(pg_dsn, autocommit=True) as admin:
        assert admin.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'").fetchone() == (0,)
    assert one_connection_proxy.built.isolation is not None and one_connection_proxy.built.isolation.resets >= 3


def test_a_connection_whose_state_does_not_reset_is_closed(pg_dsn: str) -> None:
    calls = []

    def setup(conn: psycopg.Connection) -> None:  # a set-up that differs the second time round
        calls.append(1)
        conn.execute(f"SET work_mem = '{4 + len(calls)}MB'")

    iso = upstream.Isolation(setup)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        iso.configure(conn)
        with pytest.raises(upstream.LeftoverState):
            iso.reset(conn)
    with psycopg.connect(pg_dsn, autocommit=True) as stranger, pytest.raises(upstream.LeftoverState):
        iso.reset(stranger)  # not set up by this pool: no baseline to compare with


def test_the_reset_is_one_message_and_still_checks_the_role(pg_dsn: str) -> None:
    """With its set-up given as SQL the reset sends the reset, the set-up and the role check in one message
    (upstream.Isolation): what a use left is gone afterwards, and a role that differs from the set-up's is
    still caught, by the full comparison and by the per-reset role check alike."""
    from sqldp.engine.postgres.engine import SETUP, configure

    iso = upstream.Isolation(configure, check_every=1000, setup_sql=SETUP)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        iso.configure(conn)
        settings = (
            "SELECT current_setting('statement_timeout'), current_setting('search_path'), current_user::text, "
            "current_setting('default_transaction_read_only')"
        )
        fresh = conn.execute(settings).fetchone()
        assert fresh is not None and fresh[0] == "0" and fresh[3] == "on" and fresh[2] != "pg_read_all_data"
        for _ in range(3):  # the first is compared in full, the others check the role only
            conn.execute("SET statement_timeout = '42s'")  # not 1 ms: the next statements would time out under load
            conn.execute("SET search_path = nowhere")
            conn.execute("SET ROLE pg_read_all_data")
            iso.reset(conn)
            assert conn.execute(settings).fetchone() == fresh
        assert (iso.resets, iso.checks) == (3, 1)
    # a set-up whose SQL leaves another role than the one the connection was set up with
    odd = upstream.Isolation(configure, check_every=1000, setup_sql=(*SETUP, "SET ROLE pg_read_all_data"))
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        odd.configure(conn)
        with pytest.raises(upstream.LeftoverState, match="session state"):
            odd.reset(conn)  # first reset of the connection: the whole state is compared
        with pytest.raises(upstream.LeftoverState, match="role"):
            odd.reset(conn)  # later ones: the role check that came back with the reset's message
        assert odd.checks == 1


def test_a_statements_connections_go_back_and_are_reset_when_its_answer_is_handed_over(pg_dsn: str) -> None:
    """The proxy hands an answer over before the connections it used are reset (engine.postgres.returning_after,
    server._hand_over): inside the block a statement's next use takes the connection it used before (with one
    connection in the pool it would otherwise wait for itself), nothing is reset yet, and when the block ends
    every connection is reset and offered again; one whose use failed is not taken again."""
    from sqldp.engine.postgres.engine import SETUP, PostgresEngine, configure, returning_after

    iso = upstream.Isolation(configure, setup_sql=SETUP)
    pool = upstream.ResettingPool(pg_dsn, isolation=iso, min_size=2, max_size=2, kwargs={"autocommit": True}, open=True)
    pool.wait(timeout=15)
    engine = PostgresEngine(pg_dsn, pool=pool)
    try:
        with returning_after():
            with engine.connection() as conn:
                first = conn.info.backend_pid
                conn.execute("SET search_path = nowhere")
            with engine.connection() as conn:  # the same statement's next use: that connection, not yet reset
                assert conn.info.backend_pid == first
                assert conn.execute("SELECT current_setting('search_path')").fetchone() == ("nowhere",)
                with pytest.raises(psycopg.errors.UndefinedTable):
                    conn.execute("SELECT * FROM no_such_table")
                raise_in_use = conn
            assert iso.resets == 0
            with pytest.raises(ZeroDivisionError), engine.connection() as conn:
                assert conn is raise_in_use
                raise ZeroDivisionError  # a use that fails: its connection is not taken again
            with engine.connection() as conn:
                assert conn.info.backend_pid != first
            assert iso.resets == 0
        assert iso.resets == 2 and pool.get_stats()["pool_available"] == 2
        for _ in range(2):
            with engine.connection() as conn:  # each reset: the set-up's search_path again
                assert conn.execute("SELECT current_setting('search_path')").fetchone() != ("nowhere",)
    finally:
        pool.close()
