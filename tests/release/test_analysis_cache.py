"""The session's analysis cache (sqldp.session.Session.prepare): a repeated statement is parsed and analysed
once; every run still reads the data, computes its data-dependent figures and draws fresh noise; a policy
change empties the cache; a text that differs only in whitespace shares the analysis, any other change not."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

import sqldp
from sqldp import session as session_module
from sqldp.policy import Policy

POLICY = '[defaults]\nepsilon = 1.0\n[tables.pub]\nrows = "public"\n'
# a self-join: its smoothed sensitivity is a function of the data (README: 16.72 → 19.71 on 20 rows)
SELF_JOIN = "SELECT COUNT(*) FROM t a, t b WHERE a.g = b.g"


@pytest.fixture
def counted(pg_dsn: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[sqldp.session.Session, list[str], str]]:
    """A session on a table t of 20 rows in 4 groups, and the list of the statements it analysed."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (g INT NOT NULL); INSERT INTO t SELECT i % 4 FROM generate_series(1, 20) i")
        conn.execute("CREATE TABLE pub (y INT); INSERT INTO pub VALUES (1), (2)")
    analysed: list[str] = []
    original = session_module.Session._compile

    def counting(self: sqldp.session.Session, sql: str, **privacy: object) -> object:
        analysed.append(sql)
        return original(self, sql, **privacy)

    monkeypatch.setattr(session_module.Session, "_compile", counting)
    yield sqldp.connect(pg_dsn, Policy.from_toml(POLICY)), analysed, pg_dsn


def test_a_repeated_statement_is_analysed_once_and_gets_fresh_noise(
    counted: tuple[sqldp.session.Session, list[str], str],
) -> None:
    session, analysed, _ = counted
    answers = [session.run(SELF_JOIN).answer for _ in range(4)]
    assert analysed == [SELF_JOIN]
    # fresh noise each run: four equal draws of a continuous release (on a 2⁻⁴⁰ grid) would be a cached answer
    assert len(set(answers)) == 4
    assert session.spent == pytest.approx(4.0)  # and each run is charged


def test_each_run_recomputes_the_data_dependent_figures(
    counted: tuple[sqldp.session.Session, list[str], str],
) -> None:
    """The cache holds what the text, catalog and policy decide; the smoothed sensitivity is the data's: after
    a row is added, the cached statement's run has the new data's sensitivity, that of a fresh session."""
    session, analysed, dsn = counted
    before = session.run(SELF_JOIN).measurements[0][0].sensitivity
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO t VALUES (0)")
    after = session.run(SELF_JOIN).measurements[0][0].sensitivity
    assert analysed == [SELF_JOIN] and after != before
    fresh = sqldp.connect(dsn, Policy.from_toml(POLICY)).run(SELF_JOIN).measurements[0][0].sensitivity
    assert after == pytest.approx(fresh)


def test_a_policy_change_empties_the_cache(counted: tuple[sqldp.session.Session, list[str], str]) -> None:
    session, analysed, _ = counted
    assert not session.run("SELECT COUNT(*) FROM t").public
    session.policy = Policy.from_toml(POLICY + '[tables.t]\nrows = "public"\n')
    again = session.run("SELECT COUNT(*) FROM t")
    assert analysed == ["SELECT COUNT(*) FROM t"] * 2
    assert again.public and again.answer == 20  # the new policy's answer, not the cached plan's


def test_only_whitespace_variants_share_an_analysis(counted: tuple[sqldp.session.Session, list[str], str]) -> None:
    session, analysed, _ = counted
    session.run(SELF_JOIN)
    variant = "SELECT COUNT(*)\n  FROM t a,   t b\n WHERE a.g = b.g  "
    result = session.run(variant)
    assert analysed == [SELF_JOIN] and result.sql == variant  # shared, and named as sent
    for other in (
        "SELECT COUNT(*) FROM t a, t b WHERE a.g = b.g AND a.g > 0",  # another statement
        "SELECT COUNT(*) FROM t a, t b WHERE a.g = b.g /* a comment */",  # the parser sees comments
        "select count(*) from t a, t b where a.g = b.g",  # other token texts: not assumed equal
    ):
        session.run(other)
    assert len(analysed) == 4
    session.run(SELF_JOIN, epsilon=0.5)  # other privacy arguments: another analysis
    assert len(analysed) == 5
    # public statements run as written: never shared between spellings
    session.run("SELECT SUM(y) FROM pub")
    session.run("SELECT SUM(y)  FROM pub")
    assert len(analysed) == 7


def test_a_refusal_is_kept_as_an_analysis_is(counted: tuple[sqldp.session.Session, list[str], str]) -> None:
    """A refused statement is refused again without a second analysis, with the same message and place, as a
    fresh exception; a policy under which it is answerable analyses it again."""
    from sqldp.errors import RefusedError

    session, analysed, _ = counted
    refused = "SELECT g FROM t"  # rows of a private table
    raised = []
    for _ in range(3):
        with pytest.raises(RefusedError) as err:
            session.run(refused)
        raised.append(err.value)
    assert analysed == [refused]
    assert len({(type(e), e.message, e.where) for e in raised}) == 1
    assert raised[0] is not raised[1]  # each attempt its own exception object
    session.policy = Policy.from_toml(POLICY + '[tables.t]\nrows = "public"\n')
    assert session.run(refused).public and analysed == [refused, refused]
