"""Stage 6, fleet: many nodes sharing one PostgreSQL store.

partition (a host's virtual partition: a stable hash of its host key mod P). Membership and
leases, and the fleet's one budget, build on it; their SQL lives in ``refresher/store/``.
"""

from refresher.fleet._budget import FleetBudget, FleetBudgetStatistics
from refresher.fleet._history import HistoryService
from refresher.fleet._partition import partition_of
from refresher.fleet._solve import FleetSolver, Solution

__all__ = [
    "FleetBudget",
    "FleetBudgetStatistics",
    "FleetSolver",
    "HistoryService",
    "Solution",
    "partition_of",
]
