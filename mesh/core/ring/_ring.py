"""The consistent-hash ring that picks one owner per RateKey.

A `Ring` is immutable: membership changes build a new one with a new `epoch`, so a message
stamped with an epoch can be checked against exactly the ring it was routed by. uhashring
places the members (md5 points, stable across processes and restarts); lookups are memoised
per ring because the same keys are routed again every sync interval.
"""

from __future__ import annotations

from collections.abc import Iterable

from uhashring import HashRing

from mesh.core._validate import check_int, check_str
from mesh.core.policy import RateKey
from mesh.errors import ConfigError

__all__ = ["Ring", "VNODES_DEFAULT"]

VNODES_DEFAULT = 160
_MEMO_MAX = 65_536  # bound on memoised lookups per ring; cleared wholesale when full


class Ring:
    """Members and an epoch. `owner_of` is a pure function of (members, vnodes, key)."""

    __slots__ = ("members", "epoch", "vnodes", "_hash", "_memo")

    def __init__(self, members: Iterable[str], epoch: int, *, vnodes: int = VNODES_DEFAULT):
        ids = sorted({check_str("member", m) for m in members})
        check_int("epoch", epoch, minimum=0)
        check_int("vnodes", vnodes, minimum=1, maximum=10_000)
        self.members: tuple[str, ...] = tuple(ids)
        self.epoch = epoch
        self.vnodes = vnodes
        self._hash = HashRing(nodes={m: {"vnodes": vnodes} for m in ids}) if ids else None
        self._memo: dict[RateKey, str] = {}

    def __len__(self) -> int:
        return len(self.members)

    def __contains__(self, member: object) -> bool:
        return member in self.members

    def forget_lookups(self) -> None:
        """Drop the memoised lookups (they hold their keys): after many keys went idle, so
        the memo does not keep them and what they pin in memory alive."""
        self._memo = {}

    def owner_of(self, key: RateKey) -> str:
        """The member that owns `key` in this ring."""
        owner = self._memo.get(key)
        if owner is not None:
            return owner
        if self._hash is None:
            raise ConfigError("ring", "has no members; no key has an owner")
        owner = self._hash.get_node(key.ring_token())
        if len(self._memo) >= _MEMO_MAX:
            self._memo.clear()
        self._memo[key] = owner
        return owner  # type: ignore[no-any-return]

    def owns(self, member: str, key: RateKey, epoch: int | None = None) -> bool:
        """Does `member` own `key` here (and, if given, is this the ring of `epoch`)?"""
        if epoch is not None and epoch != self.epoch:
            return False
        return bool(self.members) and self.owner_of(key) == member

    def places_like(self, other: Ring) -> bool:
        """Does `other` put every key where this ring does (same members and vnodes)?"""
        return self.members == other.members and self.vnodes == other.vnodes

    def with_members(self, members: Iterable[str], epoch: int | None = None) -> Ring:
        """The next ring: same placement rules, new membership, a larger epoch."""
        new_epoch = self.epoch + 1 if epoch is None else epoch
        if new_epoch <= self.epoch:
            raise ConfigError("epoch", f"must grow: {new_epoch} <= current {self.epoch}")
        return Ring(members, new_epoch, vnodes=self.vnodes)

    def __repr__(self) -> str:
        return f"Ring(epoch={self.epoch}, members={list(self.members)!r})"
