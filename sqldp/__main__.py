"""``python -m sqldp``: the same command line as ``sqldp``."""

from sqldp.cli import main

raise SystemExit(main())
