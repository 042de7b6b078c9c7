"""The command line on PostgreSQL (``--engine postgres``, sqldp.engine.ENGINES): the session a command runs
on. Apart from the package, which the analyses import for its dialect: this module names the session."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sqldp.session import Session


def open_session(args: argparse.Namespace, limits: Mapping[str, Any]) -> Session:
    """The session a command runs on (``--dsn``, ``--data-dir``, ``--schema``, ``--policy``, ``--seed``)."""
    import sqldp

    return sqldp.connect(args.dsn, args.policy, schema=args.schema, data_dir=args.data_dir, seed=args.seed, **limits)
