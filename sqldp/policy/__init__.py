"""The data owner's privacy policy (a TOML file): every section is parsed and checked here.

============  =====================================================================================
module        what it reads
============  =====================================================================================
document      the file as a whole (:class:`Policy`) and ``[defaults]``
tables        ``[tables.T]``: private rows and their weight, the norm over sensitive columns, per
              column ranges, GROUP BY domains, DATE units and ``knowledge``
priors        a column's ``knowledge``: the attacker's prior (NR §3.3.11.1, Fig. 44)
goals         ``[[goals]]``: what an attacker must not learn (NR §3.3.10)
units         ``[units.NAME]`` and ``[[foreign_keys]]``: privacy units and the tables that belong to them
analysts      ``[proxy]`` and ``[analysts.NAME]``, read when a proxy starts
keys          the one check of every table's keys
values        numbers and dates as the file writes them
============  =====================================================================================

The computations built on these — ε from a guessing-advantage goal (:mod:`sqldp.advantage`), the
probabilities of a prior (:mod:`sqldp.priors`) — import from this package, never the other way round.
"""

from __future__ import annotations

from sqldp.policy.analysts import AnalystPolicy, ProxyPolicy, parse_listen, parse_proxy
from sqldp.policy.document import PRIVACY_KEYS, Defaults, Policy, parse_privacy
from sqldp.policy.goals import Attribute, Combine, Goal, parse_goals
from sqldp.policy.keys import check_keys
from sqldp.policy.priors import UNKNOWN, Knowledge, parse_cli_prior, parse_knowledge
from sqldp.policy.tables import (
    DAYS_PER_UNIT,
    MAX_DOMAIN,
    MAX_NORM_CHARS,
    MAX_NORM_DEPTH,
    MAX_P,
    MAX_WEIGHT,
    MIN_WEIGHT,
    ColumnPolicy,
    Norm,
    NormTerm,
    TablePolicy,
    parse_norm,
)
from sqldp.policy.units import Reference, Unit
from sqldp.policy.values import EPOCH, MAX_BOUND, to_number

__all__ = [
    "DAYS_PER_UNIT",
    "EPOCH",
    "MAX_BOUND",
    "MAX_DOMAIN",
    "MAX_NORM_CHARS",
    "MAX_NORM_DEPTH",
    "MAX_P",
    "MAX_WEIGHT",
    "MIN_WEIGHT",
    "PRIVACY_KEYS",
    "UNKNOWN",
    "AnalystPolicy",
    "Attribute",
    "ColumnPolicy",
    "Combine",
    "Defaults",
    "Goal",
    "Knowledge",
    "Norm",
    "NormTerm",
    "Policy",
    "ProxyPolicy",
    "Reference",
    "TablePolicy",
    "Unit",
    "check_keys",
    "parse_cli_prior",
    "parse_goals",
    "parse_knowledge",
    "parse_listen",
    "parse_norm",
    "parse_privacy",
    "parse_proxy",
    "to_number",
]
