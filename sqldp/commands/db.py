"""``sqldp db start | stop | status | url | grant``: the embedded PostgreSQL and the analyst role."""

from __future__ import annotations

import argparse

from sqldp import db
from sqldp.db import EmbeddedServer


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "db",
        help="manage the embedded PostgreSQL server and the analyst role",
        description="start: start the embedded server (initialised on first use) and print its URL; "
        "stop: stop it; status: whether it runs, its pid and URL (exit 3 when stopped); url: its connection "
        "string (started when needed); grant: create the analyst role with SELECT on the data schema's tables",
    )
    p.add_argument(
        "action",
        choices=("start", "stop", "status", "url", "grant"),
        help="start | stop | status | url | grant (the analyst role; see the description)",
    )
    p.add_argument(
        "--data-dir", metavar="DIR", help="the embedded server's home (default: $SQLDP_HOME or the per-user data dir)"
    )
    p.add_argument("--dsn", help="grant: the owner's connection string (default: $SQLDP_DSN, else the embedded server)")
    p.add_argument(
        "--print-sql", action="store_true", help="grant: print the SQL that creates the role instead of running it"
    )
    p.add_argument(
        "--harden",
        action="store_true",
        help="grant: also revoke from PUBLIC (every role of the database) what an analyst must not do; "
        "always done on the embedded server",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.action == "grant":
        return grant(args)
    server = EmbeddedServer(args.data_dir)
    if args.action == "start":
        url = server.start()
        print(f"running: {url}")
    elif args.action == "stop":
        print("stopped" if server.stop() else "not running")
    elif args.action == "url":
        status = server.status()
        print(status.url if status.running else server.start())
    else:
        status = server.status()
        if status.running:
            print(f"running (pid {status.pid}) in {status.data_dir}: {status.url}")
        else:
            print(f"not running ({status.data_dir})")
            return 3  # like pg_ctl status
    return 0


def grant(args: argparse.Namespace) -> int:
    """Create the analyst role and grant it SELECT on the data schema's tables, or print the SQL for that."""
    if args.print_sql and not args.dsn:
        print(db.print_sql("<database>"), end="")
        return 0
    dsn = db.resolve_dsn(args.dsn, args.data_dir)
    with db.connect(dsn) as conn:
        if args.print_sql:
            print(db.print_sql(conn.info.dbname), end="")
            return 0
        tables = [
            r[0]
            for r in conn.execute(
                "SELECT relname FROM pg_class WHERE relnamespace = to_regnamespace(%s) "
                "AND relkind IN ('r', 'v', 'm', 'p', 'f') ORDER BY 1",
                (db.DATA_SCHEMA,),
            ).fetchall()
        ]
        changed = db.provision(conn, tables, harden=args.harden or db.owns_server(conn))
    state = "granted" if changed else "already granted"
    print(f"{state}: {db.ANALYST_ROLE} may SELECT {len(tables)} table(s) in schema {db.DATA_SCHEMA}")
    return 0
