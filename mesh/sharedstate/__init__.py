"""Shared-state tiers beside the mesh (seed 002): Redis-backed stores the node may attach."""

from mesh.sharedstate._cells import RedisCellTier as RedisCellTier
