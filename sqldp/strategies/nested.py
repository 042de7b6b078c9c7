"""Nested aggregation: the histogram of per-key counts (TPC-H Q13), with the LEFT OUTER JOIN it needs.

The shape, as analysts write it::

    SELECT c_count, COUNT(*) FROM (
        SELECT a.k, COUNT(b.x) FROM A a LEFT OUTER JOIN B b ON a.k = b.f AND <conditions on b>
        [WHERE <conditions on a>] GROUP BY a.k
    ) AS d (k, c_count)
    GROUP BY c_count

(or the same with an inner join). The inner query gives every key group of A one count; the outer query
counts the groups per count ("how many customers have n orders"). NR §4.3.6.1 rewrites Q13 by hand ((ix): the
outer join as the inner join plus the unmatched rows); here the two levels are analysed together, as one
function of the database, and its ℓ1 sensitivity is data-independent:

**Lemma.** Adding or removing one row of A or B changes the histogram by at most 2 in ℓ1 (1 per unit of
the row's distance: 2/G for a table of weight G, NR §3.3.7).

*Proof.* Every inner group is the set of A rows with one value of a.k together with the B rows they match;
a row of B matches only the group whose key equals its b.f (the join is ``a.k = b.f``, and its other
conditions read b alone), and a row of A belongs to its own key's group. So a neighbouring change alters one
inner group at most: the group's count moves from one bucket to another (−1 in one, +1 in the other: ℓ1 2),
or the group appears or disappears (±1 in one bucket). Removing an A row whose key has no other A row drops
its group, and with it the B rows it matched (they meet no other group: they leave the answer, they do not
move). Value changes: every column the query reads must be outside the policy's norms (checked), so a value
neighbour does not change the answer at all. □

In the unmatched part of the outer join (NR §4.3.6.1 (ix)) a group with no matching B row counts 0 (COUNT of
the NULL-extended row's b.x) or 1 (COUNT(*)); it is one inner group like the others, which is why the LEFT
JOIN needs no term of its own here.

The histogram's keys (the counts) are private values without a declared domain. They are released

* with **DP partition selection** when δ > 0 is allowed (the COUNT(*) of each bucket present in the data, with
  Laplace noise at c/ε, c = 2/G, released only above :func:`sqldp.release.selection_threshold` τ = 1 +
  (c/ε)·ln(1/(2δ)); a neighbouring change makes at most one bucket appear or vanish on each side, with count 1
  there at any weight G, so it passes with probability ½·e^{−(τ−1)ε/c} = δ — Korolova, Kenthapadi, Mishra,
  Ntoulas, "Releasing search queries and clicks privately", WWW 2009; Wilson et al., "Differentially private SQL
  with bounded user contribution", PoPETs 2020), or
* over the **domain 0 … τ** when the policy declares ``max_rows_per = { f = τ }`` on B (docs/truncation.md):
  B is read truncated to τ rows per f, so a group of one A row counts at most τ; a neighbouring change of B
  is then one row in and one out of the same f, i.e. of the same inner group: still ℓ1 ≤ 2. Every bucket
  0 … τ is released with Laplace noise (a count above τ — several A rows sharing a key — is outside the
  domain and never released), pure ε;
* else refused, naming both ways out.

**One table** (``SELECT n, COUNT(*) FROM (SELECT a.k, COUNT(*) AS n FROM A a [WHERE ψ(a)] GROUP BY a.k) d GROUP BY
n``): the lemma with B = A. A row of A belongs to its own key's group only and moves its count by one, so ℓ1 ≤ 2
again; under ``max_rows_per = { k = τ }`` on A every group counts 1 … τ (it has a row), the domain released.

**Aggregates of per-key aggregates** (:func:`flatten`: an outer query without GROUP BY over ``d = SELECT k,
COUNT(x) AS n, SUM(y) AS s FROM … GROUP BY k``). On every database SUM(n) = COUNT(x) and SUM(s) = SUM(y) over d's
FROM/WHERE (the groups partition the rows; both NULL over no row), COUNT(*) = COUNT(n) = COUNT(DISTINCT k) when
k is a column declared NOT NULL (one row of d per key value), and AVG(n) = COUNT(x)/COUNT(DISTINCT k). The query is
written as that flat query and analysed as any other; nothing here bounds it.

Pure: no database. :func:`sqldp.per_key.histogram` recognises the shape (on the front end's algebra) and builds the
analysis form; :func:`compile_histogram` builds its plan, domain and SQL, a part of the aggregate strategy
(:mod:`sqldp.strategies.aggregate`).
"""

from __future__ import annotations

import dataclasses

from sqlglot import exp

from sqldp.catalog import Catalog
from sqldp.engine import Dialect
from sqldp.form import BUCKET, AnalysisForm
from sqldp.groups import KeyDomain
from sqldp.params import PrivacyParams
from sqldp.per_key import refuse
from sqldp.policy import Policy
from sqldp.policy.tables import resolve_name
from sqldp.rewrite import Statements, rewrite
from sqldp.sensitivity.global_bound import GlobalPlan, Truncation
from sqldp.sensitivity.plan import Plan

# the lemma's bound: one row changes the histogram by at most this much in ℓ1 (a key group leaves one count for
# another); tests/release/test_nested_histogram.py runs the mutant with 1 and sees the privacy loss exceed ε
L1_CHANGE = 2.0


def compile_histogram(
    form: AnalysisForm,
    catalog: Catalog,
    policy: Policy,
    params: PrivacyParams,
    dialect: Dialect,
) -> tuple[AnalysisForm, tuple[KeyDomain, ...], tuple[Plan, ...], Statements]:
    """The plan (a global ℓ1 bound, the module's lemma), the bucket domain (partition selection, or 0 … τ
    under a declared contribution bound) and the SQL of a histogram of per-key counts; refused when neither
    release of the buckets applies. Decided from the query, the policy and the privacy parameters only."""
    shape = form.nested
    assert shape is not None
    weights = [policy.table(u.table).weight for u in form.uses if not policy.table(u.table).public]
    bound = L1_CHANGE / min(weights)
    terms = {
        u.table: {
            "sensitivity": L1_CHANGE / policy.table(u.table).weight,
            "weight": policy.table(u.table).weight,
            "method": "sqldp.strategies.nested (ℓ1 ≤ 2 per row)",
        }
        for u in form.uses
        if not policy.table(u.table).public
    }
    truncations: tuple[Truncation, ...] = ()
    if params.delta:
        form = dataclasses.replace(form, select_by=0)
        domains = (KeyDomain(None, None, private=True),)
    else:
        counted = catalog.table(shape.counted.table)
        tau = None
        for declared, t in policy.table(shape.counted.table).max_rows_per.items():
            if resolve_name(declared, counted.columns, f"tables.{counted.name}.max_rows_per") == shape.foreign:
                tau = t
        if tau is None or policy.table(shape.counted.table).public:
            raise refuse(
                f"the counts are private values with no declared domain: allow δ > 0 (--mechanism laplace --delta "
                f"D) for DP partition selection of the counts present, or declare a contribution bound "
                f"(tables.{shape.counted.table}.max_rows_per = {{ {shape.foreign} = τ }}) for the domain 0 … τ"
            )
        truncations = (Truncation(shape.counted.table, shape.foreign, tau),)
        # a key group of one table has a row, so COUNT(*) is at least 1 there; through a join (or COUNT(x) of a
        # column that may be NULL) a group may count 0
        low = 1 if not shape.joined and shape.count_arg is None else 0
        domains = (KeyDomain(tuple(range(low, tau + 1)), None),)
        form = dataclasses.replace(
            form, notes=(*form.notes, f"counts released over {low} … {tau}: {truncations[0]} (declared max_rows_per)")
        )
    if not dialect.histogram_partition_selection and params.delta:  # after the refusals not of the engine
        # the domain 0 … τ runs on Spark (the truncation keeps PostgreSQL's rows, sqldp.rewrite.total_order);
        # partition selection of the counts present has not been compared with PostgreSQL there
        raise refuse("DP partition selection of the counts runs on PostgreSQL only (declare max_rows_per for Spark)")
    # a bucket that exists on one side only holds one inner group (the lemma): its count is 1 at any weight
    plan = GlobalPlan(form, form.aggregates[0], bound, terms, truncations=truncations, one_sided=1.0)
    derived = exp.Subquery(this=shape.inner(), alias=exp.TableAlias(this=exp.to_identifier(shape.alias)))
    bucket = exp.column(BUCKET, table=shape.alias)
    answer = (
        exp.select(exp.alias_(bucket.copy(), "__key0"), exp.alias_(exp.Count(this=exp.Star()), "__agg0"))
        .from_(derived)
        .group_by(bucket)
    )
    statements = rewrite(form, answer, (plan,), domains, catalog, policy, dialect)
    return form, domains, (plan,), statements
