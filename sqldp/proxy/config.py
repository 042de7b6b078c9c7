"""The proxy's configuration: the policy's ``[proxy]`` and ``[analysts.NAME]`` sections
(:mod:`sqldp.policy.analysts`, which checks every key), with each analyst's SCRAM verifier decoded and the
protocol's default message limit filled in.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqldp.errors import InputError, PolicyError
from sqldp.policy import Policy
from sqldp.policy.analysts import parse_listen, parse_proxy
from sqldp.proxy.protocol import MAX_MESSAGE
from sqldp.proxy.scram import Verifier, parse_verifier

__all__ = ["Analyst", "ProxyConfig", "load", "parse_listen"]


@dataclass(frozen=True)
class Analyst:
    name: str
    verifier: Verifier
    epsilon_limit: float
    delta_limit: float
    privacy: Mapping[str, Any] = field(default_factory=dict)  # keyword arguments for the runner
    # seconds a statement of this analyst may run upstream, then it is cancelled (None: no limit); the
    # analyst's own setting, else [proxy]'s (docs/proxy.md, "Statement timeout")
    statement_timeout: float | None = None


@dataclass(frozen=True)
class ProxyConfig:
    listen: tuple[str, int] = ("127.0.0.1", 6543)
    tls_cert: Path | None = None
    tls_key: Path | None = None
    max_message_bytes: int = MAX_MESSAGE
    workers: int = 16
    pool_size: int = 8
    analysts: Mapping[str, Analyst] = field(default_factory=dict)
    row_budget_fallback: bool = False  # [proxy] row_budget_fallback (sqldp.policy.analysts.ProxyPolicy)
    row_counts_epsilon: float = 0.0  # [proxy] row_counts_epsilon


def _verifier(text: str, where: str) -> Verifier:
    try:
        return parse_verifier(text, where)
    except InputError as exc:  # from the verifier parser: report it as a policy problem, naming the key
        # (its base64 errors carry the key in the message and no 'where')
        message = exc.message if exc.where else "not a SCRAM-SHA-256 verifier (a part is not base64)"
        raise PolicyError(message, where=where) from None


def load(policy: Policy) -> ProxyConfig:
    """The proxy configuration from a loaded policy (``policy.raw`` keeps the sections unparsed)."""
    spec = parse_proxy(policy)
    analysts = {
        name: Analyst(
            name,
            _verifier(a.verifier, f"{policy.source}: analysts.{name}.verifier"),
            a.epsilon_limit,
            a.delta_limit,
            a.privacy,
            a.statement_timeout if a.statement_timeout is not None else spec.statement_timeout,
        )
        for name, a in spec.analysts.items()
    }
    return ProxyConfig(
        listen=spec.listen,
        tls_cert=spec.tls_cert,
        tls_key=spec.tls_key,
        max_message_bytes=MAX_MESSAGE if spec.max_message_bytes is None else spec.max_message_bytes,
        workers=spec.workers,
        pool_size=spec.pool_size,
        analysts=analysts,
        row_budget_fallback=spec.row_budget_fallback,
        row_counts_epsilon=spec.row_counts_epsilon,
    )
