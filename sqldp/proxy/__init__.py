"""A PostgreSQL wire-protocol proxy: analysts connect with psql, psycopg or a BI tool and get noisy answers.

``protocol`` frames and parses messages, ``scram`` authenticates analysts, ``statements`` classifies what they
send, ``harmless`` answers connection-time chatter, ``values`` encodes results and binds parameters,
``ledger`` keeps the budget, ``catalog`` answers catalog discovery (``\\dt``, reflection) from a shadow
database of sqldp's catalog, ``upstream`` resets the pooled upstream connections between uses, ``config``
reads the policy's ``[proxy]`` and ``[analysts]`` sections and ``server`` ties them together. :func:`build`
assembles a server; :class:`ThreadedProxy` runs one in a thread; ``workers`` runs several server processes on
one port.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqldp.errors import DatabaseError
from sqldp.policy import Policy
from sqldp.proxy import catalog, harmless, ledger, upstream
from sqldp.proxy import config as config_mod
from sqldp.proxy.server import ProxyServer


@dataclass(frozen=True)
class Shared:
    """What a proxy sets up once in the database, however many server processes then serve (sqldp.proxy.workers):
    the analyst role's DSN (provisioned once: concurrent CREATE ROLE and GRANT collide) and the shadow
    database's name (None: there is none, the owner may not create a database). The ledger's tables and limits
    are written by that same set-up, before any process serves."""

    analyst_dsn: str
    shadow: str | None


@dataclass
class Built:
    server: ProxyServer
    config: config_mod.ProxyConfig
    pools: list[Any]  # the ledger's (pools[0]) and the reading pool (pools[-1])
    isolation: upstream.Isolation | None = None

    def close(self) -> None:
        self.server.close()
        for p in self.pools:
            p.close()


def _pool(dsn: str, size: int, *, isolation: upstream.Isolation | None = None, keep: int = 1) -> Any:
    from psycopg_pool import ConnectionPool

    # psycopg_pool keeps connections open between queries: opening one costs milliseconds (authentication,
    # backend start-up), which alone would exceed the proxy's overhead budget.
    settings: dict[str, Any] = {
        "min_size": min(keep, size),
        "max_size": size,
        "kwargs": {"autocommit": True, "connect_timeout": 10},
        "open": False,
    }
    pool = (
        ConnectionPool(dsn, **settings)
        if isolation is None
        else upstream.ResettingPool(dsn, isolation=isolation, **settings)
    )
    try:
        pool.open(wait=True, timeout=15)
    except Exception as exc:
        pool.close()
        raise DatabaseError(f"cannot connect to PostgreSQL: {exc}") from exc
    return pool


def build(
    dsn: str,
    policy: Policy | str | Path,
    *,
    schema: Any = None,
    ledger_dsn: str | None = None,
    seed: int | None = None,
    shared: Shared | None = None,
) -> Built:
    """A proxy server with its pools. Without ``shared`` it also does the one-time set-up (the analyst role, the
    ledger's tables and limits, the shadow database it attaches to as an owner, dropping it on close when no
    other proxy uses it); with it, a worker process of a proxy whose parent did that set-up: it logs in as the
    role given and attaches to the shadow without owning it."""
    from sqldp.engine import postgres
    from sqldp.engine.postgres.engine import SETUP, PostgresEngine, configure
    from sqldp.session import Session

    pol = policy if isinstance(policy, Policy) else Policy.from_file(policy)
    cfg = config_mod.load(pol)
    # the ledger is written as the owner (``dsn``); analyst statements run as the Session's analyst role, which
    # can neither read nor write the ledger's schema (sqldp.db.analyst_dsn). Analysts share the reading
    # connections, which are reset after every use (upstream.py)
    isolation = upstream.Isolation(configure, setup_sql=SETUP)
    # as many as the reading pool: every private answer holds one for a committed write, whose WAL flush is its
    # slowest step under load, and commits from concurrent connections share a flush (group commit)
    ledger_pool = _pool(ledger_dsn or dsn, max(2, cfg.pool_size))
    pools = [ledger_pool]
    try:
        analyst = shared.analyst_dsn if shared is not None else None
        opened = postgres.open(dsn, schema=schema, analyst_dsn=analyst, policy=pol)  # the proxy serves PostgreSQL
        # a few kept open, so that a connection is free while the one just returned is being reset (with one,
        # a client's next statement waited for its last one's reset: 0.07 → 0.49 ms p50 for a public lookup)
        runner_pool = _pool(opened.engine.dsn, cfg.pool_size, isolation=isolation, keep=4)
        pools.append(runner_pool)
        opened.engine.close()  # its own connections: from now on it reads through the pool
        engine = PostgresEngine(opened.engine.dsn, pool=runner_pool)
        session = Session(engine, pol, catalog=opened.catalog, dsn=opened.dsn, seed=seed)
        with ledger_pool.connection() as conn:
            if shared is None:
                ledger.ensure(conn)
                ledger.sync_limits(conn, [(a.name, a.epsilon_limit, a.delta_limit) for a in cfg.analysts.values()])
            settings = harmless.server_settings(conn)
        # a worker attaches to its parent's shadow (same upstream and catalog: the same name), keeping what
        # builds it, so that it can build it again if it was dropped meanwhile (sqldp.proxy.catalog.Shadow)
        if shared is None or shared.shadow is not None:
            shadow = catalog.Shadow.create(dsn, session.catalog, owned=shared is None)
        else:
            shadow = None
        return Built(ProxyServer(session, cfg, ledger_pool, settings, shadow), cfg, pools, isolation)
    except BaseException:
        for p in pools:
            p.close()
        raise


class ThreadedProxy:
    """A proxy served by an event loop in a background thread (for tests, benchmarks and embedding)."""

    def __init__(self, built: Built, host: str = "127.0.0.1", port: int = 0) -> None:
        self.built = built
        self.host = host
        self.port = port
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="sqldp-proxy-loop", daemon=True)
        self._server: asyncio.Server | None = None

    def start(self) -> ThreadedProxy:
        self._thread.start()
        fut = asyncio.run_coroutine_threadsafe(self.built.server.serve(self.host, self.port), self._loop)
        self._server = fut.result(timeout=10)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def stop(self) -> None:
        async def _close() -> None:
            if self._server is not None:
                self._server.close()
                for task in asyncio.all_tasks():
                    if task is not asyncio.current_task():
                        task.cancel()

        asyncio.run_coroutine_threadsafe(_close(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self.built.close()

    def __enter__(self) -> ThreadedProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
