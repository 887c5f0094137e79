"""Operator edits from the config at start: root pools, adaptive limits, tenant nodes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from governor.authority import Authority
from governor.config import GovernordConfig
from governor.engine import ROOT_ID, Created, Engine, NodeState, Rate

__all__ = ["apply_config"]


def apply_config(authority: Authority, cfg: GovernordConfig) -> dict[str, tuple[str, int]]:
    """Operator edits from the config (no session): tenants under the root, root pools, AIMD.
    Returns key sha256 -> (tenant name, node id)."""

    def reconcile(e: Engine) -> dict[str, tuple[str, int]]:
        root = e.state.nodes[ROOT_ID]
        _caps_to(e, ROOT_ID, root.quotas, cfg.root_quotas, e.set_quota)
        _caps_to(e, ROOT_ID, root.limits, cfg.root_limits, e.set_limit)
        _rates_to(e, ROOT_ID, cfg.root_rates)
        for cls in sorted(set(e.state.adaptive) | set(cfg.adaptive)):
            want = cfg.adaptive.get(cls)
            have = e.state.adaptive.get(cls)
            if (have.config if have else None) != want:
                e.set_adaptive(cls, want)
        out: dict[str, tuple[str, int]] = {}
        for t in cfg.tenants:
            nid = next(
                (
                    c
                    for c in sorted(root.children)
                    if e.state.nodes[c].name == t.name
                    and e.state.nodes[c].state is NodeState.ACTIVE
                ),
                None,
            )
            if nid is None:
                created = e.create_node(
                    None,
                    ROOT_ID,
                    t.name,
                    quotas=t.quotas,
                    limits=t.limits,
                    weight=t.weight,
                    defaults=t.defaults,
                    rates=t.rates,
                )
                assert isinstance(created, Created)
                nid = created.node_id
            else:
                node = e.state.nodes[nid]
                _caps_to(e, nid, node.quotas, t.quotas, e.set_quota)
                _caps_to(e, nid, node.limits, t.limits, e.set_limit)
                if node.weight != t.weight:
                    e.set_weight(None, nid, t.weight)
                if node.defaults != t.defaults:
                    e.set_defaults(None, nid, t.defaults)
                _rates_to(e, nid, t.rates)
            out[t.key_sha256] = (t.name, nid)
        return out

    return authority.call(reconcile)


def _caps_to(
    e: Engine,
    node_id: int,
    have: dict[str, int],
    want: dict[str, int],
    setter: Callable[..., Any],
) -> None:
    for name in sorted(set(have) | set(want)):
        if have.get(name) != want.get(name):
            setter(None, node_id, name, want.get(name))


def _rates_to(e: Engine, node_id: int, want: dict[str, Rate]) -> None:
    """Make the node's rates the config's: set what differs, remove what the config dropped."""
    have = {r: b.rate for (n, r), b in e.state.credit.buckets.items() if n == node_id}
    for resource in sorted(set(have) | set(want)):
        if have.get(resource) != want.get(resource):
            e.set_rate(None, node_id, resource, want.get(resource))
