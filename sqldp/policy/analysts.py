"""The ``[proxy]`` and ``[analysts.NAME]`` sections of the policy file, checked strictly.

```toml
[proxy]                                   # all optional
listen = "127.0.0.1:6543"
tls_cert = "server.crt"                   # with tls_key: answer SSLRequest with 'S' (else 'N')
tls_key = "server.key"
credentials = "analysts.credentials.toml" # NAME = "SCRAM-SHA-256$…" lines, kept apart from the policy
max_message_bytes = 1048576
workers = 16                              # threads running analyses and queries
pool_size = 8                             # upstream connections kept open
statement_timeout = 60                    # seconds a statement may run upstream (default: no limit)
row_budget_fallback = false               # per-row-budgeted tables: answer outside the classes on ε alone
row_counts_epsilon = 0.1                  # ε of the noisy used/excluded row counts in the NOTICE (0: none)

[analysts.alice]
verifier = "SCRAM-SHA-256$4096:…"         # from `sqldp budget passwd alice`; or in the credentials file
epsilon_limit = 10.0                      # total ε this analyst may spend (required)
delta_limit = 1e-5                        # total δ (default 0: (ε, δ) queries are refused)
epsilon = 0.5                             # per-query privacy parameters, overriding [defaults]
statement_timeout = 30                    # this analyst's, overriding [proxy]'s
```

Relative paths are read relative to the policy file. Every unknown key is an error naming the file and key.
A verifier is kept as its text here; the proxy decodes it (:mod:`sqldp.proxy.config`), since the SCRAM format
is the proxy's business.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqldp.errors import PolicyError
from sqldp.mechanisms.registry import DEFAULT, NEEDS_DELTA
from sqldp.policy.document import PRIVACY_KEYS, Defaults, Policy, parse_privacy
from sqldp.policy.keys import check_keys
from sqldp.policy.values import positive

PROXY_KEYS = {
    "listen",
    "tls_cert",
    "tls_key",
    "credentials",
    "max_message_bytes",
    "workers",
    "pool_size",
    "statement_timeout",
    "row_budget_fallback",
    "row_counts_epsilon",
}
ANALYST_KEYS = {"verifier", "epsilon_limit", "delta_limit", "statement_timeout", *PRIVACY_KEYS}
MAX_MESSAGE_BYTES = (1024, 1 << 26)  # the range max_message_bytes may take


@dataclass(frozen=True)
class AnalystPolicy:
    name: str
    verifier: str  # SCRAM-SHA-256$…, from the policy or the credentials file
    epsilon_limit: float
    delta_limit: float
    privacy: Mapping[str, Any] = field(default_factory=dict)  # keyword arguments for the runner
    statement_timeout: float | None = None  # seconds; None: [proxy]'s


@dataclass(frozen=True)
class ProxyPolicy:
    listen: tuple[str, int] = ("127.0.0.1", 6543)
    tls_cert: Path | None = None
    tls_key: Path | None = None
    max_message_bytes: int | None = None  # None: the protocol's default
    workers: int = 16
    pool_size: int = 8
    analysts: Mapping[str, AnalystPolicy] = field(default_factory=dict)
    statement_timeout: float | None = None  # seconds; None: no limit
    # per-row budgets (docs/budgets.md, docs/proxy.md "Per-row budgets"): answer a statement outside the proven
    # classes on the analyst-level account alone (Session.run_budgeted's fallback) rather than refuse it
    row_budget_fallback: bool = False
    row_counts_epsilon: float = 0.0  # ε of the NOTICE's noisy used/excluded counts (Session.budget_counts); 0: none


def parse_listen(text: Any, where: str) -> tuple[str, int]:
    if not isinstance(text, str):
        raise PolicyError(f"must be a string HOST:PORT, got {text!r}", where=where)
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    # ASCII digits only: str.isdigit() also admits '²', which int() refuses
    if not sep or not host or not (port.isascii() and port.isdigit()) or not 0 <= int(port) <= 65535:
        raise PolicyError(f"must be HOST:PORT, got {text!r}", where=where)
    return host, int(port)


def _int(value: Any, where: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise PolicyError(f"must be an integer in [{lo}, {hi}], got {value!r}", where=where)
    return value


def _path(value: Any, base: Path, where: str) -> Path:
    if not isinstance(value, str) or not value:
        raise PolicyError(f"must be a file path, got {value!r}", where=where)
    p = Path(value).expanduser()
    return p if p.is_absolute() else base / p


def _credentials(path: Path) -> dict[str, str]:
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise PolicyError(f"cannot read credentials file: {exc.strerror}", where=str(path)) from None
    except tomllib.TOMLDecodeError as exc:
        raise PolicyError(f"invalid TOML: {exc}", where=str(path)) from None
    for name, value in raw.items():
        if not isinstance(value, str):
            raise PolicyError("must be a SCRAM-SHA-256 verifier string", where=f"{path}: {name}")
    return dict(raw)


def parse_proxy(policy: Policy) -> ProxyPolicy:
    """The ``[proxy]`` and ``[analysts]`` sections of a loaded policy (``policy.raw`` keeps them unparsed)."""
    source = policy.source
    base = Path(source).parent if source and not source.startswith("<") else Path.cwd()
    raw = policy.raw
    w = f"{source}: proxy"
    proxy = check_keys(raw.get("proxy", {}), PROXY_KEYS, (), w)
    listen = parse_listen(proxy["listen"], f"{w}.listen") if "listen" in proxy else ("127.0.0.1", 6543)
    cert = _path(proxy["tls_cert"], base, f"{w}.tls_cert") if "tls_cert" in proxy else None
    key = _path(proxy["tls_key"], base, f"{w}.tls_key") if "tls_key" in proxy else None
    if (cert is None) != (key is None):
        raise PolicyError("tls_cert and tls_key go together", where=f"{w}.{'tls_key' if key is None else 'tls_cert'}")
    creds: dict[str, str] = {}
    if "credentials" in proxy:
        creds = _credentials(_path(proxy["credentials"], base, f"{w}.credentials"))
    analysts_raw = raw.get("analysts", {})
    if not isinstance(analysts_raw, dict):
        raise PolicyError("must be a table of tables", where=f"{source}: analysts")
    analysts = {
        name: _analyst(name, spec, creds, f"{source}: analysts.{name}", policy.defaults)
        for name, spec in analysts_raw.items()
    }
    for name in creds:
        if name not in analysts:
            raise PolicyError(
                "has a verifier but no [analysts] entry (and so no budget)", where=f"{w}.credentials: {name}"
            )
    size = proxy.get("max_message_bytes")
    return ProxyPolicy(
        listen=listen,
        tls_cert=cert,
        tls_key=key,
        max_message_bytes=None if size is None else _int(size, f"{w}.max_message_bytes", *MAX_MESSAGE_BYTES),
        workers=_int(proxy.get("workers", 16), f"{w}.workers", 1, 256),
        pool_size=_int(proxy.get("pool_size", 8), f"{w}.pool_size", 1, 256),
        analysts=analysts,
        statement_timeout=_timeout(proxy, w),
        row_budget_fallback=_flag(proxy, "row_budget_fallback", w),
        row_counts_epsilon=positive(proxy.get("row_counts_epsilon", 0.0), f"{w}.row_counts_epsilon", allow_zero=True),
    )


def _flag(spec: Mapping[str, Any], key: str, where: str) -> bool:
    value = spec.get(key, False)
    if not isinstance(value, bool):
        raise PolicyError(f"must be true or false, got {value!r}", where=f"{where}.{key}")
    return value


def _timeout(spec: Mapping[str, Any], where: str) -> float | None:
    """``statement_timeout``: seconds, > 0 and under a day (threading.Timer takes it as is)."""
    if "statement_timeout" not in spec:
        return None
    return positive(spec["statement_timeout"], f"{where}.statement_timeout", upper=86400)


def _analyst(name: str, spec: Any, creds: Mapping[str, str], where: str, defaults: Defaults) -> AnalystPolicy:
    check_keys(spec, ANALYST_KEYS, {"epsilon_limit"}, where)  # epsilon_limit: every analyst needs an ε budget
    text = spec.get("verifier", creds.get(name))
    if text is None:
        raise PolicyError("no verifier (create one with `sqldp budget passwd NAME`)", where=f"{where}.verifier")
    if "verifier" in spec and name in creds:
        raise PolicyError("verifier given both here and in the credentials file", where=f"{where}.verifier")
    if not isinstance(text, str):
        raise PolicyError("must be a SCRAM-SHA-256 verifier string", where=f"{where}.verifier")
    privacy = parse_privacy(spec, where)
    # an analyst cannot pass --delta: a Laplace mechanism without a δ from the policy would refuse every
    # private query of theirs with a message about a flag they do not have, so the data owner hears it now
    mechanism = privacy.get("mechanism", defaults.mechanism)
    if mechanism in NEEDS_DELTA and privacy.get("delta", defaults.delta) is None:
        origin = f"mechanism = '{mechanism}'" if "mechanism" in privacy else f"[defaults] mechanism = '{mechanism}'"
        raise PolicyError(
            f"{origin} gives (ε, δ)-DP and needs a δ per query, which this analyst cannot pass: set delta here "
            f"or in [defaults] (and a delta_limit to spend it), or use mechanism = '{DEFAULT}'",
            where=f"{where}.mechanism" if "mechanism" in privacy else where,
        )
    return AnalystPolicy(
        name,
        text,
        positive(spec["epsilon_limit"], f"{where}.epsilon_limit", allow_zero=True),
        positive(spec.get("delta_limit", 0.0), f"{where}.delta_limit", allow_zero=True),
        privacy,
        _timeout(spec, where),
    )
