"""``max_rows_per``, the declared contribution bound of a table (docs/truncation.md): parsed into column → τ,
and every bad value is one PolicyError line naming the key, through the policy package's one key checker."""

from __future__ import annotations

import pytest

from sqldp.catalog import Catalog
from sqldp.errors import PolicyError
from sqldp.policy import Policy

DDL = "CREATE TABLE lineitem (l_orderkey INT NOT NULL, l_linenumber INT NOT NULL, l_quantity INT);"


def _load(text: str) -> Policy:
    policy = Policy.from_toml(text, source="p.toml")
    policy.validate(Catalog.from_ddl(DDL))
    return policy


def test_a_declaration_is_read_with_its_column_folded() -> None:
    policy = _load("[tables.lineitem]\nmax_rows_per = { L_OrderKey = 7 }\n")
    assert policy.table("lineitem").max_rows_per == {"l_orderkey": 7}
    assert _load("[tables.lineitem]\n").table("lineitem").max_rows_per == {}


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("7", "must be a table { column = τ }"),
        ("{ l_orderkey = 0 }", r"τ must be a whole number in \[1, 1000000\], got 0"),
        ("{ l_orderkey = -7 }", "τ must be a whole number"),
        ("{ l_orderkey = 7.0 }", "τ must be a whole number"),
        ("{ l_orderkey = 2.5 }", "τ must be a whole number"),
        ("{ l_orderkey = true }", "τ must be a whole number"),
        ("{ l_orderkey = '7' }", "τ must be a whole number"),
        ("{ l_orderkey = 10000001 }", "τ must be a whole number"),
        ("{ l_orderkey = nan }", "τ must be a whole number"),
        ("{ l_orderkey = 7, l_linenumber = 1 }", "exactly one column, got 2"),
        ("{}", "exactly one column, got 0"),
        ("{ l_orderkey = 7, L_ORDERKEY = 6 }", "same name"),
    ],
)
def test_bad_values_are_one_line_errors_naming_the_key(value: str, problem: str) -> None:
    with pytest.raises(PolicyError, match=problem) as err:
        _load(f"[tables.lineitem]\nmax_rows_per = {value}\n")
    assert err.value.where is not None and err.value.where.startswith("p.toml: tables.lineitem.max_rows_per")
    assert "\n" not in str(err.value)


def test_a_misspelt_key_or_an_unknown_column_is_refused() -> None:
    with pytest.raises(PolicyError, match=r"unknown key 'max_row_per'.*max_rows_per") as err:
        _load("[tables.lineitem]\nmax_row_per = { l_orderkey = 7 }\n")
    assert err.value.where == "p.toml: tables.lineitem"
    with pytest.raises(PolicyError, match="column 'l_nope' is not in table 'lineitem'"):
        _load("[tables.lineitem]\nmax_rows_per = { l_nope = 7 }\n")
