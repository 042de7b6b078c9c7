"""Relational algebra: small immutable nodes built by the front end (pipeline step 1 of 6, docs/layout.md).

The nodes mirror NR §3.3.7.2: relations, selection σ, product ×, projection π, renaming ρ, union,
difference, distinct and aggregation. Expressions inside nodes are sqlglot trees whose columns are
qualified by the alias of the table use they read. Nodes are data only; ``normalize`` turns them into the
analysis form, and :func:`render` / :func:`to_json` show them (``sqldp explain``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlglot import exp


def _sql(e: exp.Expr) -> str:
    return e.sql(dialect="postgres")


@dataclass(frozen=True)
class Relation:
    """A use of a catalog table under an alias (two uses of one table = a self-join)."""

    table: str
    alias: str


@dataclass(frozen=True)
class Select:
    """σ_condition(child)."""

    condition: exp.Expr
    child: Node


@dataclass(frozen=True)
class Product:
    """child1 × … × childn (inner joins become σ over ×)."""

    children: tuple[Node, ...]


@dataclass(frozen=True)
class OuterJoin:
    """LEFT/RIGHT/FULL joins and other joins the analyses do not model; kept so the refusal is precise."""

    kind: str
    condition: exp.Expr | None
    left: Node
    right: Node


@dataclass(frozen=True)
class Project:
    """π: named expressions over the child."""

    items: tuple[tuple[str, exp.Expr], ...]
    child: Node


@dataclass(frozen=True)
class Rename:
    """ρ: a derived table (FROM-subquery or WITH reference) seen under an alias."""

    alias: str
    child: Node


@dataclass(frozen=True)
class Distinct:
    child: Node


@dataclass(frozen=True)
class SetOp:
    """UNION / INTERSECT / EXCEPT (difference), with or without ALL."""

    op: str
    distinct: bool
    left: Node
    right: Node


@dataclass(frozen=True)
class Aggregate:
    """γ: GROUP BY keys and a SELECT list containing aggregate functions; HAVING kept for refusal."""

    groups: tuple[exp.Expr, ...]
    items: tuple[tuple[str, exp.Expr], ...]
    having: exp.Expr | None
    child: Node


@dataclass(frozen=True)
class Sort:
    """ORDER BY / LIMIT / OFFSET; sqldp applies them to noisy answers only."""

    keys: tuple[tuple[exp.Expr, bool], ...]  # (expression, descending)
    limit: int | None
    offset: int | None
    child: Node


Node = Relation | Select | Product | OuterJoin | Project | Rename | Distinct | SetOp | Aggregate | Sort


def children(node: Node) -> tuple[Node, ...]:
    if isinstance(node, Relation):
        return ()
    if isinstance(node, Product):
        return node.children
    if isinstance(node, (OuterJoin, SetOp)):
        return (node.left, node.right)
    return (node.child,)


def relations(node: Node) -> list[Relation]:
    if isinstance(node, Relation):
        return [node]
    return [r for c in children(node) for r in relations(c)]


def _items(items: tuple[tuple[str, exp.Expr], ...]) -> str:
    return ", ".join(f"{_sql(e)} AS {name}" for name, e in items)


def render(node: Node, indent: int = 0) -> str:
    """A readable tree, one operator per line."""
    pad = "  " * indent
    if isinstance(node, Relation):
        return f"{pad}{node.table}" + (f" AS {node.alias}" if node.alias != node.table else "")
    if isinstance(node, Select):
        head = f"σ[{_sql(node.condition)}]"
    elif isinstance(node, Product):
        head = "×"
    elif isinstance(node, OuterJoin):
        cond = f" ON {_sql(node.condition)}" if node.condition is not None else ""
        head = f"{node.kind} JOIN{cond}"
    elif isinstance(node, Project):
        head = f"π[{_items(node.items)}]"
    elif isinstance(node, Rename):
        head = f"ρ[{node.alias}]"
    elif isinstance(node, Distinct):
        head = "δ (DISTINCT)"
    elif isinstance(node, SetOp):
        head = f"{node.op}{'' if node.distinct else ' ALL'}"
    elif isinstance(node, Aggregate):
        groups = ", ".join(_sql(g) for g in node.groups)
        having = f" HAVING {_sql(node.having)}" if node.having is not None else ""
        head = f"γ[{groups}; {_items(node.items)}{having}]" if groups else f"γ[{_items(node.items)}{having}]"
    else:  # Sort
        keys = ", ".join(_sql(k) + (" DESC" if d else "") for k, d in node.keys)
        parts = [f"ORDER BY {keys}"] if keys else []
        if node.limit is not None:
            parts.append(f"LIMIT {node.limit}")
        if node.offset is not None:
            parts.append(f"OFFSET {node.offset}")
        head = f"τ[{' '.join(parts)}]"
    return "\n".join([pad + head, *(render(c, indent + 1) for c in children(node))])


def to_json(node: Node) -> dict[str, Any]:
    """A JSON-serialisable form of the tree (``sqldp explain --format json``)."""
    name = type(node).__name__.lower()
    out: dict[str, Any] = {"op": name}
    if isinstance(node, Relation):
        out.update(table=node.table, alias=node.alias)
    elif isinstance(node, Select):
        out["condition"] = _sql(node.condition)
    elif isinstance(node, OuterJoin):
        out.update(kind=node.kind, condition=_sql(node.condition) if node.condition is not None else None)
    elif isinstance(node, (Project, Aggregate)):
        out["items"] = [{"name": n, "expr": _sql(e)} for n, e in node.items]
        if isinstance(node, Aggregate):
            out["groups"] = [_sql(g) for g in node.groups]
            out["having"] = _sql(node.having) if node.having is not None else None
    elif isinstance(node, Rename):
        out["alias"] = node.alias
    elif isinstance(node, SetOp):
        out.update(kind=node.op, distinct=node.distinct)
    elif isinstance(node, Sort):
        out.update(order_by=[{"expr": _sql(k), "desc": d} for k, d in node.keys], limit=node.limit, offset=node.offset)
    kids = children(node)
    if kids:
        out["inputs"] = [to_json(c) for c in kids]
    return out
