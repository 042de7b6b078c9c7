"""Policy-file validation: every problem is one PolicyError naming the key, never a traceback, and nothing
weakens the policy silently (case-variant names, repeated groups, non-finite numbers)."""

from __future__ import annotations

import pytest

from sqldp.catalog import Catalog
from sqldp.errors import PolicyError
from sqldp.policy import Policy

DDL = """
CREATE TABLE orders (o_id INT PRIMARY KEY, o_total NUMERIC, o_status CHAR(1), o_prio VARCHAR(15),
                     o_date DATE, o_flag BOOLEAN);
"""


def _load(text: str) -> Policy:
    policy = Policy.from_toml(text, source="p.toml")
    policy.validate(Catalog.from_ddl(DDL))
    return policy


@pytest.mark.parametrize(
    ("text", "where", "problem"),
    [
        # a case-variant duplicate must not silently replace the private table by a public one
        ('[tables.orders]\nrows = "private"\n[tables.ORDERS]\nrows = "public"\n', "tables.ORDERS", "same name"),
        (
            "[tables.orders.columns.o_total]\nrange = [0, 1]\n[tables.orders.columns.O_Total]\nrange = [0, 1e6]\n",
            "tables.orders.columns.O_Total",
            "same name",
        ),
        ("[tables.orders.columns.o_total]\nrange = [nan, 1]\n", "tables.orders.columns.o_total.range", "finite"),
        ("[tables.orders.columns.o_total]\nrange = [0, nan]\n", "tables.orders.columns.o_total.range", "finite"),
        ("[tables.orders.columns.o_total]\nrange = [0, inf]\n", "tables.orders.columns.o_total.range", "finite"),
        ("[tables.orders.columns.o_total]\nrange = [-inf, 0]\n", "tables.orders.columns.o_total.range", "finite"),
        ("[tables.orders.columns.o_total]\nrange = [0, 1e300]\n", "tables.orders.columns.o_total.range", "finite"),
        ("[tables.orders.columns.o_total]\nrange = [2, 1]\n", "tables.orders.columns.o_total.range", "above"),
        ("[tables.orders]\nweight = 1e308\n", "tables.orders.weight", "weight must be in"),
        ("[tables.orders]\nweight = 1e-308\n", "tables.orders.weight", "weight must be in"),
        ('[tables.orders]\nnorm = "l1(1e308*o_total)"\n', "tables.orders.norm", "weight must be in"),
        ('[tables.orders]\nnorm = "l1(1e-308*o_total)"\n', "tables.orders.norm", "weight must be in"),
        ('[tables.orders]\nnorm = "l1(0*o_total)"\n', "tables.orders.norm", "weight must be in"),
        ('[tables.orders]\nnorm = "l1(1e400*o_total)"\n', "tables.orders.norm", "NUMBER"),
        ('[tables.orders]\nnorm = "l1(1e3*l1(1e4*o_total))"\n', "tables.orders.norm", "weight must be in"),
        ('[tables.orders]\nnorm = ""\n', "tables.orders.norm", "empty"),
        ('[tables.orders]\nnorm = "   "\n', "tables.orders.norm", "empty"),
        ('[tables.orders]\nnorm = "' + "l1(" * 400 + "o_total" + ")" * 400 + '"\n', "tables.orders.norm", "deeper"),
        ('[tables.orders]\nnorm = "' + "(" * 5000 + '"\n', "tables.orders.norm", "deeper"),
        ('[tables.orders]\nnorm = "lp(1e9, o_total)"\n', "tables.orders.norm", "P ≤ 64"),
        ('[tables.orders]\nnorm = "l99999999999999(o_total)"\n', "tables.orders.norm", "unknown norm"),
        ('[tables.orders]\nnorm = "l1(o_total"\n', "tables.orders.norm", "cannot parse"),
        ("[tables.orders.columns.o_prio]\nunit = ['day']\n", "tables.orders.columns.o_prio.unit", "must be one of"),
        ("[tables.orders.columns.o_prio]\ndomain = [['a'], ['b']]\n", "tables.orders.columns.o_prio.domain", "scalar"),
        ("[tables.orders.columns.o_id]\ndomain = [0, 1, 1, 1, 2]\n", "tables.orders.columns.o_id.domain", "twice"),
        ("[tables.orders.columns.o_total]\ndomain = [nan, 1.0]\n", "tables.orders.columns.o_total.domain", "NaN"),
        ("[tables.orders.columns.o_total]\ndomain = [inf]\n", "tables.orders.columns.o_total.domain", "NaN and ∞"),
        # against the catalog: the values' type, and CHAR(n)'s blank padding
        ("[tables.orders.columns.o_id]\ndomain = ['1', '2']\n", "tables.orders.columns.o_id.domain", "INT"),
        ("[tables.orders.columns.o_id]\ndomain = [1, 2.5]\n", "tables.orders.columns.o_id.domain", "not an integer"),
        ("[tables.orders.columns.o_prio]\ndomain = [1, 2]\n", "tables.orders.columns.o_prio.domain", "VARCHAR"),
        ("[tables.orders.columns.o_flag]\ndomain = [1, 0]\n", "tables.orders.columns.o_flag.domain", "BOOLEAN"),
        ("[tables.orders.columns.o_date]\ndomain = ['soon']\n", "tables.orders.columns.o_date.domain", "ISO date"),
        ("[tables.orders.columns.o_status]\ndomain = ['F', 'F ']\n", "tables.orders.columns.o_status.domain", "one"),
    ],
)
def test_bad_policies_are_one_line_errors_naming_the_key(text: str, where: str, problem: str) -> None:
    with pytest.raises(PolicyError, match=problem) as err:
        _load(text)
    assert err.value.where == f"p.toml: {where}"
    assert "\n" not in str(err.value)


def test_a_case_variant_name_resolves_to_the_catalog_table() -> None:
    """PostgreSQL folds ORDERS to orders: the policy applies to the catalog's orders, columns too."""
    policy = _load('[tables.ORDERS]\nrows = "public"\n[tables.ORDERS.columns.O_Prio]\ndomain = ["a", "a "]\n')
    assert policy.table("orders").public and policy.table("Orders").public
    assert policy.table("orders").column("o_prio").domain == ("a", "a ")  # VARCHAR: two groups in PostgreSQL


def test_accepted_values_round_trip() -> None:
    policy = _load(
        '[tables.orders]\nweight = 1e-6\nnorm = "lp(3, 1e6*o_total, linf(o_date, 0.5*o_id))"\n'
        "[tables.orders.columns.o_date]\ndomain = [1992-01-01, 1992-01-02]\nrange = ['1992-01-01', '1998-12-31']\n"
        "[tables.orders.columns.o_total]\ndomain = [1, 2.5]\n"
    )
    t = policy.table("orders")
    assert t.weight == 1e-6 and str(t.norm) == "lp(3, 1e+06*o_total, linf(o_date, 0.5*o_id))"
    assert t.column("o_total").domain == (1, 2.5)


def test_norm_of_large_values_does_not_overflow() -> None:
    """x**p of a large change used to raise OverflowError; the norm is computed scaled by its largest term."""
    norm = _load('[tables.orders]\nnorm = "lp(64, o_total, o_id)"\n').table("orders").norm
    assert norm is not None
    assert norm.evaluate({"o_total": 1e300, "o_id": 1e300}) == pytest.approx(1e300 * 2 ** (1 / 64))
    assert norm.evaluate({"o_total": 3.0, "o_id": 4.0}) == pytest.approx((3**64 + 4**64) ** (1 / 64))


@pytest.mark.parametrize(
    ("text", "where", "problem"),
    [
        ("[proxy]\nlisten = 6543\n", "proxy.listen", "HOST:PORT"),
        ('[proxy]\nlisten = "h:²"\n', "proxy.listen", "HOST:PORT"),
        ('[analysts.a]\nverifier = "x"\nepsilon_limit = 1\n', "analysts.a.verifier", "not a SCRAM-SHA-256"),
        (
            '[analysts.a]\nverifier = "SCRAM-SHA-256$4096:!!$a:b"\nepsilon_limit = 1\n',
            "analysts.a.verifier",
            "not base64",
        ),
        ("[analysts.a]\nverifier = 'V'\nepsilon_limit = 1\ndelta = 1.5\n", "analysts.a.delta", "< 1"),
        ("[analysts.a]\nverifier = 'V'\nepsilon_limit = 1\nconfidence = 2\n", "analysts.a.confidence", "< 1"),
        # a Laplace analyst without δ loaded, then every private query failed naming --delta
        (
            "[analysts.a]\nverifier = 'V'\nepsilon_limit = 1\nmechanism = 'laplace'\n",
            "analysts.a.mechanism",
            r"needs a δ per query, which this analyst cannot pass: set delta here or in \[defaults\]",
        ),
        (
            "[defaults]\nmechanism = 'laplace'\n[analysts.a]\nverifier = 'V'\nepsilon_limit = 1\n",
            "analysts.a",
            r"\[defaults\] mechanism = 'laplace' gives \(ε, δ\)-DP",
        ),
    ],
)
def test_proxy_sections_are_one_line_errors_naming_the_key(text: str, where: str, problem: str) -> None:
    """int listen raised AttributeError, '²' ValueError; a bad verifier's error lost its key."""
    from sqldp.proxy import config
    from sqldp.proxy.scram import make_verifier

    text = text.replace("'V'", repr(str(make_verifier("pw"))))
    with pytest.raises(PolicyError, match=problem) as err:
        config.load(Policy.from_toml(text, source="p.toml"))
    assert err.value.where == f"p.toml: {where}"


@pytest.mark.parametrize(
    "text",
    [
        "[analysts.a]\nverifier = 'V'\nepsilon_limit = 1\nmechanism = 'laplace'\ndelta = 1e-6\n",
        "[defaults]\ndelta = 1e-6\n[analysts.a]\nverifier = 'V'\nepsilon_limit = 1\nmechanism = 'laplace'\n",
        "[defaults]\nmechanism = 'laplace'\n[analysts.a]\nverifier = 'V'\nepsilon_limit = 1\nmechanism = 'cauchy'\n",
    ],
)
def test_a_laplace_analyst_with_a_delta_from_the_policy_loads(text: str) -> None:
    from sqldp.proxy import config
    from sqldp.proxy.scram import make_verifier

    text = text.replace("'V'", repr(str(make_verifier("pw"))))
    assert "a" in config.load(Policy.from_toml(text, source="p.toml")).analysts


@pytest.mark.parametrize(
    ("knowledge", "where", "problem"),
    [
        # 1e308 + 1e308 = ∞ normalised every weight to 0
        ("{ kind = 'set_prior', values = [1, 2], weights = [1e308, 1e308] }", "weights", "finite"),
        ("{ kind = 'range_prior', pieces = [[0, 1, 1e308], [1, 2, 1e308]] }", "pieces[0]", "finite"),
        # NaN ≠ NaN passed the distinctness check
        ("{ kind = 'set_uniform', values = [nan, nan] }", "values", "finite"),
        ("{ kind = 'normal', mu = 1e308, sigma = 1 }", "mu", "finite"),
    ],
)
def test_bad_priors_are_refused(knowledge: str, where: str, problem: str) -> None:
    with pytest.raises(PolicyError, match=problem) as err:
        _load(f"[tables.orders.columns.o_total]\nknowledge = {knowledge}\n")
    assert err.value.where == f"p.toml: tables.orders.columns.o_total.knowledge.{where}"


@pytest.mark.parametrize(
    ("goal", "where", "problem"),
    [
        ('attributes = { "orders.o_total" = 1, "ORDERS.O_Total" = 2 }', "attributes.ORDERS.O_Total", "given already"),
        ('attributes = { "orders.nope" = 1 }', "attributes.orders.nope", "not in table"),
        ('attributes = { "nope.o_total" = 1 }', "attributes.nope.o_total", "not in the schema"),
        ('membership = "nope"', "membership", "not in the schema"),
    ],
)
def test_goals_name_existing_columns_once(goal: str, where: str, problem: str) -> None:
    with pytest.raises(PolicyError, match=problem) as err:
        _load(f"[defaults]\nadvantage = 0.1\n[[goals]]\n{goal}\n")
    assert err.value.where == f"p.toml: goals[0].{where}"


def test_a_quoted_mixed_case_catalog_table_resolves() -> None:
    """A table created as "Orders" is in a live catalog as Orders; the policy's orders resolves to it (and
    its columns), and two catalog names equal in lower case are ambiguous."""
    from sqldp.catalog import Column, Table

    cols = {"O_Total": Column("O_Total", "NUMERIC", "numeric")}
    one = Catalog({"Orders": Table("Orders", cols)}, "db")
    policy = Policy.from_toml("[tables.ORDERS.columns.o_total]\ndomain = [1, 2]\n", source="p.toml")
    policy.validate(one)
    assert policy.table("Orders").column("O_Total").domain == (1, 2)
    two = Catalog({"Orders": Table("Orders", cols), "ORDERS": Table("ORDERS", cols)}, "db")
    with pytest.raises(PolicyError, match="rename one"):
        policy.validate(two)


def test_a_nul_in_a_domain_value_is_refused() -> None:
    with pytest.raises(PolicyError, match="NUL"):
        _load('[tables.orders.columns.o_prio]\ndomain = ["a\\u0000b"]\n')


@pytest.mark.parametrize(
    ("text", "where", "key"),
    [
        ("typo = 1\n", "p.toml", "typo"),
        ("[defaults]\nepsilom = 1\n", "p.toml: defaults", "epsilom"),
        ("[tables.orders]\nweigth = 5\n", "p.toml: tables.orders", "weigth"),
        ("[tables.orders.columns.o_total]\nrnage = [0, 1]\n", "p.toml: tables.orders.columns.o_total", "rnage"),
        (
            "[tables.orders.columns.o_total]\nknowledge = { kind = 'unknown', lo = 1 }\n",
            "p.toml: tables.orders.columns.o_total.knowledge",
            "lo",
        ),
        ("[[goals]]\nmembership = 'orders'\nprior_ = 0.5\n", "p.toml: goals[0]", "prior_"),
        ("[proxy]\nlistne = 'h:1'\n", "p.toml: proxy", "listne"),
        ("[analysts.a]\nverifier = 'x'\nepsilon_limit = 1\nepsilon_limt = 2\n", "p.toml: analysts.a", "epsilon_limt"),
    ],
)
def test_every_section_names_an_unknown_key_alike(text: str, where: str, key: str) -> None:
    """One key checker (sqldp.policy.keys) for every table of the file: the table's location, the key and
    the keys allowed there."""
    from sqldp.proxy import config

    with pytest.raises(PolicyError) as err:
        config.load(Policy.from_toml(text, source="p.toml"))
    assert err.value.where == where
    assert err.value.message.startswith(f"unknown key {key!r}") and "(allowed: " in err.value.message


def test_an_analyst_without_a_budget_names_the_missing_key() -> None:
    from sqldp.proxy import config

    with pytest.raises(PolicyError) as err:
        config.load(Policy.from_toml("[analysts.a]\nverifier = 'x'\n", source="p.toml"))
    assert str(err.value) == "p.toml: analysts.a: missing key 'epsilon_limit' (required: epsilon_limit)"


def test_the_key_checker() -> None:
    from sqldp.policy import check_keys

    assert check_keys({"a": 1}, {"a", "b"}, {"a"}, "f") == {"a": 1}
    with pytest.raises(PolicyError) as err:
        check_keys({"d": 1, "c": 2}, {"b", "a"}, (), "f: t")  # the first in sorted order
    assert str(err.value) == "f: t: unknown key 'c' (allowed: a, b)"
    with pytest.raises(PolicyError) as err:
        check_keys({"x": 1}, (), (), "f", what="kind 'unknown'")
    assert str(err.value) == "f: unknown key 'x' for kind 'unknown' (allowed: none)"
    with pytest.raises(PolicyError) as err:
        check_keys({"a": 1}, {"a", "b"}, {"b", "a"}, "f")
    assert str(err.value) == "f: missing key 'b' (required: a, b)"
    with pytest.raises(PolicyError) as err:
        check_keys([1], {"a"}, (), "f")
    assert str(err.value) == "f: must be a TOML table"
