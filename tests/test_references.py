"""Every reference the code and the docs make resolves to something a reader of the repository can find:
file paths (``sqldp/…``, ``tests/…``, ``benchmarks/…``, ``docs/…``) exist, dotted names (``sqldp.x.y``)
import, and nothing cites files that do not ship (the design notes the project started from, line numbers
of a report draft, issue numbers). The report is cited by title, section and theorem (docs/references.md)."""

from __future__ import annotations

import dataclasses
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FILES = sorted(
    p
    for pattern in (
        "sqldp/**/*.py",
        "sqldp/data/**/*.sql",
        "sqldp/data/**/*.toml",
        "tests/**/*.py",
        "benchmarks/**/*.py",
        "docs/*.md",
        "*.md",
    )
    for p in ROOT.glob(pattern)
    if p.name != "test_references.py"
)
# names in PostgreSQL, not Python: the ledger's schema and custom settings the tests set
SQL_NAMES = {
    "sqldp.budget_ledger",
    "sqldp.budget_charges",
    "sqldp.analyst_role",
    "sqldp.probe",
    "sqldp.fuzz",
    "sqldp.note",
    "sqldp.budget",
}  # fmt: skip  (sqldp.budget: the proxy's SHOW setting)
PATH = re.compile(r"\b((?:sqldp|tests|benchmarks|docs)/[A-Za-z0-9_/.\-]*[A-Za-z0-9_])")
DOTTED = re.compile(r"\bsqldp(?:\.[A-Za-z_][A-Za-z0-9_]*)+")
UNSHIPPED = re.compile(r"DESIGN\.md|FORMULAS\.md|\bNR l\.\s?\d|\bissue \d+, item|\bseeds? 00\d|shared/seeds")


def _resolves(name: str) -> bool:
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            fields = {f.name for f in dataclasses.fields(obj)} if dataclasses.is_dataclass(obj) else set()
            if attr in fields:
                return True  # a dataclass field without a default is no class attribute
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_references_resolve(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    missing = sorted({m for m in PATH.findall(text) if "*" not in m and not (ROOT / m).exists()})
    dotted = {m for m in DOTTED.findall(text) if "__main__" not in m} - SQL_NAMES
    unresolved = sorted(m for m in dotted if not _resolves(m))
    unshipped = sorted(set(UNSHIPPED.findall(text)))
    assert not (missing or unresolved or unshipped), f"paths {missing}, names {unresolved}, unshipped {unshipped}"
