"""``sqldp proxy``: serve analysts over the PostgreSQL protocol (see docs/proxy.md)."""

from __future__ import annotations

import argparse
import contextlib
import logging
import signal
import sys

from sqldp.cli import common_options
from sqldp.db import resolve_dsn
from sqldp.errors import InputError


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "proxy",
        parents=[common_options(query=False)],
        help="serve noisy answers to PostgreSQL clients (psql, psycopg, BI tools)",
    )
    p.add_argument(
        "--listen", metavar="HOST:PORT", help="address to listen on (default: [proxy] listen, else 127.0.0.1:6543)"
    )
    p.add_argument("--upstream", metavar="DSN", help="the database the analysts' queries run on (same as --dsn)")
    p.add_argument("--ledger-dsn", metavar="DSN", help="database of the budget ledger (default: the upstream)")
    p.add_argument("--log-level", choices=("info", "warning"), default="info", help="info: one JSON line per query")
    p.add_argument(
        "--workers",
        type=int,
        metavar="N",
        help="server processes sharing the port (default: the number of CPUs on Linux, else 1; 1: one process)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if not args.policy:
        raise InputError(
            "the proxy needs a policy with [analysts] (who may connect, with what budget)", where="--policy"
        )
    if args.upstream and args.dsn and args.upstream != args.dsn:
        raise InputError("give the upstream either as --upstream or --dsn, not both", where="--upstream")
    from sqldp.proxy.config import parse_listen  # the proxy package is imported when it serves, not for --help

    listen = parse_listen(args.listen, "--listen") if args.listen else None
    from sqldp.proxy import build, workers

    count = workers.default_workers() if args.workers is None else args.workers
    if not 1 <= count <= workers.MAX_WORKERS:
        raise InputError(f"must be between 1 and {workers.MAX_WORKERS}, got {count}", where="--workers")
    level = getattr(logging, args.log_level.upper())
    logging.basicConfig(stream=sys.stderr, level=level, format="%(message)s")
    _warn_without_analysts(args.policy)
    dsn = resolve_dsn(args.upstream or args.dsn, args.data_dir)
    if count > 1:
        return workers.serve(
            dsn,
            args.policy,
            schema=args.schema,
            ledger_dsn=args.ledger_dsn,
            listen=listen,
            workers=count,
            log_level=level,
            announce=lambda host, port: _announce(host, port, count),
        )
    built = build(dsn, args.policy, schema=args.schema, ledger_dsn=args.ledger_dsn)
    host, port = listen or built.config.listen
    import asyncio  # here, not at the top: every command module is imported for `sqldp --help`

    try:
        asyncio.run(_serve(built, host, port))
    finally:
        built.close()
    return 0


async def _serve(built: object, host: str, port: int) -> None:
    import asyncio

    from sqldp.proxy import Built

    assert isinstance(built, Built)
    try:
        server = await built.server.serve(host, port)
    except OSError as exc:
        raise InputError(f"cannot listen on {host}:{port}: {exc.strerror}", where="--listen") from None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    where = server.sockets[0].getsockname()
    _announce(where[0], where[1], 1)
    async with server:
        await stop.wait()
        await built.server.shutdown()


def _warn_without_analysts(policy: str) -> None:
    """A policy without [analysts] starts a proxy nobody can log in to (the shipped ones name none): say so
    and how to add one, rather than leave every login failing with the same message as a wrong password. A
    table the policy leaves value-private without a word (rows public, a norm) gets its note too."""
    from sqldp.commands.policy import note_policy
    from sqldp.policy.analysts import parse_proxy
    from sqldp.policy.document import Policy

    loaded = Policy.from_file(policy)
    note_policy(loaded, "sqldp proxy")
    if not parse_proxy(loaded).analysts:
        print(
            f"sqldp proxy: warning: the policy names no analyst, so nobody can log in; add one with "
            f'`sqldp analyst add NAME --policy FILE` (FILE a copy: --from {policy}; docs/proxy.md, "Passwords")',
            file=sys.stderr,
            flush=True,
        )


def _announce(host: str, port: int, workers: int) -> None:
    processes = "one process" if workers == 1 else f"{workers} worker processes"
    print(f"sqldp proxy listening on {host}:{port} ({processes})", file=sys.stderr, flush=True)
