"""``sqldp budget show | reset | passwd``: the data owner's view of the analysts' privacy budgets.

Only whoever holds the upstream database's credentials (the data owner) can run it: the ledger lives in that
database, which analysts never reach.
"""

from __future__ import annotations

import argparse
import getpass
import sys
from typing import Any

from sqldp.cli import common_options, emit
from sqldp.db import connect, resolve_dsn
from sqldp.errors import InputError


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "budget", parents=[common_options(query=False, schema=False)], help="show or reset analysts' privacy budgets"
    )
    p.add_argument(
        "action", choices=("show", "reset", "passwd"), help="show the ledger, reset spending, make a verifier"
    )
    p.add_argument("analyst", nargs="?", help="analyst name (reset: required unless --all; passwd: required)")
    p.add_argument("--all", action="store_true", help="reset: every analyst")
    p.add_argument("--password-stdin", action="store_true", help="passwd: read the password from standard input")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.action == "passwd":
        return _passwd(args)
    from psycopg import errors as pg_errors

    from sqldp.proxy import ledger

    dsn = resolve_dsn(args.dsn, args.data_dir)
    with connect(dsn) as conn:
        try:
            if args.action == "show":
                rows = ledger.balances(conn) if args.analyst is None else [ledger.balance(conn, args.analyst)]
                if rows == [None]:
                    raise InputError(f"no analyst {args.analyst!r} in the ledger", where="analyst")
                payload: dict[str, Any] = {"analysts": [b.to_json() for b in rows if b is not None]}
                emit(args, payload, _table)
                return 0
            if args.all == (args.analyst is not None):
                raise InputError("name one analyst or give --all", where="reset")
            n = ledger.reset(conn, None if args.all else args.analyst)
            if n == 0 and args.analyst:
                raise InputError(f"no analyst {args.analyst!r} in the ledger", where="analyst")
            emit(args, {"reset": n}, lambda p: f"reset {p['reset']} analyst(s)")
            return 0
        except pg_errors.UndefinedTable:
            raise InputError(
                "no budget ledger in this database yet (it is created when the proxy starts)", where="--dsn"
            ) from None


def _table(payload: dict[str, Any]) -> str:
    lines = [
        f"{'analyst':<20} {'ε spent':>12} {'ε limit':>12} {'ε left':>12} {'δ spent':>10} {'δ limit':>10} {'queries':>8}"
    ]
    for a in payload["analysts"]:
        lines.append(
            f"{a['analyst']:<20} {a['epsilon_spent']:>12.6g} {a['epsilon_limit']:>12.6g} {a['epsilon_left']:>12.6g} "
            f"{a['delta_spent']:>10.3g} {a['delta_limit']:>10.3g} {a['queries']:>8}"
        )
    return "\n".join(lines)


def _passwd(args: argparse.Namespace) -> int:
    from sqldp.proxy.scram import make_verifier

    if not args.analyst:
        raise InputError("name the analyst: sqldp budget passwd NAME", where="analyst")
    if args.password_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    else:
        password = getpass.getpass(f"password for {args.analyst}: ")
        if getpass.getpass("again: ") != password:
            raise InputError("the passwords do not match", where="passwd")
    print(f'{args.analyst} = "{make_verifier(password)}"')
    return 0
