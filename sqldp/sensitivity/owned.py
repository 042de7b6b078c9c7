"""The plan of the selector of groups owned by one row (sqldp.strategies.owned has the analysis and the argument:
docs/sql.md, "Groups owned by one row"); here, with the other plans, so that the release step reads it without
importing a strategy."""

from __future__ import annotations

from dataclasses import dataclass

from sqldp.sensitivity.global_bound import GlobalPlan

# the most groups a release shows when the values' noise scale is read from the data (sqldp.strategies.owned's
# docstring, "One noise scale for every group"); a global bound shows every group selected
SHARED_SCALE_GROUPS = 1


@dataclass(frozen=True)
class OwnedSelection(GlobalPlan):
    """The selector of owned groups: each present group's indicator min(1, COUNT(*)), 1 on both sides of a
    common group (bound 1), thresholded for ``groups_per_change`` one-sided groups (sqldp.strategies.owned)."""

    groups_per_change: int = 1

    @property
    def spends_epsilon(self) -> bool:
        """Its indicator is 1 on both sides of a common group: only δ protects it (no ε share)."""
        return False

    @property
    def owned_groups(self) -> int | None:
        return self.groups_per_change

    def expected_bound(self) -> float | None:
        return None  # calibrated apart (sqldp.release: Laplace of scale 1, thresholded by δ alone)
