"""The shipped DDL and policies have one copy, ``schemas/``; the package reaches it through the link
``sqldp/data/schemas`` (which a wheel fills with the files), so ``--policy tpch`` finds every file there."""

from __future__ import annotations

from pathlib import Path

from sqldp.datasets import dataset_path, shipped_names

ROOT = Path(__file__).resolve().parents[1]


def test_the_package_reaches_schemas_through_one_link() -> None:
    link = ROOT / "sqldp" / "data" / "schemas"
    assert link.is_symlink() and link.resolve() == (ROOT / "schemas").resolve()
    for suffix in (".sql", ".toml"):
        assert shipped_names(suffix) == sorted(p.stem for p in (ROOT / "schemas").glob(f"*{suffix}"))
    assert dataset_path("tpch.toml").read_bytes() == (ROOT / "schemas" / "tpch.toml").read_bytes()
