"""``sqldp policy init`` (a first policy file from the catalog) and ``sqldp policy check`` (what a policy's
declarations imply, table by table, and the mistakes that load without an error).

``init`` reads the catalog (the database's, or a DDL file's with ``--schema``) and writes what it proves: the
ranges and domains of the column types and CHECK constraints, enum labels, and ``max_rows_per`` from composite
primary keys (:mod:`sqldp.policy.init`); the tables named in ``--private`` are row-private, the others public.
The file it writes loads and validates against that catalog before it is written. ``check`` loads a policy,
validates it against the catalog and prints one line per table (:mod:`sqldp.policy.describe`).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqldp.cli import _Parser, common_options, emit
from sqldp.errors import InputError

if TYPE_CHECKING:
    from sqldp.catalog import Catalog


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "policy",
        help="write a first policy from the catalog (init), or explain and check a policy (check)",
        description="init: a policy file from the catalog's types, keys and CHECK constraints; "
        "check: what a policy declares, per table, and the mistakes that load without an error",
    )
    actions: argparse._SubParsersAction[argparse.ArgumentParser] = p.add_subparsers(
        dest="action", metavar="ACTION", parser_class=_Parser, required=True
    )
    init = actions.add_parser(
        "init",
        parents=[common_options(query=False, policy=False)],
        help="write a policy from the catalog (--private: the tables whose rows are private)",
        description="Write a policy TOML from the catalog: ranges and domains that column types and CHECK "
        "constraints prove, enum labels, max_rows_per from composite primary keys; each with a comment saying "
        "where it came from. Tables named in --private are row-private, the others public.",
    )
    init.add_argument(
        "--private",
        metavar="T1,T2",
        help="the tables whose rows are private, comma-separated; the others are written public "
        "(default: every table private)",
    )
    init.add_argument(
        "--estimate-epsilon",
        type=float,
        metavar="E",
        help="also estimate, with DP from the data (needs --dsn), the ranges, text domains and max_rows_per the "
        "catalog does not prove, spending E in all; recorded in the file's [estimates] section",
    )
    init.add_argument(
        "--estimate-delta",
        type=float,
        metavar="D",
        default=0.0,
        help="the δ of those estimates (text domains need D > 0; default 0: ranges and max_rows_per only)",
    )
    init.add_argument("-o", "--output", metavar="FILE", help="write the policy to FILE (default: standard output)")
    init.add_argument("--force", action="store_true", help="replace FILE if it exists")
    init.set_defaults(func=run_init)
    check = actions.add_parser(
        "check",
        parents=[common_options(query=False)],
        help="validate a policy against the catalog and say what it declares, one line per table",
        description="Load a policy, validate it against the catalog (the database's, or --schema's), and print "
        "per table whether it is public, row-private or value-private (and under which norm), its ranges, "
        "domains and contribution bounds, its privacy units; then warnings for declarations that load "
        "without an error but are probably not what was meant.",
    )
    check.set_defaults(func=run_check)


def note_policy(policy: Any, prog: str = "sqldp") -> None:
    """One line on stderr per declaration that silently makes a table less private than it looks (a table
    ``rows = "public"`` with a norm is value-private): said where a policy is loaded to answer queries."""
    from sqldp.policy.describe import public_norm_notes

    for note in public_norm_notes(policy):
        print(f"{prog}: note: {note}", file=sys.stderr, flush=True)


def _catalog(args: argparse.Namespace) -> tuple[Catalog, str]:
    """The catalog (a DDL file with ``--schema``, else the database's) and how to name where it came from."""
    from sqldp.context import load_catalog

    if args.schema:
        from sqldp.datasets import shipped_names

        shipped = str(args.schema) in shipped_names(".sql") and not Path(args.schema).exists()
        name = f"the schema {args.schema}.sql shipped with sqldp" if shipped else f"the schema file {args.schema}"
        return load_catalog(args.schema, None), name
    from sqldp.db import connect, resolve_dsn

    with connect(resolve_dsn(args.dsn, args.data_dir)) as conn:
        catalog = load_catalog(None, conn)
        return catalog, f"database {conn.info.dbname} ({catalog.source})"


def _private(text: str | None, catalog: Catalog) -> list[str] | None:
    if text is None:
        return None
    names = [n.strip().lower() for n in text.split(",") if n.strip()]
    if not names:
        raise InputError("names no table (give T1,T2, or leave it out to make every table private)", where="--private")
    unknown = [n for n in names if n not in catalog.tables]
    if unknown:
        raise InputError(
            f"no table {unknown[0]!r} in {catalog.source} (it has {', '.join(sorted(catalog.tables))})",
            where="--private",
        )
    return names


def run_init(args: argparse.Namespace) -> int:
    from sqldp.policy.document import Policy
    from sqldp.policy.init import propose

    target = Path(args.output) if args.output else None
    if target is not None and target.exists() and not args.force:
        raise InputError("exists; give --force to replace it, or another -o FILE", where=str(target))
    catalog, origin = _catalog(args)
    private = _private(args.private, catalog)
    estimates = _estimates(args, catalog, private, origin) if args.estimate_epsilon is not None else None
    text = propose(catalog, private, source=origin, estimates=estimates)
    policy = Policy.from_toml(text, source=str(target or "the proposed policy"))
    policy.validate(catalog)  # what is written loads: a failure here is sqldp's mistake, not the user's
    summary = _summary(policy, catalog)
    if target is not None:
        _write(target, text)
    if args.format == "json":
        emit(args, {"file": str(target) if target else None, "policy": text, **summary}, lambda _: "")
    elif target is None:
        sys.stdout.write(text)
    else:
        print(
            f"wrote {target}: {summary['private']} private and {summary['public']} public table(s), "
            f"{summary['ranges']} range(s), {summary['domains']} domain(s) from {origin}; "
            f"next: sqldp policy check --policy {target}" + (f" --schema {args.schema}" if args.schema else "")
        )
    return 0


def _estimates(args: argparse.Namespace, catalog: Catalog, private: list[str] | None, origin: str) -> Any:
    """The DP estimates, read on the owner's connection in one read-only snapshot."""
    from sqldp.db import connect, resolve_dsn
    from sqldp.engine.postgres.summaries import Reader
    from sqldp.mechanisms.source import NoiseSource
    from sqldp.policy.estimated import run

    if args.schema:
        raise InputError("estimates read the data: give --dsn, not --schema", where="--estimate-epsilon")
    if not args.estimate_epsilon > 0:
        raise InputError(f"must be > 0, got {args.estimate_epsilon:g}", where="--estimate-epsilon")
    if not 0 <= args.estimate_delta < 1:
        raise InputError(f"must be in [0, 1), got {args.estimate_delta:g}", where="--estimate-delta")
    tables = sorted(catalog.tables) if private is None else private
    with connect(resolve_dsn(args.dsn, args.data_dir), autocommit=False) as conn:
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        out = run(
            catalog, tables, args.estimate_epsilon, args.estimate_delta, Reader(conn), NoiseSource(), origin=origin
        )
        conn.rollback()
    return out


def _summary(policy: Any, catalog: Catalog) -> dict[str, int]:
    tables = [policy.table(name) for name in catalog.tables]
    columns = [c for t in tables for c in t.columns.values()]
    return {
        "private": sum(t.rows_private for t in tables),
        "public": sum(not t.rows_private for t in tables),
        "ranges": sum(c.range is not None for c in columns),
        "domains": sum(c.domain is not None for c in columns),
    }


def _write(target: Path, text: str) -> None:
    """Replace ``target`` whole, by a rename: a failed write leaves what was there."""
    directory = target.parent if str(target.parent) else Path(".")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=directory)
    except OSError as exc:
        raise InputError(f"cannot write: {exc.strerror}", where=str(target)) from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, target)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise InputError(f"cannot write: {exc.strerror}", where=str(target)) from None


def run_check(args: argparse.Namespace) -> int:
    from sqldp.context import load_policy
    from sqldp.policy.describe import table_lines, warnings

    policy = load_policy(args.policy)  # a file that does not load is the one-line error, before any connection
    catalog, origin = _catalog(args)
    policy.validate(catalog)
    lines = table_lines(policy, catalog)
    found = warnings(policy, catalog)
    d = policy.defaults
    defaults = {
        "epsilon": d.epsilon,
        "delta": d.delta,
        "mechanism": d.mechanism,
        "confidence": d.confidence,
        "advantage": d.advantage,
    }
    units = {
        u.name: {"table": u.table, "key": u.key, "max_contribution": u.max_contribution} for u in policy.units.values()
    }
    payload = {
        "policy": policy.source,
        "catalog": origin,
        "valid": True,
        "defaults": defaults,
        "tables": lines,
        "units": units,
        "goals": len(policy.goals),
        "warnings": found,
    }
    emit(args, payload, _check_text)
    return 0


def _check_text(o: dict[str, Any]) -> str:
    d = o["defaults"]
    privacy = [f"ε {d['epsilon']:g}" if d["epsilon"] is not None else "no default ε (give --epsilon)"]
    if d["delta"] is not None:
        privacy.append(f"δ {d['delta']:g}")
    privacy += [f"mechanism {d['mechanism']}", f"{d['confidence']:.0%} error bars"]
    if d["advantage"] is not None:
        privacy.append(f"advantage target {d['advantage']:g}")
    width = max((len(t) for t in o["tables"]), default=0)
    out = [f"{o['policy']}: valid against {o['catalog']}", "defaults: " + ", ".join(privacy)]
    out += [f"{name:<{width}}  {line}" for name, line in o["tables"].items()]
    for name, u in o["units"].items():
        out.append(
            f"unit {name}: one {u['table']}.{u['key']} value, at most {u['max_contribution']:g} per COUNT or SUM"
        )
    if o["goals"]:
        out.append(f"goals: {o['goals']} (sqldp epsilon derives ε from them)")
    out += [f"warning: {w}" for w in o["warnings"]]
    return "\n".join(out)
