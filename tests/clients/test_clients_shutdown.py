"""SIGTERM with clients connected: the proxy stops cleanly, as PostgreSQL does at a fast
shutdown — each client is told (FATAL 57P01, "terminating connection due to administrator command") — and its
log has no traceback (a cancelled connection task reached asyncio's callback, which logged CancelledError)."""

from __future__ import annotations

import signal
from pathlib import Path

import psycopg
import pytest
from proxy_support import client_dsn, start_proxy


def test_sigterm_with_clients_connected(upstream: str, policy: Path) -> None:
    """One process (`sqldp proxy --workers 1`); with worker processes: test_clients_catalog.py, which stops one
    of three proxies with SIGTERM."""
    proc, port = start_proxy(upstream, policy, workers=1, log_level="info")
    idle = psycopg.connect(client_dsn(port), autocommit=True)
    in_block = psycopg.connect(client_dsn(port))  # a transaction block open: BEGIN sent, waiting for more
    try:
        assert idle.execute("SELECT n_name FROM nation WHERE n_nationkey = 2").fetchone() == ("ARGENTINA",)
        in_block.execute("SELECT COUNT(*) FROM visits").fetchone()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert proc.stderr is not None
        log = proc.stderr.read()
        assert "Traceback" not in log and "CancelledError" not in log and "Exception in callback" not in log, log
        for conn in (idle, in_block):
            with pytest.raises(psycopg.OperationalError, match=r"administrator command|closed"):
                conn.execute("SELECT 1").fetchone()
    finally:
        idle.close()
        in_block.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
