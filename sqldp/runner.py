"""The runner: the only module that talks to the database (pipeline step 5 of 5, README "Layout").

It parses and normalises a query, asks the analyses for their plan, runs the answer query and the
sensitivity queries in one read-only REPEATABLE READ transaction (so the answer and its sensitivity see the
same snapshot), calibrates and samples the noise, and returns a :class:`Result`. The CLI, the library API
(:func:`sqldp.connect`) and the proxy all come through here.

Composition (NR §3.3.10.4): the k aggregates of a query are k measurements and share ε and δ equally
(sequential composition). The groups of a GROUP BY are answered with the full share when every private
table's row can touch at most one group (parallel composition, disjoint groups) and with share/m otherwise.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import psycopg.sql
from sqlglot import exp

from sqldp import db, mechanisms, sensitivity
from sqldp.catalog import Catalog
from sqldp.db import connect, resolve_dsn
from sqldp.errors import BudgetExhaustedError, CatalogError, DatabaseError, InputError, RefusedError
from sqldp.form import AGG_PREFIX, AnalysisForm, ColumnRef, Output
from sqldp.frontend import parse, too_deep
from sqldp.groups import all_groups, key_domains, match_groups
from sqldp.mechanisms import NoiseSource
from sqldp.normalize import PublicRelease, normalize
from sqldp.policy import Policy
from sqldp.sensitivity.intervals import domain
from sqldp.sqlgen import answer_query, widen_integers

# below this (seconds), a query's answer and sensitivity queries are pipelined on one connection
SERIAL_BELOW = 0.02
IDLE_CONNECTIONS = 2  # kept open per session: the answer's and the sensitivity queries'
PREPARED_CACHE = 256  # analysed queries kept per session
# Session connections are autocommit and read-only by default: a single statement is its own transaction (one
# round trip; explicit BEGIN/COMMIT cost ≈ 0.5 ms, as much as a small query), several share one snapshot
# between BEGIN and COMMIT. COMMIT, not ROLLBACK, ends them: the same for a read-only transaction, but psycopg
# forgets the connection's prepared statements on ROLLBACK, and re-planning the analysis queries costs more
# than running them when the plain query takes a millisecond.
READ_ONLY = "SET default_transaction_read_only = on"
NO_TIMEOUT = "SET statement_timeout = 0"
BEGIN = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"


def configure(conn: psycopg.Connection) -> None:
    """Set up a connection the session reads through (autocommit): read only, and statements prepared from
    their first run, since an analysed query runs the same SQL texts every time (the session caches them).
    No statement timeout, whatever the server or role sets: how long a statement runs depends on the data, so
    a timeout that cancels it would answer for the data without noise (README, "Errors are answers")."""
    conn.execute(READ_ONLY)
    conn.execute(NO_TIMEOUT)
    conn.prepare_threshold = 0


@dataclass(frozen=True)
class PrivacyParams:
    epsilon: float
    delta: float | None
    beta: float | None  # None: chosen per answer to minimise noise (Theorem 3.73)
    mechanism: str
    confidence: float
    advantage: float | None = None
    epsilon_source: str = "epsilon"
    # where a refusal about β points: the flag or the policy key the user set it with (None: chosen by sqldp)
    beta_where: str | None = None

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        del out["beta_where"]
        return out


def resolve_params(
    policy: Policy,
    *,
    epsilon: float | None = None,
    delta: float | None = None,
    beta: float | None = None,
    mechanism: str | None = None,
    confidence: float | None = None,
    advantage: float | None = None,
    outputs: int = 1,
) -> PrivacyParams:
    """Explicit arguments win over the policy's ``[defaults]``; ε may come from an advantage target."""
    d = policy.defaults
    mech = mechanism or d.mechanism
    if mech not in ("cauchy", "laplace"):
        raise InputError(f"mechanism must be 'cauchy' or 'laplace', got {mech!r}", where="--mechanism")
    conf = confidence if confidence is not None else d.confidence
    if not 0 < conf < 1:
        raise InputError(f"confidence must be in (0, 1), got {conf}", where="--confidence")
    if epsilon is not None and advantage is not None:
        raise InputError("give either --epsilon or --advantage, not both", where="--advantage")
    source = "epsilon"
    if epsilon is None and advantage is None:
        epsilon, advantage = d.epsilon, None if d.epsilon is not None else d.advantage
    if epsilon is None and advantage is not None:
        from sqldp.advantage import epsilon_from_policy

        epsilon = epsilon_from_policy(policy, advantage, outputs=outputs)
        source = "advantage"
    if epsilon is None:
        raise InputError("no privacy level: pass --epsilon or --advantage, or set defaults.epsilon in the policy")
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise InputError(f"epsilon must be a positive number, got {epsilon}", where="--epsilon")
    if epsilon > MAX_EPSILON:
        raise InputError(
            f"ε = {epsilon:g} bounds the odds of any inference only by e^{epsilon:g}, which protects nothing; "
            f"sqldp accepts ε ≤ {MAX_EPSILON:g} per query",
            where="--epsilon",
        )
    dlt = delta if delta is not None else d.delta
    if mech == "laplace" and not dlt:
        raise InputError("the Laplace mechanism gives (ε, δ)-DP: pass --delta (NR Thm 3.56)", where="--delta")
    if dlt is not None and not 0 < dlt < 1:
        raise InputError(f"delta must be in (0, 1), got {dlt}", where="--delta")
    b = beta if beta is not None else d.beta
    # a refusal names only what the user set: the flag, else the policy key, else nothing
    beta_where = "--beta" if beta is not None else "defaults.beta" if d.beta is not None else None
    if b is not None and b < 0:
        raise InputError(f"beta must be ≥ 0, got {b}", where=beta_where)
    return PrivacyParams(epsilon, dlt if mech == "laplace" else None, b, mech, conf, advantage, source, beta_where)


MAX_EPSILON = 100.0  # e^100 ≈ 2.7e43: beyond it a "private" answer is the exact one in all but name


def check_beta(params: PrivacyParams, shares: Sequence[tuple[float, float | None]]) -> None:
    """Refuse a fixed β that no noise level can match at some measurement's ε (and δ) share — before anything
    is read or charged (the proxy charges between prepare and run). NR Theorem 3.53 (generalized Cauchy) needs
    β < ε/(γ + 1); Theorem 3.56 (Laplace) needs β < ε/(ε − 1 − ln(δ/2)). A β chosen by sqldp (Theorem 3.73)
    is taken from a grid inside the feasible interval and needs no check."""
    if params.beta is None:
        return
    for eps, delta in shares:
        try:
            if params.mechanism == "laplace":
                mechanisms.laplace_b(eps, delta or 0.0, params.beta)
            else:
                mechanisms.cauchy_b(eps, params.beta)
        except InputError as err:
            raise InputError(err.message, where=params.beta_where) from None


@dataclass
class Measurement:
    """One aggregate (for one group): its sensitivity, the calibrated noise and, for ``run``, the value."""

    aggregate: str
    epsilon: float
    delta: float | None
    beta: float
    sensitivity: float
    noise_scale: float
    half_width: float
    terms: Mapping[str, Any] = field(repr=False)  # the analysis' per-table terms, as bound
    # "laplace-global" when the plan's bound is data-independent (see _calibrate), else the policy's mechanism;
    # it depends on the query and the policy only, so it is released
    mechanism: str = "cauchy"
    true_value: float | None = None  # never released; kept out of every serialisation
    noisy_value: float | None = None

    @functools.cached_property
    def tables(self) -> dict[str, Any]:
        """Per table, what contributed to the sensitivity, JSON-ready. Built when first read: converting the
        terms cost a small query's noisy run a third of its time, and most runs never read them."""
        return {t: _jsonable(term) for t, term in self.terms.items()}

    def to_json(self, *, audit: bool = False) -> dict[str, Any]:
        """Without ``audit`` only what the query, the policy and the noise decide (see README, "What each
        output field reveals"): the aggregate, its ε and δ share and the noisy value."""
        if not audit:
            out = {k: getattr(self, k) for k in _RELEASED}
            if self.mechanism == GLOBAL:
                # a global bound is a function of the query, the policy and public data: so are its noise
                # scale and error bar, which the analyst may see
                out["noise_scale"], out["half_width"] = self.noise_scale, self.half_width
            return out
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in _UNSERIALISED}
        out["tables"] = self.tables
        return out


_UNSERIALISED = frozenset({"terms", "true_value"})
# data-independent (ε and δ shares depend on the query, the policy and the public group domains only; the
# mechanism on the query and the policy) or noisy
_RELEASED = ("aggregate", "epsilon", "delta", "mechanism", "noisy_value")
AUDIT_WARNING = (
    "AUDIT MODE: the sensitivities, noise scales, error bars, β and per-table figures below are computed from "
    "the private data without noise; they are for the data owner and must not be handed to analysts"
)


@dataclass
class Result:
    sql: str
    params: PrivacyParams | None
    public: bool = False
    test_mode: bool = False
    columns: list[str] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)
    measurements: list[list[Measurement]] = field(default_factory=list)  # [group][aggregate]
    released: bool = False
    timings: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    grouped: bool = False
    # data-owner mode: to_json carries the data-dependent figures too (marked "audit": true). The Python
    # attributes are always there: whoever holds a Session holds the database connection anyway; what an
    # analyst may see is the serialisation (the CLI's output, JSON handed on, the proxy's result set).
    audit: bool = False
    plan: list[dict[str, Any]] = field(default_factory=list)  # analyze without audit: nothing read

    @property
    def answer(self) -> Any:
        """The single noisy value of an ungrouped, single-output query."""
        if self.grouped or not self.rows:
            return None
        values = [v for k, v in self.rows[0]["values"].items()]
        return values[0] if len(values) == 1 else None

    def table(self) -> tuple[list[str], list[tuple[Any, ...]]]:
        """The released answer as a result set: column names and rows in output order (for the proxy)."""
        if not self.released:
            raise RefusedError("nothing was released (analyze does not answer)")
        if self.public:
            return self.columns, [tuple(r[c] for c in self.columns) for r in self.rows]
        out = []
        for r in self.rows:
            merged = {**r.get("key", {}), **r["values"]}
            out.append(tuple(merged[c] for c in self.columns))
        return self.columns, out

    def _main(self) -> Measurement | None:
        return max((m for group in self.measurements for m in group), key=lambda m: m.noise_scale, default=None)

    def to_json(self, *, audit: bool | None = None) -> dict[str, Any]:
        """The result as JSON. Without audit (the default unless the result was made in audit mode): the noisy
        answer and the data-independent figures only — ε, δ, the mechanism, β when the user fixed it, the
        per-aggregate ε/δ shares. The sensitivity, noise scale, error bar, chosen β (NR Theorem 3.73),
        per-table terms and timings are functions of the private data released without noise, so they
        appear only in audit mode (README, "What each output field reveals")."""
        audit = self.audit if audit is None else audit
        p = self.params
        out: dict[str, Any] = {
            "query": self.sql,
            "audit": audit,
            "public": self.public,
            "test_mode": self.test_mode,
            "epsilon": p.epsilon if p else 0.0,
            "delta": p.delta if p else None,
            "beta": p.beta if p else None,  # as given; None: chosen per answer, shown in audit mode only
            "mechanism": self._mechanism(),
            "confidence": p.confidence if p else None,  # of the error bars, where they are shown
            "epsilon_from": p.epsilon_source if p else None,
            "advantage": p.advantage if p else None,
            "measurements": [[m.to_json(audit=audit) for m in group] for group in self.measurements],
            "notes": self.notes,
        }
        if self.plan:
            out["plan"] = self.plan
        if audit:
            main = self._main()
            out.update(
                {
                    "warning": AUDIT_WARNING,
                    "beta": main.beta if main else out["beta"],
                    "sensitivity": main.sensitivity if main else 0.0,
                    "noise_scale": main.noise_scale if main else 0.0,
                    "error": self._error(main),
                    "tables": dict(main.tables) if main else {},
                    "timings_ms": {k: round(v * 1000, 3) for k, v in self.timings.items()},
                }
            )
        if self.released:
            if self.grouped or self.public:
                out["rows"] = self.rows
            else:
                out["answer"] = self.answer
                out["values"] = self.rows[0]["values"] if self.rows else {}
        return out

    def _mechanism(self) -> str | None:
        """The mechanism the measurements used (data-independent: it follows from the query and the policy),
        the policy's when nothing was measured."""
        used = sorted({m.mechanism for group in self.measurements for m in group})
        if used:
            return ", ".join(used)
        return self.params.mechanism if self.params else None

    def _error(self, main: Measurement | None) -> dict[str, Any]:
        conf = self.params.confidence if self.params else None
        if main is None:
            return {"confidence": conf, "absolute": 0.0, "relative": 0.0}
        rel = None
        if main.noisy_value not in (None, 0):
            rel = main.half_width / abs(main.noisy_value)  # type: ignore[arg-type]
        return {"confidence": conf, "absolute": main.half_width, "relative": rel}


def _evaluate(e: exp.Expression, values: Sequence[float | None]) -> float | None:
    """Evaluate an output expression over (noisy) aggregate values: + − × /, GREATEST/LEAST and constants."""
    if isinstance(e, exp.Column) and e.name.startswith(AGG_PREFIX):
        return values[int(e.name[len(AGG_PREFIX) :])]
    if isinstance(e, exp.Literal) and not e.is_string:
        return float(e.this)
    if isinstance(e, exp.Paren):
        return _evaluate(e.this, values)
    if isinstance(e, exp.Neg):
        v = _evaluate(e.this, values)
        return None if v is None else -v
    if isinstance(e, exp.Cast):
        return _evaluate(e.this, values)
    if isinstance(e, (exp.Greatest, exp.Least)):  # the clamp of a centred AVG (sqldp.normalize)
        args = [_evaluate(a, values) for a in (e.this, *e.expressions)]
        if any(a is None for a in args):
            return None
        return max(args) if isinstance(e, exp.Greatest) else min(args)  # type: ignore[type-var]
    if isinstance(e, (exp.Add, exp.Sub, exp.Mul, exp.Div)):
        a, b = _evaluate(e.this, values), _evaluate(e.expression, values)
        if a is None or b is None:
            return None
        if isinstance(e, exp.Add):
            return a + b
        if isinstance(e, exp.Sub):
            return a - b
        if isinstance(e, exp.Mul):
            return a * b
        return a / b if b != 0 else None
    raise RefusedError(f"output expression {e.sql(dialect='postgres')} is not supported after aggregation")


_COMPARE: dict[type, Callable[[float, float], bool]] = {
    exp.EQ: lambda a, b: a == b,
    exp.NEQ: lambda a, b: a != b,
    exp.LT: lambda a, b: a < b,
    exp.LTE: lambda a, b: a <= b,
    exp.GT: lambda a, b: a > b,
    exp.GTE: lambda a, b: a >= b,
}


def _holds(e: exp.Expression, values: Sequence[float | None]) -> bool | None:
    """A HAVING condition over (noisy) aggregate values, with SQL's three-valued AND/OR/NOT."""
    if isinstance(e, exp.Paren):
        return _holds(e.this, values)
    if isinstance(e, exp.Boolean):
        return bool(e.this)
    if isinstance(e, exp.Not):
        inner = _holds(e.this, values)
        return None if inner is None else not inner
    if isinstance(e, (exp.And, exp.Or)):
        a, b = _holds(e.this, values), _holds(e.expression, values)
        if isinstance(e, exp.And):
            return False if a is False or b is False else None if a is None or b is None else True
        return True if a is True or b is True else None if a is None or b is None else False
    if type(e) in _COMPARE:
        x, y = _evaluate(e.this, values), _evaluate(e.expression, values)
        return None if x is None or y is None else _COMPARE[type(e)](x, y)
    if isinstance(e, exp.Between):
        x, lo, hi = (_evaluate(e.args[k], values) for k in ("this", "low", "high"))
        return None if x is None or lo is None or hi is None else lo <= x <= hi
    raise RefusedError(f"HAVING condition {e.sql(dialect='postgres')} is not supported after aggregation")


class Session:
    """A connection-level handle: a database, its catalog and a policy."""

    def __init__(
        self,
        dsn: str | None = None,
        policy: Policy | str | Path | None = None,
        *,
        schema: Catalog | str | Path | None = None,
        data_dir: str | Path | None = None,
        seed: int | None = None,
        pool: Any = None,
        analyst_dsn: str | None = None,
        allow_privileged: bool = False,
        budget: float | None = None,
        delta_budget: float | None = None,
    ) -> None:
        # ``dsn`` is the owner's: it reads the catalog and grants; analyst statements run on connections to
        # ``self.analyst_dsn``, a role that may only read the catalog's tables (sqldp.db.analyst_dsn)
        self.dsn = resolve_dsn(dsn, data_dir)
        # optional psycopg_pool.ConnectionPool of autocommit connections set up by ``configure``: the proxy
        # reuses connections because opening one per query costs milliseconds
        self.pool = pool
        self.policy = policy if isinstance(policy, Policy) else Policy.from_file(policy) if policy else Policy()
        with connect(self.dsn) as owner:
            if isinstance(schema, Catalog):
                self.catalog = schema
            elif schema is not None:
                self.catalog = Catalog.from_file(schema)
            else:
                self.catalog = Catalog.from_database(owner)
            self.policy.validate(self.catalog)
            tables = sorted(t.name for t in self.catalog.tables.values())
            self.analyst_dsn, first = db.analyst_dsn(
                self.dsn, tables, explicit=analyst_dsn, allow_privileged=allow_privileged, owner_conn=owner
            )
        configure(first)
        self.noise = NoiseSource.seeded(seed) if seed is not None else NoiseSource()
        # a privacy budget for this session's releases (sequential composition, NR §3.3.10.4): each run is
        # charged its ε (and δ) before anything is read, and refused when the budget does not cover it
        for name, value in (("budget", budget), ("delta_budget", delta_budget)):
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise InputError(f"{name} must be a finite number ≥ 0, got {value!r}", where=name)
        self.budget, self.delta_budget = budget, delta_budget
        self.spent, self.delta_spent = 0.0, 0.0
        # opening a connection costs ≈ 6 ms, more than many plain queries: keep the last few open (the start-up
        # check's connection is the first)
        self._idle: list[psycopg.Connection] = [first]
        self._lock = threading.Lock()
        # prepare() reads no data and depends only on the text, the privacy arguments, the catalog and the
        # policy (fixed for a session), so a repeated query skips parsing and analysis
        self._prepared: OrderedDict[tuple[str, tuple[tuple[str, Any], ...]], Prepared] = OrderedDict()

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection]:
        """An autocommit, read-only connection: from the pool if there is one, else one this session keeps."""
        if self.pool is not None:
            with self.pool.connection() as conn:
                yield conn
            return
        with self._lock:
            conn = self._idle.pop() if self._idle else None
        if conn is None or conn.closed:
            conn = connect(self.analyst_dsn)
            configure(conn)
        try:
            yield conn
        except BaseException:
            conn.close()
            raise
        if conn.closed or conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            conn.close()
            return
        with self._lock:
            if len(self._idle) < IDLE_CONNECTIONS:
                self._idle.append(conn)
                return
        conn.close()

    def _spare_connection(self) -> Any:
        """A second connection for the sensitivity queries, or None when the pool has none free right now (the
        caller then runs them on its own connection; waiting could deadlock a full pool)."""
        if self.pool is None:
            return self.connection()
        from psycopg_pool import PoolTimeout

        try:
            conn = self.pool.getconn(timeout=0.001)
        except PoolTimeout:
            return None
        pool = self.pool

        @contextmanager
        def borrowed() -> Iterator[psycopg.Connection]:
            try:
                yield conn
            finally:
                pool.putconn(conn)

        return borrowed()

    def close(self) -> None:
        """Close the connections this session keeps (a pool given by the caller stays the caller's)."""
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def prepare(self, sql: str, **privacy: Any) -> Prepared:
        """Parse, normalise, plan and resolve the privacy parameters, refusing what cannot be analysed.
        Reads no data: the proxy charges the analyst's budget between this and :meth:`Prepared.run`."""
        t0 = time.perf_counter()
        key = (sql, tuple(sorted(privacy.items())))
        with self._lock:
            cached = self._prepared.get(key)
            if cached is not None:
                self._prepared.move_to_end(key)
        if cached is not None:
            return dataclasses.replace(cached, started=t0)
        try:
            prepared = self._prepare(sql, t0, **privacy)
        except RecursionError:  # the parser bounds depth; this is the last line should an analysis still recurse
            raise too_deep() from None
        with self._lock:
            self._prepared[key] = prepared
            while len(self._prepared) > PREPARED_CACHE:
                self._prepared.popitem(last=False)
        return prepared

    def _prepare(self, sql: str, t0: float, **privacy: Any) -> Prepared:
        parsed = parse(sql, self.catalog)
        form = normalize(parsed, self.catalog, self.policy)
        if isinstance(form, PublicRelease):
            return Prepared(self, sql, form, None, (), (), t0, None)
        params = resolve_params(self.policy, outputs=max(1, len(form.aggregates)), **privacy)
        domains = key_domains(form, self.policy)
        plans = tuple(
            sensitivity.plan(single_aggregate(form, i), self.catalog, self.policy, params.beta)
            for i in range(len(form.aggregates))
        )
        # a value-level plan may move private conjuncts into its aggregate (NR §3.3.8.4, q_m); the aggregates
        # share one answer query, so they must agree on what stays in WHERE
        wheres = [getattr(p, "conjuncts", form.conjuncts) for p in plans]
        if len({tuple(c.sql for c in w) for w in wheres}) > 1:
            raise RefusedError("the aggregates of this query need different continuous filters; ask them one by one")
        answer = answer_query(
            dataclasses.replace(form, aggregates=tuple(p.aggregate for p in plans), conjuncts=wheres[0])
        )
        # every refusal that does not need the data happens here, before the proxy charges: a fixed β too
        # large for a measurement's ε share would otherwise fail at calibration, after the charge. A group
        # count read from a public table at run time is unknown here: those shares are checked again then.
        check_beta(params, _smoothed(_shares(form, params, plans, _declared_groups(domains)), plans))
        return Prepared(self, sql, form, params, plans, domains, t0, answer)

    def analyze(self, sql: str, *, audit: bool = True, **privacy: Any) -> Result:
        """The data owner's analysis: sensitivity and noise scale from the data, nothing released. With
        ``audit=False``, the plan only: nothing is read (what an analyst may see, as ``sqldp analyze``)."""
        prepared = self.prepare(sql, **privacy)
        return prepared.analyze() if audit else prepared.describe()

    def cost(self, sql: str, **privacy: Any) -> tuple[float, float]:
        """What running ``sql`` would spend, (ε, δ), without reading anything (0 for public data): the
        preview of SmartNoise's ``get_privacy_cost``."""
        params = self.prepare(sql, **privacy).params
        return (0.0, 0.0) if params is None else (params.epsilon, params.delta or 0.0)

    @property
    def remaining(self) -> tuple[float | None, float | None]:
        """(ε, δ) left of the session's budget; None where no budget was set."""
        eps = None if self.budget is None else self.budget - self.spent
        delta = None if self.delta_budget is None else self.delta_budget - self.delta_spent
        return eps, delta

    def run(self, sql: str, *, audit: bool = False, **privacy: Any) -> Result:
        """The noisy answer; ``audit=True`` makes its serialisation carry the data-dependent figures too. With a
        session budget the query's (ε, δ) is charged first, and a query the budget does not cover is refused
        before anything is read; a charged query that then fails stays charged (its failure is an answer)."""
        prepared = self.prepare(sql, **privacy)
        if prepared.params is not None:
            self._charge(prepared.params.epsilon, prepared.params.delta or 0.0)
        result = prepared.run()
        result.audit = audit
        return result

    def _charge(self, eps: float, delta: float) -> None:
        with self._lock:
            over_eps = self.budget is not None and self.spent + eps > self.budget * (1 + 1e-12)
            over_delta = self.delta_budget is not None and self.delta_spent + delta > self.delta_budget * (1 + 1e-12)
            if over_eps or over_delta:
                left = self.remaining
                raise BudgetExhaustedError(
                    f"the query costs ε = {eps:g}, δ = {delta:g}; the session's budget has ε = {left[0]}, "
                    f"δ = {left[1]} left (None: no limit)",
                    where="budget",
                )
            self.spent += eps
            self.delta_spent += delta


def _declared_groups(domains: Sequence[Any]) -> int | None:
    """The number of groups when every key's domain is declared in the policy; None when one is read from a
    public table at run time."""
    sizes = [len(d.values) for d in domains if d.values is not None]
    return math.prod(sizes) if len(sizes) == len(domains) else None


def _shares(
    form: AnalysisForm, params: PrivacyParams, plans: Sequence[Any], groups: int | None
) -> list[tuple[float, float | None] | None]:
    """Each aggregate's (ε, δ) share (NR §3.3.10.4): the aggregates split ε and δ equally (sequential
    composition); the groups of a GROUP BY get the full share when a neighbouring change touches one group
    (parallel composition) or when the bound is global (below), else share/m for m groups (None while m is
    unknown).

    A global bound c (``data_independent``) covers the whole histogram in ℓ1: the plan bounds the derivative
    of the ungrouped aggregate, i.e. Σ over the rows a neighbour adds or removes of |e(row)|, and each of those
    rows lands in one group, so Σ_g |Δ_g| ≤ c. Laplace noise at c/ε on every group is then ε-DP for the vector
    (the Laplace mechanism for ℓ1 sensitivity, Dwork et al. TCC 2006), with no split over the groups."""
    out: list[tuple[float, float | None] | None] = []
    for plan in plans:
        whole = not form.group_by or plan.disjoint_groups or _data_independent(plan)
        divisor = 1 if whole else groups
        if divisor is None:
            out.append(None)
            continue
        eps = params.epsilon / len(plans) / divisor
        out.append((eps, params.delta / len(plans) / divisor if params.delta else None))
    return out


@dataclass
class Prepared:
    """A query that passed the analyses, with its privacy parameters; nothing has been read yet."""

    session: Session
    sql: str
    form: AnalysisForm | PublicRelease
    params: PrivacyParams | None  # None: public data, answered exactly
    plans: tuple[Any, ...]  # one sensitivity plan per aggregate (the contract of sqldp.sensitivity)
    domains: tuple[Any, ...]
    started: float
    answer: exp.Select | None  # the answer query (keys and released aggregates); None for public data
    # the SQL texts, generated once here: sqlglot's generator costs milliseconds per run on large bounds
    answer_sql: str = ""
    queries_sql: tuple[str, ...] = ()  # the plans' queries (in plan order) that run on their own
    domains_sql: tuple[str | None, ...] = ()
    # plan query (its index over all plans' queries) → the answer row's columns that hold its one result row
    folded: dict[int, tuple[int, int]] = field(default_factory=dict)
    # how long the queries took last time; shared by the copies the session's cache hands out
    speed: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.answer is not None and not self.answer_sql:
            form: AnalysisForm = self.form  # type: ignore[assignment]
            answer, self.folded = _fold(form, self.answer, self.plans)
            kind_of = domain(form, self.session.catalog, self.session.policy).kind

            def kind(ref: ColumnRef) -> str:
                try:
                    return kind_of(ref)
                except (KeyError, CatalogError):  # an alias or column of the plans' own subqueries
                    return "other"

            def text(e: exp.Expression) -> str:
                # INTEGER overflow would fail the statement on some data: it runs in BIGINT (sqlgen)
                return widen_integers(e, kind).sql(dialect="postgres")

            # group identity is PostgreSQL's '=': each answer row is matched to its group in SQL (sqldp.groups)
            self.answer_sql = text(match_groups(answer, self.domains) if form.group_by else answer)
            every = [q for plan in self.plans for q in plan.queries]
            self.queries_sql = tuple(text(q) for i, q in enumerate(every) if i not in self.folded)
            self.domains_sql = tuple(None if d.values is not None else text(d.ordered) for d in self.domains)

    @property
    def public(self) -> bool:
        return isinstance(self.form, PublicRelease)

    def analyze(self) -> Result:
        """The data owner's analysis (audit mode): reads the data, releases nothing."""
        result = self._execute(release=False)
        result.audit = True
        return result

    def describe(self) -> Result:
        """What ``analyze`` may show an analyst: the plan and the data-independent figures. Reads nothing —
        not even the sensitivity queries, whose outcome (a bound, or a refusal of an unbounded one) depends on
        the data and would leave without noise and without a charge."""
        result = Result(self.sql, self.params, public=self.public, notes=list(getattr(self.form, "notes", [])))
        if isinstance(self.form, PublicRelease) or self.params is None:
            return result
        form = self.form
        shares = _shares(form, self.params, self.plans, _declared_groups(self.domains))
        for agg, plan, share in zip(form.aggregates, self.plans, shares, strict=True):
            parallel = not form.group_by or plan.disjoint_groups
            whole = "full share" if parallel else "full share (ℓ1 over the groups, global bound)"
            result.plan.append(
                {
                    "aggregate": agg.sql,
                    "groups": whole if parallel or _data_independent(plan) else "share divided among the groups",
                    "epsilon": share[0] if share else None,  # None: m is read from a public table at run
                    "delta": share[1] if share else None,
                }
            )
        return result

    def run(self) -> Result:
        return self._execute(release=True)

    def _execute(self, *, release: bool) -> Result:
        if isinstance(self.form, PublicRelease):
            return self._public(self.form, release)
        form, params = self.form, self.params
        assert params is not None and self.answer is not None
        t_plan = time.perf_counter()
        with self.session.connection() as conn:
            try:
                flat, t_answer, t_sens = self._answer_and_sensitivity(conn, list(self.queries_sql))
                answer_rows = flat.pop(0)
                if self.folded:  # one row (no GROUP BY): the answer's aggregates, then the folded queries' items
                    row = answer_rows[0]
                    for i in sorted(self.folded):
                        start, stop = self.folded[i]
                        flat.insert(i, [tuple(row[start:stop])])
                    answer_rows = [row[: len(form.aggregates)]]
                sens_results = []
                for plan in self.plans:
                    sens_results.append(flat[: len(plan.queries)])
                    del flat[: len(plan.queries)]
                domain_values = [
                    d.values if d.values is not None else tuple(r[0] for r in conn.execute(text).fetchall())  # type: ignore[arg-type]
                    for d, text in zip(self.domains, self.domains_sql, strict=True)
                ]
                _end(conn)
            except psycopg.Error as exc:
                raise _database_error(exc) from exc
        result = Result(self.sql, params, test_mode=self.session.noise.test_mode, notes=list(form.notes))
        result.grouped = bool(form.group_by)
        groups = all_groups([tuple(vals) for vals in domain_values]) if form.group_by else [()]
        by_key = _by_group(answer_rows, [len(vals) for vals in domain_values]) if form.group_by else {}
        # NR §3.3.10.4: the aggregates share ε (sequential composition); groups get the full share when a
        # neighbouring change touches one group only (parallel composition), else share/m.
        shares = _shares(form, params, self.plans, len(groups))
        check_beta(params, _smoothed(shares, self.plans))  # the group count is known now
        templates = []
        for i, (plan, results, share) in enumerate(zip(self.plans, sens_results, shares, strict=True)):
            assert share is not None
            eps, delta = share
            cal, bound = _calibrate(plan, results, eps, delta, params)
            templates.append(
                Measurement(
                    aggregate=form.aggregates[i].sql,
                    epsilon=eps,
                    delta=delta,
                    beta=cal.beta,
                    sensitivity=cal.sensitivity,
                    noise_scale=cal.scale,
                    half_width=cal.half_width(params.confidence),
                    terms=bound.tables,
                    mechanism=GLOBAL if _data_independent(plan) else cal.mechanism,
                )
            )
        indices = all_groups([tuple(range(len(vals))) for vals in domain_values]) if form.group_by else [()]
        for g in indices:
            row = by_key.get(g) if form.group_by else (answer_rows[0] if answer_rows else None)
            measured: list[Measurement] = []
            for i, template in enumerate(templates):  # a plan's bound covers every group of the query
                agg = form.aggregates[i]
                m = dataclasses.replace(template)
                if row is not None and row[len(form.group_by) + i] is not None:
                    m.true_value = float(row[len(form.group_by) + i])
                else:
                    # no rows: COUNT and SUM are 0 (SUM of nothing is NULL in SQL, 0 as a function)
                    m.true_value = 0.0 if agg.kind in ("count", "sum") else None
                measured.append(m)
            result.measurements.append(measured)
        if release:
            self._release(form, result, groups)
        result.timings = {
            "analysis": t_plan - self.started,
            "answer_query": t_answer,
            "sensitivity_queries": t_sens,
            "total": time.perf_counter() - self.started,
        }
        return result

    def _answer_and_sensitivity(self, conn: psycopg.Connection, queries: list[str]) -> tuple[list[Any], float, float]:
        """The answer query's rows followed by each sensitivity query's, and how long the answer query and the
        sensitivity queries took, all in one snapshot (NR §4.3.4 ran them separately).

        A lone answer query (everything folded into it, no group domain to read) runs as one statement. Else a
        transaction (BEGIN; the caller ends it with ``_end`` after the domain queries) and two ways, chosen by
        how long the last run of this query took: small queries are pipelined on one connection (one round
        trip for all of them; the fixed cost of a second connection, a thread and a snapshot export would
        dominate); larger ones are shared between this connection and a spare one that imports the snapshot
        (pg_export_snapshot / SET TRANSACTION SNAPSHOT), so the wall time is about the longer half."""
        serial = not queries or self.speed.get("last", 0.0) < SERIAL_BELOW
        spare = None if serial else self.session._spare_connection()
        domains = any(self.domains_sql)
        t0 = time.perf_counter()
        if not queries and not domains:  # one statement: its own snapshot (and no mode to choose next time)
            out = [conn.execute(self.answer_sql).fetchall()]
            elapsed = time.perf_counter() - t0
            return out, elapsed, elapsed
        if spare is None:
            with conn.pipeline():
                conn.execute(BEGIN)
                cursors = [conn.execute(q) for q in (self.answer_sql, *queries)]
                if not domains:
                    conn.execute("COMMIT")  # nothing else to read: end the transaction in the same round trip
            out = [c.fetchall() for c in cursors]
            elapsed = time.perf_counter() - t0
            self.speed["last"] = elapsed
            return out, elapsed, elapsed  # pipelined: they ran together
        conn.execute(BEGIN)
        snapshot = conn.execute("SELECT pg_export_snapshot()").fetchone()[0]  # type: ignore[index]
        # round robin: the spare connection takes the first query, this one the answer and then the second …
        mine, theirs = queries[1::2], queries[0::2]
        done: dict[str, float] = {}

        def side() -> list[Any]:
            started = time.perf_counter()
            with spare as other:
                other.execute(BEGIN)
                other.execute(psycopg.sql.SQL("SET TRANSACTION SNAPSHOT {}").format(psycopg.sql.Literal(snapshot)))
                out = [other.execute(q).fetchall() for q in theirs]
                other.execute("COMMIT")
                done["sens"] = time.perf_counter()
                done["side"] = done["sens"] - started
                return out

        with ThreadPoolExecutor(max_workers=1) as pool:
            future = pool.submit(side)
            try:
                answer_rows = conn.execute(self.answer_sql).fetchall()
                done["answer"] = time.perf_counter()
                own = [conn.execute(q).fetchall() for q in mine]
            finally:
                other_rows = future.result()  # the snapshot must outlive the side transaction's import
        # what the queries would take one after the other: this connection's share plus the spare's
        self.speed["last"] = time.perf_counter() - t0 + done["side"]
        sens: list[Any] = [None] * len(queries)
        sens[0::2], sens[1::2] = other_rows, own
        return [answer_rows, *sens], done["answer"] - t0, max(done["sens"], time.perf_counter()) - t0

    def _release(self, form: AnalysisForm, result: Result, groups: list[tuple]) -> None:
        assert result.params is not None
        rows: list[tuple[dict[str, Any], dict[str, Any]]] = []
        for g, measured in zip(groups, result.measurements, strict=True):
            noisy = []
            for m in measured:
                if m.true_value is None:
                    raise RefusedError(f"{m.aggregate} has no value for a group with no rows; not released")
                kind = "laplace" if m.mechanism == GLOBAL else m.mechanism
                m.noisy_value = mechanisms.release(kind, m.true_value, m.noise_scale, self.session.noise)
                noisy.append(m.noisy_value)
            if form.having is not None and _holds(form.having, noisy) is not True:
                continue  # HAVING on the noisy aggregates: post-processing (NULL, like SQL, drops the group)
            values: dict[str, Any] = {}
            keys: dict[str, Any] = {}
            for o in form.outputs:
                if o.is_key:
                    keys[o.name] = g[o.group_key]  # type: ignore[index]
                else:
                    values[o.name] = _evaluate(o.expr, noisy)
            rows.append((keys, values))
        for key in reversed(form.order_by):  # ORDER BY and LIMIT act on the noisy answers only
            out: Output = form.outputs[key.output]
            rows.sort(
                key=lambda kv, o=out: _sort_key(kv[0].get(o.name) if o.is_key else kv[1].get(o.name)),
                reverse=key.descending,
            )
        if form.limit is not None:
            rows = rows[: form.limit]
        result.columns = [o.name for o in form.outputs]
        result.rows = [{"key": k, "values": v} if form.group_by else {"values": v} for k, v in rows]
        result.released = True

    def _public(self, form: PublicRelease, release: bool) -> Result:
        result = Result(form.sql, None, public=True, notes=[f"reads only public tables: {', '.join(form.tables)}"])
        if release:
            with self.session.connection() as conn:
                try:
                    # the statement as sqldp checked it (allow-list, relations read), regenerated from its tree
                    cur = conn.execute(form.checked_sql or form.sql)  # one statement, read only (READ_ONLY)
                    result.columns = [d.name for d in cur.description or []]
                    result.rows = [dict(zip(result.columns, r, strict=True)) for r in cur.fetchall()]
                except psycopg.Error as exc:
                    raise _database_error(exc) from exc
            result.released = True
        result.timings = {"total": time.perf_counter() - self.started}
        return result


def _fold(
    form: AnalysisForm, answer: exp.Select, plans: Sequence[Any]
) -> tuple[exp.Select, dict[int, tuple[int, int]]]:
    """The answer query with the sensitivity queries that scan the same product computed in its scan (the
    issue's "both in one scan where possible"; NR §4.3.4 ran q_m and q_s separately, Table 16).

    Two shapes of plan query fold (the plan says which, ``inline`` and ``grouped_scan``): one-row queries
    ``FROM <uses> WHERE <scan conjuncts>``, whose items join the answer's; and ``MAX`` over a ``GROUP BY`` of
    that scan (max over rows t of Σ_{r ∋ t} D(r), NR §3.3.8.2), which becomes the merged query's inner level:
    the answer's aggregates are computed per group there and re-aggregated outside (SUM and COUNT add up, MIN
    and MAX of the groups' MIN and MAX), so one scan of the join serves both. The scan conjuncts are a subset
    of the answer's WHERE: the merged query keeps them and moves the answer's other conjuncts into FILTER
    clauses of its aggregates. Grouped answers are not folded (the bounds are over the whole scan)."""
    if form.group_by:
        return answer, {}
    where_node = answer.args.get("where")
    kept = {_key(c): c for c in _conjuncts(where_node.this)} if where_node is not None else {}
    scan: set[str] | None = None
    rows: list[tuple[int, exp.Select]] = []  # one-row queries
    grouped: list[tuple[int, exp.Select]] = []  # MAX over one GROUP BY of the scan
    offset = 0
    for plan in plans:
        inline, per_group = getattr(plan, "inline", ()), getattr(plan, "grouped_scan", ())
        mine = {_key(x) for c in getattr(plan, "scan_conjuncts", ()) for x in _conjuncts(c.expr)}
        for j, q in enumerate(plan.queries):
            if not (mine <= kept.keys() and (scan is None or mine == scan)):
                continue
            if j < len(inline) and inline[j]:
                scan = mine
                rows.append((offset + j, q))
            elif j < len(per_group) and per_group[j] and _same_groups(q, grouped):
                scan = mine
                grouped.append((offset + j, q))
        offset += len(plan.queries)
    if scan is None:
        return answer, {}
    merged = answer.copy()
    extra = [c for k, c in kept.items() if k not in scan]
    if extra:
        condition = exp.Where(this=exp.and_(*(c.copy() for c in extra)))
        for item in merged.expressions:
            item.set("this", exp.Filter(this=item.this, expression=condition.copy()))
    merged.set("where", exp.Where(this=exp.and_(*(kept[k].copy() for k in kept if k in scan))) if scan else None)
    folded: dict[int, tuple[int, int]] = {}
    width = len(merged.expressions)
    for i, q in rows:
        items = [e.this if isinstance(e, exp.Alias) else e for e in q.expressions]
        merged = merged.select(*(exp.alias_(e.copy(), f"__s{i}_{k}") for k, e in enumerate(items)), copy=False)
        folded[i] = (width, width + len(items))
        width += len(items)
    if grouped:
        two = _per_group(merged, grouped)
        if two is None:  # an aggregate that does not re-aggregate: the grouped queries run on their own
            return (merged, folded) if rows else (answer, {})
        merged = two
        for i, q in grouped:
            folded[i] = (width, width + len(q.expressions))
            width += len(q.expressions)
    return merged, folded


# how an aggregate of the groups' aggregates gives the aggregate of all rows (COUNT of nothing is 0, not NULL)
_REAGGREGATE = {exp.Sum: exp.Sum, exp.Count: exp.Sum, exp.Min: exp.Min, exp.Max: exp.Max}


def _inner(q: exp.Select) -> exp.Select:
    """The grouped level of ``SELECT MAX(s0) … FROM (SELECT … GROUP BY …) AS per_row``."""
    return q.args["from_"].this.this


def _same_groups(q: exp.Select, grouped: list[tuple[int, exp.Select]]) -> bool:
    return not grouped or _inner(q).args["group"].sql() == _inner(grouped[0][1]).args["group"].sql()


def _per_group(merged: exp.Select, grouped: list[tuple[int, exp.Select]]) -> exp.Select | None:
    """``merged`` (one row) computed as an aggregate over the groups of the grouped queries' inner level, with
    their MAX items appended; None when one of its aggregates cannot be re-aggregated (COUNT DISTINCT, …)."""
    inner = exp.select().from_(merged.args["from_"].copy(), copy=False)
    for j in merged.args.get("joins") or ():
        inner.append("joins", j.copy())
    if merged.args.get("where") is not None:
        inner.set("where", merged.args["where"].copy())
    inner.set("group", _inner(grouped[0][1]).args["group"].copy())
    outer_items = []
    names: dict[str, str] = {}
    for item in merged.expressions:
        item = item.copy()
        aggs = [a for a in item.find_all(exp.AggFunc) if not isinstance(a.parent, exp.Filter)]
        aggs += [f for f in item.find_all(exp.Filter)]
        for node in aggs:
            agg = node.this if isinstance(node, exp.Filter) else node
            outer = _REAGGREGATE.get(type(agg))
            if outer is None or isinstance(agg.this, exp.Distinct) or agg.find_ancestor(exp.AggFunc):
                return None
            key = node.sql()
            if key not in names:  # the bounds repeat MAX(ABS(x)) and COUNT(*): computed once per group
                names[key] = f"__g{len(names)}"
                inner.select(exp.alias_(node.copy(), names[key]), copy=False)
            again: exp.Expression = outer(this=exp.column(names[key]))
            if isinstance(agg, exp.Count):
                again = exp.func("COALESCE", again, exp.Literal.number(0))
            item = again if node is item else item  # an item that is the aggregate itself has no parent
            node.replace(again)
        outer_items.append(item)
    for i, q in grouped:
        level = {s.alias: s for s in _inner(q).expressions}  # SUM(…) AS s<k> (and the window's MIN(…) AS dist)
        for name, node in level.items():
            inner.select(exp.alias_(node.this.copy(), f"__p{i}_{name}"), copy=False)

        def rename(n: exp.Expression, i: int = i, level: dict = level) -> exp.Expression:
            return exp.column(f"__p{i}_{n.name}") if isinstance(n, exp.Column) and n.name in level else n

        for k, item in enumerate(q.expressions):  # MAX(<expression of the level's columns>) AS v<k>
            outer_items.append(exp.alias_(item.this.copy().transform(rename), f"__s{i}_{k}"))
    return exp.select(*outer_items).from_(exp.Subquery(this=inner, alias=exp.TableAlias(this=exp.to_identifier("g"))))


def _by_group(rows: Sequence[tuple], sizes: Sequence[int]) -> dict[tuple, tuple]:
    """The answer rows of a GROUP BY by their groups' indices (``match_groups`` puts them first), without
    those indices: the keys, then the aggregates, as the answer query gives them."""
    k = len(sizes)
    out: dict[tuple, tuple] = {}
    for row in rows:
        index = tuple(row[:k])
        if any(i is None for i in index):
            continue  # outside the declared domain: never released
        if index in out:  # two PostgreSQL groups in one released group (see match_groups: cannot happen)
            raise RefusedError("the GROUP BY keys do not match the declared groups one to one; not released")
        out[index] = tuple(row[k:])
    return out


def _end(conn: psycopg.Connection) -> None:
    """End the snapshot's transaction, if one was begun (see READ_ONLY: COMMIT keeps prepared statements)."""
    if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        conn.execute("COMMIT")


def _conjuncts(e: exp.Expression) -> list[exp.Expression]:
    e = e.unnest()
    return [*_conjuncts(e.this), *_conjuncts(e.expression)] if isinstance(e, exp.And) else [e]


def _key(e: exp.Expression) -> str:
    return e.unnest().sql(dialect="postgres")


def _database_error(exc: psycopg.Error) -> DatabaseError:
    """One line from PostgreSQL's message (its first line says what failed)."""
    diag = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return DatabaseError(f"PostgreSQL failed on the query: {diag}")


def _calibrate(
    plan: Any, results: Any, eps: float, delta: float | None, params: PrivacyParams
) -> tuple[mechanisms.Calibration, Any]:
    """The noise for one aggregate: β from the user, or chosen to minimise the noise (NR Theorem 3.73)."""

    bound_at = plan.bind(results)  # the β-independent work once; then one cheap evaluation per β
    if _data_independent(plan):
        # The bound does not depend on the private data (nor on β): it is the global sensitivity over every
        # database that differs in private rows, so value + Lap(c/ε) is ε-DP (Dwork, McSherry, Nissim, Smith,
        # "Calibrating noise to sensitivity in private data analysis", TCC 2006) with δ = 0 — a scale c/ε
        # where generalized Cauchy needs c/(ε/(γ + 1) − β) ≥ 5c/ε. Chosen from the plan's shape only.
        return mechanisms.calibrate_global(float(bound_at(0.0).sensitivity), eps), bound_at(0.0)

    def smooth(beta: float) -> float:
        return float(bound_at(beta).sensitivity)

    if params.beta is None:
        extra = getattr(plan, "grid", ())  # a value plan's bound is tightest on its own grid points
        cal = mechanisms.optimise_beta(smooth, eps, params.mechanism, delta=delta, extra=extra)
    elif params.mechanism == "laplace":
        cal = mechanisms.calibrate_laplace(smooth(params.beta), eps, delta, params.beta)
    else:
        cal = mechanisms.calibrate_cauchy(smooth(params.beta), eps, params.beta)
    return cal, bound_at(cal.beta)


GLOBAL = "laplace-global"


def _data_independent(plan: Any) -> bool:
    return bool(getattr(plan, "data_independent", False))


def _smoothed(
    shares: Sequence[tuple[float, float | None] | None], plans: Sequence[Any]
) -> list[tuple[float, float | None]]:
    """The (ε, δ) shares whose noise uses β (a data-independent plan's does not, so a fixed β is no constraint)."""
    return [s for s, plan in zip(shares, plans, strict=True) if s is not None and not _data_independent(plan)]


def single_aggregate(form: AnalysisForm, index: int) -> AnalysisForm:
    """The form restricted to one aggregate (each aggregate is its own measurement)."""
    agg = form.aggregates[index]
    out = Output(f"{AGG_PREFIX}0", exp.column(f"{AGG_PREFIX}0"), (0,))
    keys = tuple(o for o in form.outputs if o.is_key)
    return dataclasses.replace(form, aggregates=(agg,), outputs=(*keys, out), order_by=(), limit=None)


def _sort_key(v: Any) -> tuple[int, Any]:
    return (1, 0) if v is None else (0, v)


def _jsonable(term: Any) -> Any:
    if dataclasses.is_dataclass(term) and not isinstance(term, type):
        return {k: _jsonable(v) for k, v in dataclasses.asdict(term).items()}
    if isinstance(term, Mapping):
        return {str(k): _jsonable(v) for k, v in term.items()}
    if isinstance(term, (list, tuple)):
        return [_jsonable(v) for v in term]
    if isinstance(term, float) and not math.isfinite(term):
        return str(term)
    return term
