"""NR Table 17, the data-independent entries (ε = 1, β = 0.1, integer filters), on TPC-H SF 0.01.

NAPLES' §4.3.3 analysis protects *values* only ("all rows are considered sensitive": every row's sensitive
attributes are in the metric; rows are not added or removed), with the §4.3.3.3 norms. The policy here is
``schemas/tpch.toml`` with every table's rows made public, which leaves exactly that metric.
q_s is the β-smooth derivative sensitivity c(x) at β = 0.1 (Table 17's caption; %noise uses 10·q_s).
"""

from __future__ import annotations

from pathlib import Path

import pytest

import sqldp
from sqldp.policy import Policy

ROOT = Path(__file__).resolve().parents[2]
NAPLES = ROOT / "benchmarks" / "tpch" / "queries" / "naples"


def value_policy() -> Policy:
    text = (ROOT / "schemas" / "tpch.toml").read_text(encoding="utf-8")
    return Policy.from_toml(text.replace('rows = "private"', 'rows = "public"'), source="tpch-values")


# NR Table 17, column q_s(x), identical for SF 0.1, 0.5 and 1.0 and equal to the "non-std." global sensitivity
TABLE17 = {
    "q01_1": 50.0,
    "q01_5": 1.0,
    "q02_1": 100.0,  # MIN(ps_supplycost): d = 1, dual of the weight 0.01 → 100 (NR §3.3.8.3, Min / max)
    "q02_2": 100.0,  # MAX(ps_supplycost): as q02_1
    "q04": 7.0,
    "q12_1": 3.0,
    "q12_2": 3.0,
    "q16": 4.0,
}


@pytest.mark.parametrize("query", sorted(TABLE17))
def test_table17_data_independent_sensitivities(tpch_dsn: tuple[str, object, object], query: str) -> None:
    session = sqldp.connect(tpch_dsn[0], policy=value_policy())
    text = (NAPLES / f"{query}.sql").read_text(encoding="utf-8")
    result = session.analyze(text, epsilon=1.0, beta=0.1)
    assert result.to_json()["sensitivity"] == pytest.approx(TABLE17[query], rel=1e-9)
