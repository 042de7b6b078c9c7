"""PostgreSQL's dialect: the statements as sqldp's analyses write them, with the meaning they bound.

Every default of :class:`sqldp.engine.Dialect` is PostgreSQL's, so this dialect changes nothing: the rewrite
writes its trees in PostgreSQL (sqlglot's ``postgres``), NUMERIC is exact at any precision, the truncation's
total order is sqldp.rewrite.total_order's own, and public statements run as the allow-list checked them.
"""

from __future__ import annotations

from sqldp.engine import Dialect

POSTGRES = Dialect("postgres")
