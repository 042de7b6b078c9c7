"""The ``sqldp`` command line.

``sqldp <command> [--dsn DSN] [--schema DDL.sql] [--policy POLICY.toml] [--format text|json] [QUERY | -f FILE]``

Every user mistake ends as one line on stderr and exit code 2; a database that cannot be reached, exit 1.
Set ``SQLDP_DEBUG=1`` to see tracebacks of internal errors.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from sqldp import __version__
from sqldp.errors import InputError, SqldpError

COMMAND_MODULES = ("db", "explain", "analyze", "demo", "epsilon", "policy", "budget", "analyst", "proxy", "completion")


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad flag as one line (and exit 2), not usage plus message."""

    def error(self, message: str) -> NoReturn:
        if message.startswith("unrecognized arguments:"):
            # argparse lists every leftover token, the query text too; the flags are what was mistyped
            flags = [t for t in message.split(":", 1)[1].split() if t.startswith("-")]
            message = f"unrecognized arguments: {' '.join(flags)}" if flags else message
        # the top-level parser's name is already the line's "sqldp:" prefix
        raise InputError(message, where=None if self.prog == "sqldp" else self.prog)

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        """argparse keeps the last of a repeated option; a repeated ``--epsilon 1 --epsilon 100`` is more likely
        a mistake than a wish, so an option that takes one value may be given once (``--radius`` and the
        other ``append`` options may repeat)."""
        tokens = list(sys.argv[1:] if args is None else args)
        seen: set[str] = set()
        for token in tokens:
            if token == "--":
                break
            name = token.split("=", 1)[0]
            action = self._option_string_actions.get(name)
            if action is None or isinstance(action, (argparse._AppendAction, argparse._CountAction)):
                continue
            if isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
                continue
            key = action.dest
            if key in seen:
                self.error(f"{name} is given more than once")
            seen.add(key)
        return super().parse_known_args(tokens, namespace)


def common_options(*, query: bool = True, policy: bool = True, schema: bool = True) -> argparse.ArgumentParser:
    """Options shared by the commands."""
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("database")
    g.add_argument("--dsn", help="PostgreSQL connection string (default: $SQLDP_DSN, else the embedded server)")
    g.add_argument("--data-dir", help="embedded server home (default: $SQLDP_HOME or the per-user data dir)")
    if schema:
        g.add_argument(
            "--schema", metavar="DDL.sql", help="read tables and keys from a DDL file instead of the database"
        )
    if policy:
        p.add_argument("--policy", metavar="POLICY.toml", help="privacy policy (default: every table private)")
    p.add_argument("--format", choices=("text", "json"), default="text", help="output format")
    if query:
        p.add_argument("query", nargs="?", help="the SQL query")
        p.add_argument("-f", "--file", metavar="FILE", help="read the query from FILE ('-' for stdin)")
    return p


def read_query(args: argparse.Namespace) -> str:
    if args.query and args.file:
        raise InputError("give the query either as an argument or with -f, not both", where="-f")
    if args.file:
        if args.file == "-":
            return sys.stdin.read()
        try:
            return Path(args.file).read_text(encoding="utf-8")
        except OSError as exc:
            raise InputError(f"cannot read query file: {exc.strerror}", where=args.file) from None
    if args.query is not None:
        return str(args.query)
    raise InputError("no query given (pass it as an argument or with -f FILE)")


def emit(args: argparse.Namespace, payload: dict[str, Any], text: Callable[[dict[str, Any]], str]) -> None:
    if args.format == "json":
        print(json.dumps(payload, indent=2, default=str, allow_nan=False))
    else:
        print(text(payload))


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="sqldp", description="Differentially private answers to PostgreSQL queries.")
    parser.add_argument("--version", action="version", version=f"sqldp {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    import importlib

    for name in COMMAND_MODULES:
        importlib.import_module(f"sqldp.commands.{name}").register(sub)
    return parser


def _wants_json(argv: Sequence[str] | None) -> bool:
    """Whether the command line asks for ``--format json``, read from the tokens themselves: an error may come
    before (or from) parsing them."""
    tokens = list(sys.argv[1:] if argv is None else argv)
    tokens = tokens[: tokens.index("--")] if "--" in tokens else tokens
    pairs = zip(tokens, [*tokens[1:], ""], strict=True)
    return any(t == "--format=json" or (t == "--format" and nxt == "json") for t, nxt in pairs)


def _error(message: str, where: str | None, as_json: bool) -> None:
    """One line on stderr: ``sqldp: error: where: message``, or under ``--format json`` the object
    ``{"error": message, "where": where}`` (where null when the problem has no place)."""
    if as_json:
        print(json.dumps({"error": " ".join(message.split()), "where": where}, ensure_ascii=False), file=sys.stderr)
    else:
        print(f"sqldp: error: {f'{where}: ' if where else ''}{' '.join(message.split())}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    as_json = _wants_json(argv)
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        if not getattr(args, "func", None):
            parser.print_help(sys.stderr)
            return 2
        return int(args.func(args) or 0)
    except SqldpError as err:
        _error(err.message, err.where, as_json)
        return err.exit_code
    except KeyboardInterrupt:
        print("sqldp: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:  # a bug in sqldp: still one line unless asked for more
        if os.environ.get("SQLDP_DEBUG"):
            traceback.print_exc()
        text = f"{exc.__class__.__name__}: {exc} (set SQLDP_DEBUG=1 for details)"
        if as_json:
            _error(f"internal error: {text}", None, True)
        else:
            print(f"sqldp: internal error: {text}", file=sys.stderr)
        return 70


if __name__ == "__main__":
    sys.exit(main())
