"""Dump every bound figure sqldp computes for the shipped query files, to compare two revisions of the code.

A refactor must leave each figure where it was: run this before and after and ``diff`` the two files (or pass
``--compare OLD.json``). For each query file and policy it records the data owner's analysis
(:meth:`sqldp.session.Session.analyze`, audit mode: sensitivities, smooth bounds, β, noise scales and
half-widths, read from the embedded TPC-H database) and the plan an analyst sees (``audit=False``), or the
refusal's message. Nothing is released and no noise is drawn.

The sets: the 22 TPC-H queries under the shipped ``tpch`` and ``tpch_catalog`` policies; the NAPLES variants
(``benchmarks/tpch/queries/naples/``) under ``tpch`` with rows public, as ``naples_bench.py`` runs them; the
row-level forms (``benchmarks/tpch/queries/rows/``) under ``benchmarks/tpch/policy_rows.toml``; the R2T
queries (``benchmarks/tpch/queries/r2t/``) and the 22 under each unit policy of ``benchmarks/tpch/units/``.

    python benchmarks/bounds_dump.py --out before.json [--dsn DSN]
    python benchmarks/bounds_dump.py --out after.json --compare before.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import sqldp
from sqldp.errors import SqldpError
from sqldp.policy import Policy
from sqldp.session import Session

ROOT = Path(__file__).resolve().parents[1]
QUERIES = ROOT / "benchmarks" / "tpch" / "queries"
DROPPED = ("query", "seconds", "elapsed", "time", "started", "timings")  # the text and the timings: not bound figures


def naples_policy() -> Policy:
    text = (ROOT / "schemas" / "tpch.toml").read_text(encoding="utf-8")
    text = text.replace('rows = "private"', 'rows = "public"').replace("\nbeta = 0.1\n", "\n")
    return Policy.from_toml(text, source="tpch.toml, rows public")


def clean(value: Any) -> Any:
    """The JSON with timings dropped and floats written so that equal figures print equally."""
    if isinstance(value, dict):
        return {k: clean(v) for k, v in sorted(value.items()) if not any(d in k for d in DROPPED)}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    if isinstance(value, float):
        return repr(value) if not math.isfinite(value) else float(f"{value:.12g}")
    return value


def figures(session: Session, sql: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, audit in (("audit", True), ("plan", False)):
        try:
            out[name] = clean(session.analyze(sql, audit=audit).to_json())
        except SqldpError as err:
            out[name] = {"refused": type(err).__name__, "message": str(err)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dsn", default=None, help="PostgreSQL with TPC-H loaded (default: the embedded server)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--compare", type=Path, help="an earlier dump: list every key whose figures differ")
    args = ap.parse_args()
    sets: list[tuple[str, Any, list[Path]]] = [
        ("tpch", "tpch", sorted(QUERIES.glob("q*.sql"))),
        ("tpch_catalog", "tpch_catalog", sorted(QUERIES.glob("q*.sql"))),
        ("naples", naples_policy(), sorted((QUERIES / "naples").glob("q*.sql"))),
        ("rows", ROOT / "benchmarks" / "tpch" / "policy_rows.toml", sorted((QUERIES / "rows").glob("q*.sql"))),
    ]
    for unit in sorted((ROOT / "benchmarks" / "tpch" / "units").glob("*.toml")):
        files = sorted((QUERIES / "r2t").glob("q*.sql")) + sorted(QUERIES.glob("q*.sql"))
        sets.append((f"unit:{unit.stem}", unit, files))
    dump: dict[str, Any] = {}
    for label, policy, files in sets:
        session = sqldp.connect(args.dsn, policy=policy, seed=1)
        try:
            for path in files:
                key = f"{label}:{path.relative_to(QUERIES)}"
                dump[key] = figures(session, path.read_text(encoding="utf-8"))
                print(key, "refused" if "refused" in dump[key]["audit"] else "ok", file=sys.stderr)
        finally:
            session.close()
    args.out.write_text(json.dumps(dump, indent=1, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")
    if args.compare is not None:
        old = json.loads(args.compare.read_text(encoding="utf-8"))
        changed = sorted(k for k in old.keys() | dump.keys() if old.get(k) != dump.get(k))
        for key in changed:
            print(f"differs: {key}")
        print(f"{len(dump)} entries, {len(changed)} differ from {args.compare.name}")
        sys.exit(1 if changed else 0)


if __name__ == "__main__":
    main()
