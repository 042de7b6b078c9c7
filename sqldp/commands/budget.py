"""``sqldp budget show | reset | passwd``: the data owner's view of the analysts' privacy budgets.

Only whoever holds the upstream database's credentials (the data owner) can run it: the ledger lives in that
database, which analysts never reach.

A budget for the command line (``sqldp run --budget FILE``, docs/output.md): FILE declares a limit, and each run
is charged in the same ledger the proxy keeps (:mod:`sqldp.proxy.ledger`), under the entry ``cli:<name>``, before
its answer is released; ``sqldp budget show --budget FILE`` reads that entry.
"""

from __future__ import annotations

import argparse
import getpass
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqldp.cli import common_options, emit
from sqldp.db import connect, resolve_dsn
from sqldp.errors import InputError

if TYPE_CHECKING:
    from sqldp.proxy.ledger import Balance
    from sqldp.result import Result
    from sqldp.session import Session

# a CLI budget's entry in the ledger: apart from the proxy's analysts, whose limits the policy sets
CLI_PREFIX = "cli:"
BUDGET_KEYS = ("name", "epsilon_limit", "delta_limit")


@dataclass(frozen=True)
class BudgetFile:
    """A budget file: the ledger entry it names and its limits (checked like a policy: every key, one line)."""

    path: Path
    name: str
    epsilon_limit: float
    delta_limit: float

    @property
    def entry(self) -> str:
        return CLI_PREFIX + self.name


def read_budget_file(path: str) -> BudgetFile:
    """``name`` (default: the file's name without its suffix), ``epsilon_limit`` (required) and ``delta_limit``
    (default 0: pure ε-DP runs only). A missing or wrong file is one line naming it: never a run without the
    budget it asked for."""
    p = Path(path)
    try:
        raw = tomllib.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InputError(
            f"cannot read budget file: {exc.strerror} (write one: epsilon_limit = 3.0)", where=str(path)
        ) from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"not a TOML budget file: {exc}", where=str(path)) from None
    unknown = sorted(set(raw) - set(BUDGET_KEYS))
    if unknown:
        raise InputError(f"unknown key {unknown[0]!r} (a budget file has {', '.join(BUDGET_KEYS)})", where=str(path))
    name = raw.get("name", p.stem)
    if not isinstance(name, str) or not name.strip():
        raise InputError("name must be a non-empty string", where=f"{path}: name")

    def limit(key: str, default: float | None, high: float) -> float:
        value = raw.get(key, default)
        if value is None:
            raise InputError(f"{key} is missing (the ε this budget allows in all)", where=f"{path}: {key}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0 <= value <= high):
            raise InputError(f"{key} must be a number in [0, {high:g}], got {value!r}", where=f"{path}: {key}")
        return float(value)

    # ε up to 10⁶ like the policy's other ε figures: finite, and a typo of many digits is caught
    return BudgetFile(p, name, limit("epsilon_limit", None, 1e6), limit("delta_limit", 0.0, 1.0))


def budgeted_run(
    session: Session, budget: BudgetFile, sql: str, *, audit: bool, privacy: dict[str, Any]
) -> tuple[Result, Balance | None]:
    """Run ``sql`` charged against ``budget``: every refusal that needs no data comes first (``prepare``), then
    the charge, committed in the ledger (refused, and nothing read, when the budget does not cover it), then
    the run. A public query costs nothing and is not charged. The ledger is the proxy's, in the database the
    session reads: the same tables, the same atomic charge."""
    from sqldp.proxy import ledger
    from sqldp.proxy.statements import fingerprint

    if session.dsn is None:
        raise InputError("the budget ledger lives in PostgreSQL; it is not kept for --engine spark", where="--budget")
    params = session.prepare(sql, **privacy).params
    balance = None
    if params is not None:
        with connect(session.dsn) as conn:
            ledger.ensure(conn)
            # the file is the limit's source: editing it changes the limit, and what was spent is kept
            ledger.sync_limits(conn, [(budget.entry, budget.epsilon_limit, budget.delta_limit)])
            balance = ledger.charge(conn, budget.entry, params.epsilon, params.delta, fingerprint(sql))
            balance = ledger.balance(conn, budget.entry) or balance  # with the run count, which charge omits
    return session.run(sql, audit=audit, **privacy), balance


def budget_json(budget: BudgetFile, balance: Balance | None) -> dict[str, Any]:
    """What the output says of the budget (the ledger's figures: functions of the queries asked, not of the
    data)."""
    out: dict[str, Any] = {"file": str(budget.path), "entry": budget.entry}
    if balance is None:
        out.update({"charged": False, "epsilon_limit": budget.epsilon_limit, "delta_limit": budget.delta_limit})
    else:
        out.update({"charged": True, **{k: v for k, v in balance.to_json().items() if k != "analyst"}})
    return out


def budget_text(b: dict[str, Any]) -> str:
    if not b["charged"]:
        return f"budget {b['entry']}: not charged (public data)"
    delta = f", δ {b['delta_spent']:g} of {b['delta_limit']:g}" if b["delta_limit"] else ""
    return (
        f"budget {b['entry']}: ε {b['epsilon_spent']:g} of {b['epsilon_limit']:g} spent, {b['epsilon_left']:g} "
        f"left{delta} ({b['queries']} run{'' if b['queries'] == 1 else 's'}; {b['file']})"
    )


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
    p.add_argument(
        "--budget", metavar="FILE", help="show/reset: the entry of this budget file (sqldp run --budget FILE)"
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.action == "passwd":
        return _passwd(args)
    from psycopg import errors as pg_errors

    from sqldp.proxy import ledger

    budget = read_budget_file(args.budget) if args.budget else None
    if budget is not None:
        if args.analyst is not None or args.all:
            raise InputError("give either --budget FILE or an analyst (or --all), not both", where="--budget")
        args.analyst = budget.entry
    dsn = resolve_dsn(args.dsn, args.data_dir)
    with connect(dsn) as conn:
        try:
            rows: list[Balance | None] = []
            if args.action == "show" and budget is not None:
                rows = [_file_balance(conn, budget)]
            elif args.action == "show":
                rows = [*ledger.balances(conn)] if args.analyst is None else [ledger.balance(conn, args.analyst)]
            if args.action == "show":
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
                "no budget ledger in this database yet (the proxy and sqldp run --budget create it)", where="--dsn"
            ) from None


def _file_balance(conn: Any, budget: BudgetFile) -> Balance:
    """A budget file's entry: the ledger's spending under the file's limits (the next run syncs them), or
    nothing spent when no run was charged to it yet (no entry, or no ledger in this database)."""
    from decimal import Decimal

    from psycopg import errors as pg_errors

    from sqldp.proxy import ledger

    try:
        with conn.transaction():  # a missing ledger table must not abort the connection's later statements
            found = ledger.balance(conn, budget.entry)
    except pg_errors.UndefinedTable:
        found = None
    spent = (found.epsilon_spent, found.delta_spent, found.queries) if found else (Decimal(0), Decimal(0), 0)
    limits = ledger.amount(budget.epsilon_limit), ledger.amount(budget.delta_limit)
    return ledger.Balance(budget.entry, limits[0], limits[1], spent[0], spent[1], spent[2])


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
