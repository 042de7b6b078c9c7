"""What a query gives back: per aggregate and group a :class:`Measurement`, gathered in a :class:`Result`,
and what of them an analyst may see (README, "What each output field reveals")."""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqldp.errors import InputError, RefusedError

if TYPE_CHECKING:  # sqldp.params imports the mechanisms (scipy, gmpy2): not needed to read a result
    from sqldp.params import PrivacyParams

GLOBAL = "laplace-global"  # the mechanism of a data-independent bound (sqldp.release.calibrate)
# a query's data-independent bounds released together by one Gaussian vector (sqldp.release.gaussian)
GAUSSIAN = "gaussian-global"
PUBLIC_SCALE = frozenset({GLOBAL, GAUSSIAN})  # mechanisms whose noise scale depends on no private data
R2T = "r2t"  # the race of truncations under a privacy unit (sqldp.release.race)
# GROUP BY under a privacy unit: τ chosen by R2T's race on the total, the histogram truncated across groups
# and released with Laplace noise at τ/ε (sqldp.release.histogram_release, docs/units.md)
UNIT_HISTOGRAM = "r2t-histogram"


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
    # "laplace-global" when the plan's bound is data-independent (see _calibrate), "gaussian-global" when the
    # query's global bounds are released as one Gaussian vector (sqldp.release.gaussian), else the policy's
    # mechanism; it depends on the query, the policy and (ε, δ) only, so it is released
    mechanism: str = "cauchy"
    true_value: float | None = None  # never released; kept out of every serialisation
    # the noise, for error bars at other confidences (the bars of expressions over several measurements)
    calibration: Any = field(default=None, repr=False)
    noisy_value: float | None = None
    # R2T (mechanism "r2t"): the unit, GS_Q, the number of races and R2T's β — from the policy and the query,
    # so released — and the thresholds τ_j and the truncated answers Q(I, τ_j), data-dependent: audit only
    unit: Mapping[str, Any] | None = None
    thresholds: tuple[float, ...] = ()
    truncated: tuple[float, ...] = field(default=(), repr=False)
    # GROUP BY under a privacy unit: this group's ℓ1 mass of the truncated contributions at each τ_j (audit only)
    mass: tuple[float, ...] = field(default=(), repr=False)
    # which data-independent bound the noise is calibrated to (sqldp.sensitivity.global_bound.GlobalPlan.source,
    # e.g. the schema's keys, a workflow's composition): a function of the query, the schema and the policy
    bound: str | None = None
    # the selector of groups owned by one row (sqldp.owned): how many groups one neighbouring change can add or
    # remove — from the query and the schema, so released; None for every other measurement
    owned_groups: int | None = None

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
            if self.mechanism in PUBLIC_SCALE:
                # a global bound is a function of the query, the policy and public data: so are its noise
                # scale and error bar, which the analyst may see
                out["noise_scale"], out["half_width"] = self.noise_scale, self.half_width
                if self.bound is not None:
                    out["bound"] = self.bound
            if self.unit is not None:
                out["unit"] = dict(self.unit)
            return out
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in _UNSERIALISED}
        out["tables"] = self.tables
        return out


_UNSERIALISED = frozenset({"terms", "true_value", "calibration"})
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
    # a workflow's steps (sqldp.runner.Workflow): each uncorrelated scalar subquery's own result, released
    # before the statement ran with its value
    steps: list[Result] = field(default_factory=list)

    @property
    def answer(self) -> Any:
        """The single noisy value of an ungrouped, single-output query."""
        if self.grouped or not self.rows:
            return None
        # a public answer's rows are plain records (column → value), a released one's keys and values
        values = list(self.rows[0].values()) if self.public else list(self.rows[0]["values"].values())
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

    def records(self) -> list[dict[str, Any]]:
        """The released rows as flat records, one dict per row in output order: each column by name and, for a
        value with a data-independent error bar, ``<name>_error`` (its half-width at the result's confidence).
        The shape pandas and pyarrow take directly (``pandas.DataFrame(result.records())``)."""
        names, rows = self.table()
        out = []
        for values, row in zip(rows, self.rows, strict=True):
            record = dict(zip(names, values, strict=True))
            record.update({f"{name}_error": bar for name, bar in row.get("errors", {}).items()})
            out.append(record)
        return out

    def to_pandas(self) -> Any:
        """The released rows as a pandas DataFrame (see :meth:`records`); pandas is not a dependency of sqldp."""
        try:
            import pandas
        except ImportError:
            raise InputError("to_pandas needs pandas: pip install pandas (or use result.records())") from None
        return pandas.DataFrame(self.records())

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
        if self.steps:
            out["steps"] = [s.to_json(audit=audit) for s in self.steps]
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
                # per released value, ± the half-width of an interval holding the true value at the confidence,
                # where it is data-independent (sqldp.release.error_bar)
                out["errors"] = self.rows[0].get("errors", {}) if self.rows else {}
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
        # bar / |noisy answer| understates the error by orders of magnitude when the noise dominates the answer
        # (the noisy value is then mostly noise): no relative figure then, and say so
        noisy = main.noisy_value
        dominated = noisy is not None and main.half_width >= abs(noisy)
        rel = None if noisy is None or dominated else main.half_width / abs(noisy)
        out = {"confidence": conf, "absolute": main.half_width, "relative": rel}
        if dominated:
            out["noise_dominates"] = True
        return out


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
