"""Consistent-hash ownership of RateKeys, with epochs (pure: no I/O)."""

from mesh.core.ring._ring import VNODES_DEFAULT, Ring

__all__ = ["Ring", "VNODES_DEFAULT"]
