"""Hosts to partitions: the first tier of the fleet's two-tier partitioning.

A host belongs to one of P virtual partitions for ever (P is fixed when the fleet is created);
partitions, not hosts, move between nodes through leases. The hash is BLAKE2b (8-byte digest)
of the host key's UTF-8 bytes, read as an unsigned big-endian integer, mod P: the same in
every process, on every machine and in every Python run (Python's ``hash`` is salted).
"""

from __future__ import annotations

import hashlib

__all__ = ["partition_of"]


def partition_of(host_key: str, partitions: int) -> int:
    """The partition (0 … ``partitions`` − 1) of a host key such as ``"example.org:8080"``."""
    if partitions < 1:
        raise ValueError(f"partitions must be at least 1, got {partitions}")
    digest = hashlib.blake2b(host_key.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % partitions
