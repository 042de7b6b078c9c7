"""The model checker's budget is a count of solver steps (sqldp.sensitivity.model_check.Budget: z3's resource
units), not a wall clock: the same query, schema and policy get the same bound on any machine under any load.

Each check runs in fresh processes while the machine is loaded (two busy processes) and under an artificial
slowdown: ``time.perf_counter`` jumps 1000 s at every read, so a wall-clock limit would be out of time at its
first check (the bound ∞, or the data-dependent plan). The budget-bound search (a self-join whose exact bound
23 needs more than 0.2 reference seconds of steps; within 0.2 it stops at 24, said ``timed_out``) and a
session's noise scale must come out identical in every process, and equal to the unpatched in-process result.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import sqlglot

from sqldp.catalog import Catalog
from sqldp.sensitivity import model_check as mc

DDL = "CREATE TABLE t (x int4 PRIMARY KEY, y int4 NOT NULL);"
SELF_JOIN = "SELECT t1.y, t2.y FROM t AS t1, t AS t2 WHERE t2.x >= t1.x AND t2.x < t1.x + 12"
COUNT = "SELECT COUNT(*) FROM t AS t1, t AS t2 WHERE t2.x >= t1.x AND t2.x < t1.x + 12"

SLOW = """
import itertools, time
_ticks = itertools.count()
time.perf_counter = lambda: next(_ticks) * 1000.0  # every read 1000 s later: a wall-clock limit is always out
"""

SCRIPT = (
    SLOW
    + """
import json, sqlglot, sqldp
from sqldp.catalog import Catalog
from sqldp.policy import Policy
from sqldp.sensitivity import model_check as mc
tree = sqlglot.parse_one(%r, read="postgres")
r = mc.query_sensitivity(tree, Catalog.from_ddl(%r), "t", timeout=0.2)
s = sqldp.connect(%r, Policy.from_toml('[tables.t]\\nrows = "private"\\n'))
m = s.analyze(%r, audit=True, epsilon=1.0).measurements[0][0]
print(json.dumps([r.value, r.timed_out, m.mechanism, m.sensitivity, m.noise_scale]))
"""
)


@contextmanager
def _loaded() -> Iterator[None]:
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        hog.kill()
        hog.wait()


def test_the_bound_and_noise_scale_are_the_same_in_every_process(pg_dsn: str) -> None:
    """In process, unpatched: the budget binds at 0.2 reference seconds (24, ``timed_out``; 5 prove 23). Then 5
    fresh processes, loaded and slowed: the same search gives 24 in each, and the schema's global bound of the
    self-join's COUNT (23 join rows per row of t, NR §3.3.13) is Laplace's scale in each — under a wall-clock
    limit the search would run out and the query fall back to a data-dependent bound."""
    tree = sqlglot.parse_one(SELF_JOIN, read="postgres")
    cat = Catalog.from_ddl(DDL)
    here = mc.query_sensitivity(tree, cat, "t", timeout=0.2)
    assert (here.value, here.timed_out) == (24.0, True)
    assert mc.query_sensitivity(tree, cat, "t", timeout=5.0).value == 23.0
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(DDL)
        conn.execute("INSERT INTO t SELECT i, i FROM generate_series(1, 30) AS i")
    script = SCRIPT % (SELF_JOIN, DDL, pg_dsn, COUNT)
    with _loaded():
        runs = [
            json.loads(
                subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
            )
            for _ in range(5)
        ]
    assert runs == [[24.0, True, "laplace-global", 23.0, 23.0]] * 5
