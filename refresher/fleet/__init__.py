"""Stage 6, fleet: many nodes sharing one PostgreSQL store.

partition (a host's virtual partition: a stable hash of its host key mod P). Membership and
leases, and the fleet's one budget, build on it; their SQL lives in ``refresher/store/``.
"""

from refresher.fleet._partition import partition_of

__all__ = ["partition_of"]
