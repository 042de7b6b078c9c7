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

[analysts.alice]
verifier = "SCRAM-SHA-256$4096:…"         # from `sqldp budget passwd alice`; or in the credentials file
epsilon_limit = 10.0                      # total ε this analyst may spend (required)
delta_limit = 1e-5                        # total δ (default 0: (ε, δ) queries are refused)
epsilon = 0.5                             # per-query privacy parameters, overriding [defaults]
```

Relative paths are read relative to the policy file. Every unknown key is an error naming the file and key.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqldp.errors import InputError, PolicyError
from sqldp.policy import Policy
from sqldp.proxy.protocol import MAX_MESSAGE
from sqldp.proxy.scram import Verifier, parse_verifier

PROXY_KEYS = {"listen", "tls_cert", "tls_key", "credentials", "max_message_bytes", "workers", "pool_size"}
ANALYST_KEYS = {
    "verifier",
    "epsilon_limit",
    "delta_limit",
    "epsilon",
    "delta",
    "advantage",
    "mechanism",
    "confidence",
    "beta",
}
PRIVACY_KEYS = ("epsilon", "delta", "advantage", "mechanism", "confidence", "beta")


@dataclass(frozen=True)
class Analyst:
    name: str
    verifier: Verifier
    epsilon_limit: float
    delta_limit: float
    privacy: Mapping[str, Any] = field(default_factory=dict)  # keyword arguments for the runner


@dataclass(frozen=True)
class ProxyConfig:
    listen: tuple[str, int] = ("127.0.0.1", 6543)
    tls_cert: Path | None = None
    tls_key: Path | None = None
    max_message_bytes: int = MAX_MESSAGE
    workers: int = 16
    pool_size: int = 8
    analysts: Mapping[str, Analyst] = field(default_factory=dict)


def parse_listen(text: str, where: str) -> tuple[str, int]:
    if not isinstance(text, str):
        raise PolicyError(f"must be a string HOST:PORT, got {text!r}", where=where)
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    # ASCII digits only: str.isdigit() also admits '²', which int() refuses
    if not sep or not host or not (port.isascii() and port.isdigit()) or not 0 <= int(port) <= 65535:
        raise PolicyError(f"must be HOST:PORT, got {text!r}", where=where)
    return host, int(port)


def _unknown(d: Mapping[str, Any], allowed: set[str], where: str) -> None:
    extra = sorted(set(d) - allowed)
    if extra:
        raise PolicyError(f"unknown key (expected one of {', '.join(sorted(allowed))})", where=f"{where}.{extra[0]}")


def _number(value: Any, where: str, *, allow_zero: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(float(value)):
        raise PolicyError(f"must be a number, got {value!r}", where=where)
    if value < 0 or (value == 0 and not allow_zero):
        raise PolicyError(f"must be {'≥' if allow_zero else '>'} 0, got {value!r}", where=where)
    return float(value)


def _int(value: Any, where: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise PolicyError(f"must be an integer in [{lo}, {hi}], got {value!r}", where=where)
    return value


def _path(value: Any, base: Path, where: str) -> Path:
    if not isinstance(value, str) or not value:
        raise PolicyError(f"must be a file path, got {value!r}", where=where)
    p = Path(value).expanduser()
    return p if p.is_absolute() else base / p


def _credentials(path: Path, where: str) -> dict[str, str]:
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


def load(policy: Policy) -> ProxyConfig:
    """The proxy configuration from a loaded policy (``policy.raw`` keeps the sections unparsed)."""
    source = policy.source
    base = Path(source).parent if source and not source.startswith("<") else Path.cwd()
    raw = policy.raw
    proxy = raw.get("proxy", {})
    w = f"{source}: proxy"
    if not isinstance(proxy, dict):
        raise PolicyError("must be a TOML table", where=w)
    _unknown(proxy, PROXY_KEYS, w)
    listen = parse_listen(proxy["listen"], f"{w}.listen") if "listen" in proxy else ("127.0.0.1", 6543)
    cert = _path(proxy["tls_cert"], base, f"{w}.tls_cert") if "tls_cert" in proxy else None
    key = _path(proxy["tls_key"], base, f"{w}.tls_key") if "tls_key" in proxy else None
    if (cert is None) != (key is None):
        raise PolicyError("tls_cert and tls_key go together", where=f"{w}.{'tls_key' if key is None else 'tls_cert'}")
    creds: dict[str, str] = {}
    if "credentials" in proxy:
        cpath = _path(proxy["credentials"], base, f"{w}.credentials")
        creds = _credentials(cpath, f"{w}.credentials")
    analysts_raw = raw.get("analysts", {})
    if not isinstance(analysts_raw, dict):
        raise PolicyError("must be a table of tables", where=f"{source}: analysts")
    analysts: dict[str, Analyst] = {}
    for name, spec in analysts_raw.items():
        aw = f"{source}: analysts.{name}"
        if not isinstance(spec, dict):
            raise PolicyError("must be a TOML table", where=aw)
        _unknown(spec, ANALYST_KEYS, aw)
        text = spec.get("verifier", creds.get(name))
        if text is None:
            raise PolicyError("no verifier (create one with `sqldp budget passwd NAME`)", where=f"{aw}.verifier")
        if "verifier" in spec and name in creds:
            raise PolicyError("verifier given both here and in the credentials file", where=f"{aw}.verifier")
        if not isinstance(text, str):
            raise PolicyError("must be a SCRAM-SHA-256 verifier string", where=f"{aw}.verifier")
        try:
            verifier = parse_verifier(text, f"{aw}.verifier")
        except InputError as exc:  # from the verifier parser: report it as a policy problem, naming the key
            # (its base64 errors carry the key in the message and no 'where')
            message = exc.message if exc.where else "not a SCRAM-SHA-256 verifier (a part is not base64)"
            raise PolicyError(message, where=f"{aw}.verifier") from None
        if "epsilon_limit" not in spec:
            raise PolicyError("missing: every analyst needs an ε budget", where=f"{aw}.epsilon_limit")
        privacy: dict[str, Any] = {}
        for k in PRIVACY_KEYS:
            if k in spec:
                v = spec[k]
                if k == "mechanism":
                    if v not in ("cauchy", "laplace"):
                        raise PolicyError(f"must be 'cauchy' or 'laplace', got {v!r}", where=f"{aw}.{k}")
                else:
                    v = _number(v, f"{aw}.{k}", allow_zero=k == "beta")
                    if k in ("delta", "confidence", "advantage") and v >= 1:  # what the runner would refuse later
                        raise PolicyError(f"must be < 1, got {v!r}", where=f"{aw}.{k}")
                privacy[k] = v
        analysts[name] = Analyst(
            name,
            verifier,
            _number(spec["epsilon_limit"], f"{aw}.epsilon_limit", allow_zero=True),
            _number(spec.get("delta_limit", 0.0), f"{aw}.delta_limit", allow_zero=True),
            privacy,
        )
    for name in creds:
        if name not in analysts:
            raise PolicyError(
                "has a verifier but no [analysts] entry (and so no budget)", where=f"{w}.credentials: {name}"
            )
    return ProxyConfig(
        listen=listen,
        tls_cert=cert,
        tls_key=key,
        max_message_bytes=_int(proxy.get("max_message_bytes", MAX_MESSAGE), f"{w}.max_message_bytes", 1024, 1 << 26),
        workers=_int(proxy.get("workers", 16), f"{w}.workers", 1, 256),
        pool_size=_int(proxy.get("pool_size", 8), f"{w}.pool_size", 1, 256),
        analysts=analysts,
    )
