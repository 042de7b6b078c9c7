"""``sqldp analyst add NAME --policy FILE [--epsilon-limit E]``: let an analyst log in to the proxy.

It asks for the analyst's password (twice, or once from ``--password-stdin``), makes the SCRAM-SHA-256 verifier
``sqldp budget passwd`` makes (only the verifier is stored, never the password), and writes ``[analysts.NAME]``
with that verifier and the ε limit into the policy file — or the verifier into the credentials file when the
policy keeps verifiers apart (``[proxy] credentials``). ``--from POLICY`` starts a new file from a shipped
policy (``tpch``) or another file, since a shipped policy is not for editing. The result is checked as the
proxy will read it (every key, every verifier) before it replaces the file; the file is replaced whole, by a
rename, so a failed write leaves the old one.
"""

from __future__ import annotations

import argparse
import getpass
import json
import math
import os
import re
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sqldp.errors import InputError

BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")  # a TOML bare key; any other name is written quoted


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("analyst", help="add an analyst who may log in to the proxy (writes the policy file)")
    p.add_argument("action", choices=("add",), help="add: a verifier and an ε limit for NAME")
    p.add_argument("name", metavar="NAME", help="the analyst's login name")
    p.add_argument(
        "--policy", metavar="POLICY.toml", required=True, help="the policy file to write (created with --from)"
    )
    p.add_argument(
        "--from",
        dest="source",
        metavar="POLICY",
        help="when --policy does not exist yet: start it from this policy (a shipped name such as tpch, or a file)",
    )
    p.add_argument(
        "--epsilon-limit", type=float, default=1.0, metavar="E", help="the total ε NAME may spend (default 1)"
    )
    p.add_argument("--delta-limit", type=float, metavar="D", help="the total δ (default 0: (ε, δ) queries refused)")
    p.add_argument("--password-stdin", action="store_true", help="read the password from standard input")
    p.add_argument("--format", choices=("text", "json"), default="text", help="output format")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from sqldp.datasets import read_shipped
    from sqldp.policy.document import Policy
    from sqldp.proxy.config import load as proxy_config
    from sqldp.proxy.scram import make_verifier

    name = args.name
    if not name or name != name.strip() or any(ord(c) < 32 for c in name):
        raise InputError("an analyst name is a non-empty name without surrounding blanks or control characters")
    for flag, value, high in (("--epsilon-limit", args.epsilon_limit, 1e6), ("--delta-limit", args.delta_limit, 1)):
        if value is not None and not (math.isfinite(value) and 0 <= value <= high):
            raise InputError(f"must be a number in [0, {high:g}], got {value!r}", where=flag)
    target = Path(args.policy)
    if target.exists():
        if args.source:
            raise InputError(f"{target} exists already; --from only starts a new file", where="--from")
        text = _read(target)
    elif args.source:
        text, _ = read_shipped(args.source, ".toml", "policy")
    else:
        raise InputError(
            "no such file; give --from POLICY to start it (e.g. --from tpch, the shipped TPC-H policy)",
            where=str(target),
        )
    policy = Policy.from_toml(text, source=str(target))  # the file as it is must load before it is changed
    analysts = policy.raw.get("analysts", {})
    if isinstance(analysts, dict) and name in analysts:
        raise InputError(f"analyst {name!r} is in the policy already", where=f"{target}: analysts.{name}")
    credentials = _credentials_file(policy.raw, target)
    password = _password(name, args.password_stdin)
    verifier = make_verifier(password)
    key = name if BARE_KEY.fullmatch(name) else json.dumps(name)
    entry = [f"\n[analysts.{key}]  # added by sqldp analyst add"]
    if credentials is None:
        entry.append(f'verifier = "{verifier}"')
    entry.append(f"epsilon_limit = {args.epsilon_limit!r}")
    if args.delta_limit is not None:
        entry.append(f"delta_limit = {args.delta_limit!r}")
    new_policy = text.rstrip("\n") + "\n" + "\n".join(entry) + "\n"
    writes = {target: new_policy}
    if credentials is not None:
        old = _read(credentials) if credentials.exists() else ""
        if re.search(rf"^\s*{re.escape(key)}\s*=", old, re.MULTILINE):
            raise InputError(f"analyst {name!r} has a verifier already", where=f"{credentials}: {name}")
        writes[credentials] = (old.rstrip("\n") + "\n" if old.strip() else "") + f'{key} = "{verifier}"\n'
    # check the result as the proxy reads it (the policy's keys, each analyst's verifier and limits) before
    # anything is written: a file that would not load is never left behind. Written to temporary files first,
    # since the credentials file is read by path
    staged = {path: _stage(path, content, private=path == credentials) for path, content in writes.items()}
    try:
        if credentials is not None:
            checked = Policy.from_toml(new_policy, source=str(target))
            raw_proxy = dict(checked.raw.get("proxy", {}))
            raw_proxy["credentials"] = str(staged[credentials].resolve())
            checked = Policy.from_dict({**checked.raw, "proxy": raw_proxy}, source=str(target))
        else:
            checked = Policy.from_toml(new_policy, source=str(target))
        if name not in proxy_config(checked).analysts:
            raise InputError(f"analyst {name!r} was written but does not load", where=str(target))
        for path, tmp in staged.items():
            os.replace(tmp, path)
    finally:
        for tmp in staged.values():
            tmp.unlink(missing_ok=True)
    where = f"{target}" + (f" (verifier in {credentials})" if credentials is not None else "")
    if args.format == "json":
        out = {
            "analyst": name,
            "policy": str(target),
            "credentials": str(credentials) if credentials is not None else None,
            "epsilon_limit": args.epsilon_limit,
            "delta_limit": args.delta_limit or 0.0,
        }
        print(json.dumps(out))
    else:
        print(f"added analyst {name} (ε limit {args.epsilon_limit:g}) to {where}; start: sqldp proxy --policy {target}")
    return 0


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror}", where=str(path)) from None


def _credentials_file(raw: Mapping[str, Any], policy: Path) -> Path | None:
    """The credentials file the policy names (``[proxy] credentials``, relative to the policy), or None."""
    proxy = raw.get("proxy", {})
    value = proxy.get("credentials") if isinstance(proxy, dict) else None
    if value is None:
        return None
    path = Path(str(value))
    return path if path.is_absolute() else policy.parent / path


def _password(name: str, from_stdin: bool) -> str:
    if from_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    else:
        password = getpass.getpass(f"password for {name}: ")
        if getpass.getpass("again: ") != password:
            raise InputError("the passwords do not match", where="password")
    if not password:
        raise InputError("an empty password is refused", where="password")
    return password


def _stage(path: Path, content: str, *, private: bool) -> Path:
    """``content`` in a new file beside ``path`` (same directory, so the rename is atomic), with ``path``'s mode
    when it exists (a credentials file stays private), else 0600 for credentials and the umask's for policies."""
    directory = path.parent if str(path.parent) else Path(".")
    if not directory.is_dir():
        raise InputError(f"directory {str(directory)!r} does not exist", where=str(path))
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(content)
        mode = path.stat().st_mode & 0o777 if path.exists() else None
        if mode is None and private:
            mode = 0o600
        elif mode is None:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask
        os.chmod(name, mode)
    except OSError as exc:
        Path(name).unlink(missing_ok=True)
        raise InputError(f"cannot write: {exc.strerror}", where=str(path)) from None
    return Path(name)
