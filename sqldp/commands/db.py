"""``sqldp db start | stop | status | url``: the embedded PostgreSQL."""

from __future__ import annotations

import argparse

from sqldp.db import EmbeddedServer


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("db", help="manage the embedded PostgreSQL server")
    p.add_argument("action", choices=("start", "stop", "status", "url"))
    p.add_argument("--data-dir", help="server home (default: $SQLDP_HOME or the per-user data dir)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
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
