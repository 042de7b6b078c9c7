"""What the proxy's lexer found is kept per text (sqldp.proxy.statements._Kept): the kept answers are the ones
lexing again gives, refusals are raised every time, and long texts are not kept."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sqldp.errors import SqldpError
from sqldp.proxy import statements

TEXTS = [
    "SELECT COUNT(*) FROM visits WHERE faculty = 'math'",
    "select $1, '$2' /* $3 */ -- $4\n, $5",
    "SELECT 1; SELECT 2",
    "SET search_path = x",
    "  /* nothing */ ",
    "SELECT $0",
    "SELECT 'unterminated",
    "INSERT INTO t VALUES (1)",
    "SELECT * FROM t FOR UPDATE",
    "BEGIN READ WRITE",
    "$$a$$; $tag$ ; $tag$",
]
KEPT: tuple[statements._Kept[Any], ...] = (
    statements.classify,
    statements.fingerprint,
    statements.param_count,
    statements._split,
    statements._placeholders,
)


def outcome(fn: Any, sql: str) -> Any:
    try:
        return ("value", fn(sql))
    except SqldpError as err:
        return ("error", type(err), str(err))


@pytest.mark.parametrize("sql", TEXTS)
def test_kept_answers_and_refusals_are_those_of_lexing_again(sql: str) -> None:
    for fn in KEPT:
        fresh = outcome(fn.fn, sql)
        assert outcome(fn, sql) == fresh
        assert outcome(fn, sql) == fresh  # the second time, from what was kept (or raised again)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="$1 2;'\"-/*\nSELECTfrom$tag", max_size=40))
def test_kept_equals_fresh_on_random_texts(sql: str) -> None:
    for fn in KEPT:
        assert outcome(fn, sql) == outcome(fn, sql) == outcome(fn.fn, sql)
    statements._placeholders.cached.cache_clear()
    fresh = outcome(lambda text: statements.bind(text, lambda n: f"<{n}>"), sql)
    assert outcome(lambda text: statements.bind(text, lambda n: f"<{n}>"), sql) == fresh


def test_long_texts_are_not_kept() -> None:
    long = "SELECT " + " + ".join(["1"] * statements.KEPT_BELOW)
    for i, fn in enumerate(KEPT):
        size = fn.cached.cache_info().currsize
        outcome(fn, long)
        assert fn.cached.cache_info().currsize == size
        outcome(fn, long[: statements.KEPT_BELOW - i])  # a text of its own: classify also keeps its split
        assert fn.cached.cache_info().currsize == min(size + 1, statements.KEPT)
