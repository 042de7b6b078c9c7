"""sqldp in a notebook or a script: TPC-H at scale factor 0.01 in the embedded PostgreSQL, one session with a
privacy budget, a few queries and how to read their answers.

    python examples/quickstart.py            # $SQLDP_DSN if set, else the embedded server (started if needed)

Each cell below is what a notebook cell would hold; printing a result shows the analyst's view only (the noisy
answer, ± its error bar where the bar reveals nothing about the data, ε, the mechanism, the notes)."""

from __future__ import annotations

import sqldp
from sqldp.commands.demo import load
from sqldp.db import resolve_dsn

# the data: `sqldp load tpch --scale 0.01` does the same; nothing happens when TPC-H is already loaded
dsn = resolve_dsn(None, None)
load(dsn, "tpch", 0.01)

# a session under the shipped TPC-H policy ("tpch" names the policy shipped with sqldp), with a budget of ε = 3
# for all its runs together: each run is charged before anything is read, and refused once 3 is spent
session = sqldp.connect(dsn, policy="tpch", budget=3.0)

# what a query would cost, and how it would be answered, before anything is read or spent
print(session.cost("SELECT COUNT(*) FROM orders", epsilon=0.5))  # (0.5, 0.0)
print(session.analyze("SELECT COUNT(*) FROM orders", audit=False, epsilon=0.5))

# one noisy answer: the true value lies within ± the bar of it with probability 78% (the policy's confidence)
result = session.run("SELECT SUM(l_quantity) AS quantity FROM lineitem WHERE l_discount > 0.05", epsilon=1.0)
print(result)
print(result.answer)  # the noisy value itself

# a grouped answer as records (one dict per row, <column>_error for each bar), the shape pandas takes
grouped = session.run(
    "SELECT o_orderpriority, COUNT(*) AS orders, AVG(o_totalprice) AS avg_price FROM orders GROUP BY 1 ORDER BY 1",
    epsilon=1.0,
)
print(grouped)
for record in grouped.records():
    print(record)
try:
    print(grouped.to_pandas())  # needs pandas, which sqldp does not depend on
except sqldp.SqldpError as err:
    print(err)

# the budget: 2 of 3 spent; a run of ε = 1.5 is refused before anything is read
print("spent", session.spent, "remaining", session.remaining)
try:
    session.run("SELECT COUNT(*) FROM customer", epsilon=1.5)
except sqldp.SqldpError as err:
    print("refused:", err)
session.close()
