"""Policy fuzz: ~700 mutated policies (fixed seed) from the shipped ones, written as TOML and loaded with
Policy.from_file, validated against the catalog, and their goals, priors, [proxy] and [analysts] sections
parsed. Only PolicyError/InputError may come out, never another exception, and each case in bounded time."""

from __future__ import annotations

import copy
import datetime as dt
import json
import math
import random
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import sqldp
from sqldp.advantage import epsilon_from_policy
from sqldp.catalog import Catalog
from sqldp.errors import InputError, PolicyError
from sqldp.policy import Policy
from sqldp.proxy import config
from sqldp.proxy.scram import make_verifier

SCHEMAS = Path(sqldp.__file__).parent / "data" / "schemas"
CASES = 700
SEED = 17
PER_CASE_SECONDS = 5.0

DEEP = 3000  # deeper than Python's recursion limit in the TOML parser


def _toml_value(v: Any) -> str:
    if isinstance(v, Deep):
        return ("{ a = " * v.depth + "1" + " }" * v.depth) if v.table else ("[" * v.depth + "1" + "]" * v.depth)
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return _toml_string(v)
    if isinstance(v, (dt.datetime, dt.date, dt.time)):
        return v.isoformat()
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{_toml_string(str(k))} = {_toml_value(x)}" for k, x in v.items()) + " }"
    raise TypeError(type(v))


def _toml_string(s: str) -> str:
    # JSON's escapes are TOML's basic-string escapes; DEL must be escaped in TOML too
    return json.dumps(s, ensure_ascii=False).replace("\x7f", "\\u007f")


def _toml(doc: dict[str, Any]) -> str:
    """Every top-level key as ``key = <inline value>``: inline tables and arrays express any policy."""
    return "\n".join(f"{_toml_string(k)} = {_toml_value(v)}" for k, v in doc.items()) + "\n"


def _seeds() -> list[tuple[dict[str, Any], Catalog]]:
    verifier = str(make_verifier("pw", salt=b"0123456789abcdef"))
    extra = {
        "proxy": {"listen": "127.0.0.1:6543", "max_message_bytes": 65536, "workers": 4, "pool_size": 2},
        "analysts": {"alice": {"verifier": verifier, "epsilon_limit": 10.0, "delta_limit": 1e-5, "epsilon": 0.5}},
    }
    out = []
    for name, ddl in (("cafeteria", "cafeteria.sql"), ("tpch", "tpch.sql")):
        raw = tomllib.loads((SCHEMAS / f"{name}.toml").read_text(encoding="utf-8"))
        catalog = Catalog.from_file(SCHEMAS / ddl)
        out.append((raw, catalog))
        out.append(({**copy.deepcopy(raw), **copy.deepcopy(extra)}, catalog))
    # a membership goal and the other prior kinds, so that their parsers are mutated too
    raw = tomllib.loads((SCHEMAS / "cafeteria.toml").read_text(encoding="utf-8"))
    raw["goals"].append({"membership": "t", "prior": 0.5, "advantage": 0.1})
    raw["tables"]["t"]["columns"]["faculty"]["knowledge"] = {
        "kind": "set_prior",
        "values": ["math", "physics"],
        "weights": [1, 3],
    }
    raw["tables"]["t"]["columns"]["name"] = {"knowledge": {"kind": "normal", "mu": 0, "sigma": 1}}
    out.append((raw, out[0][1]))
    return out


@dataclass(frozen=True)
class Deep:
    """A value nested ``depth`` levels (arrays or inline tables), written out without recursion."""

    depth: int
    table: bool = False


POOL: list[Any] = [
    math.nan,
    math.inf,
    -math.inf,
    1e308,
    -1e308,
    1e-308,
    5e-324,
    0,
    0.0,
    -0.0,
    -1,
    1,
    0.5,
    2**63 - 1,
    -(2**63),
    True,
    False,
    "",
    " ",
    "private",
    "public",
    "cauchy",
    "laplace",
    "day",
    "l1(time)",
    "l1()",
    "lp(0, time)",
    "t.time",
    "ORDERS",
    "ß",
    "İ",
    "🙂",
    "a\x00b",
    "a\x7fb",
    "ｔ",
    "1992-13-45",
    "1992-01-01",
    dt.date(1970, 1, 1),
    dt.datetime(2020, 1, 1, 12, 0, tzinfo=dt.UTC),
    dt.time(12, 0),
    [],
    {},
    [1, 2],
    [2, 1],
    ["a", "a"],
    [0, math.nan],
    [0, math.inf],
    [["a"], ["b"]],
    [{"x": 1}],
    {"kind": "range_uniform", "lo": 0, "hi": math.nan},
    {"kind": "set_uniform", "values": [1, 1]},
    {"kind": "normal", "mu": 1e308, "sigma": 1e-308},
    {"t.time": math.inf},
]
NORM_BITS = ["(", ")", "*", ",", "1e308", "1e-308", "0", "-1", "lp(", "linf(", "l2(", "nan", "inf", "x", "'a'", " "]
NAMES = ["ORDERS", "Orders", "T", "ｔ", "İ", "ß", "orders\u200b", "", " ", "a.b", "🙂", "time", "TIME"]


def _paths(node: Any, prefix: tuple = ()) -> Iterator[tuple]:
    """Every dict key and list index in the document, as a path from the root."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield (*prefix, k)
            yield from _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield (*prefix, i)
            yield from _paths(v, (*prefix, i))


def _parent(doc: Any, path: tuple) -> Any:
    for p in path[:-1]:
        doc = doc[p]
    return doc


def _mutate(doc: dict[str, Any], rng: random.Random) -> None:
    paths = list(_paths(doc))
    if not paths:
        doc[rng.choice(NAMES)] = rng.choice(POOL)
        return
    path = rng.choice(paths)
    parent, key = _parent(doc, path), path[-1]
    op = rng.randrange(10)
    if op == 0:  # delete the key or element
        del parent[key]
    elif op in (1, 2):  # another value, of any type
        parent[key] = copy.deepcopy(rng.choice(POOL))
    elif op == 3 and isinstance(key, str):  # a case or unicode variant of the name beside the original
        variant = rng.choice([key.upper(), key.title(), key.swapcase(), key + "\u200b", rng.choice(NAMES)])
        parent[variant] = copy.deepcopy(rng.choice([parent[key], rng.choice(POOL)]))
    elif op == 4 and isinstance(key, str):  # renamed
        parent[rng.choice([key.upper(), rng.choice(NAMES)])] = parent.pop(key)
    elif op == 5:  # wrapped in a list, or nested very deep
        parent[key] = rng.choice([[parent[key]], Deep(rng.choice([50, DEEP])), Deep(DEEP, table=True)])
    elif op == 6 and isinstance(parent[key], str):  # a string (a norm, a name) spliced
        s = parent[key]
        at = rng.randrange(len(s) + 1)
        bit = rng.choice(NORM_BITS) * rng.choice([1, 1, 3, 40, DEEP])
        parent[key] = s[:at] + bit + s[at:]
    elif op == 7 and isinstance(parent[key], (int, float)) and not isinstance(parent[key], bool):
        parent[key] = parent[key] * rng.choice([1e300, -1, 1e-300, math.inf, 0])
    elif op == 8 and isinstance(parent[key], dict):  # a new key
        parent[key][rng.choice([*NAMES, "rows", "norm", "domain", "range", "knowledge", "kind"])] = rng.choice(POOL)
    elif op == 9 and isinstance(parent[key], list) and parent[key]:  # a repeated element
        parent[key].append(copy.deepcopy(rng.choice(parent[key])))
    else:
        parent[key] = copy.deepcopy(rng.choice(POOL))


def _cases() -> list[tuple[int, str, Catalog]]:
    rng = random.Random(SEED)
    seeds = _seeds()
    out = []
    for i in range(CASES):
        raw, catalog = seeds[i % len(seeds)]
        doc = copy.deepcopy(raw)
        for _ in range(rng.choice([1, 1, 2, 3])):
            _mutate(doc, rng)
        out.append((i, _toml(doc), catalog))
    return out


def _load(path: Path, catalog: Catalog) -> None:
    policy = Policy.from_file(path)
    policy.validate(catalog)
    config.load(policy)
    if policy.goals:
        epsilon_from_policy(policy, None)


def test_shipped_policies_load_through_the_fuzz_writer(tmp_path: Path) -> None:
    """The unmutated seeds load: the fuzz exercises mutations, not the TOML writer."""
    for i, (raw, catalog) in enumerate(_seeds()):
        path = tmp_path / f"seed{i}.toml"
        path.write_text(_toml(raw), encoding="utf-8")
        _load(path, catalog)


def test_mutated_policies_fail_only_with_one_line_policy_errors(tmp_path: Path) -> None:
    failures: list[str] = []
    rejected = tracebacks = connection_errors = 0
    started = time.perf_counter()
    for i, text, catalog in _cases():
        path = tmp_path / f"case{i}.toml"
        path.write_text(text, encoding="utf-8")
        t0 = time.perf_counter()
        try:
            _load(path, catalog)
        except InputError as exc:  # PolicyError is an InputError
            rejected += 1
            connection_errors += exc.sqlstate.startswith("08")  # drivers take class 08 for a dropped connection
            if "\n" in str(exc) or (isinstance(exc, PolicyError) and not exc.where):
                failures.append(f"case {i}: not a one-line error naming the key: {exc!r}")
        except Exception as exc:  # any other exception is the failure this test looks for
            tracebacks += 1
            failures.append(f"case {i}: {type(exc).__name__}: {str(exc)[:200]}")
        elapsed = time.perf_counter() - t0
        if elapsed > PER_CASE_SECONDS:
            failures.append(f"case {i}: took {elapsed:.1f} s")
    assert (tracebacks, connection_errors) == (0, 0)
    assert not failures, "\n".join(failures[:20]) + f"\n({len(failures)} failures)"
    assert rejected > CASES // 3  # the mutations do break policies (else the fuzz tests nothing)
    assert time.perf_counter() - started < CASES * 0.5


@pytest.mark.parametrize("depth", [DEEP, 100_000])
def test_deep_toml_nesting_is_a_policy_error(tmp_path: Path, depth: int) -> None:
    """tomllib recurses per nesting level: a deep array used to raise RecursionError out of from_file."""
    path = tmp_path / "deep.toml"
    path.write_text("x = " + "[" * depth + "]" * depth + "\n", encoding="utf-8")
    with pytest.raises(InputError, match="nested too deeply"):
        Policy.from_file(path)
