"""From a NodeConfig to the node's parts: transport, membership source, policy source."""

from __future__ import annotations

from collections.abc import Callable

from mesh.config import NodeConfig
from mesh.coordinator import PolicySource
from mesh.core.admission import Counter
from mesh.core.quota import CellTier
from mesh.errors import ConfigError, PeerError
from mesh.membership import (
    DnsMembership,
    EtcdClient,
    EtcdMembership,
    MembershipSource,
    StaticMembership,
)
from mesh.peer import CoordinatorClient, GrpcTransport, PeerHandler, Transport, fetch_status

__all__ = [
    "build_transport",
    "build_membership",
    "build_policy_source",
    "build_redis",
    "claim_static_id",
]

STATIC_PROBE_S = 2.0  # how long the static identity check waits for our listed address


def build_transport(
    cfg: NodeConfig, member_id: str, worker_epoch: int, handler: PeerHandler
) -> Transport:
    return GrpcTransport(
        handler,
        member_id=member_id,
        worker_epoch=worker_epoch,
        listen=cfg.listen,
        advertise=cfg.advertise,
        tls=cfg.tls,
        max_message_bytes=cfg.max_message_bytes,
        fleet_secret=cfg.fleet_secret,
        fleet_secrets_accepted=cfg.fleet_secrets_accepted,
        is_member=ring_member(handler),
    )


def ring_member(handler: PeerHandler) -> Callable[[str], bool | None]:
    """Whether a member id may open a peer stream to us: the owner's own test (our ring, or
    departed from it within its grace: `Owner.is_member`). None until the node's driver has
    a first membership view, so a peer that dials a starting node retries, uncounted."""

    def is_member(member: str) -> bool | None:
        driver = getattr(handler, "driver", None)  # mesh.node._mesh._Handler, once started
        if driver is None or driver.membership_view.epoch == 0:
            return None
        with driver.lock:
            return bool(driver.member.owner.is_member(driver.clock_ns(), member))

    return is_member


def build_membership(cfg: NodeConfig, member_id: str, address: str) -> MembershipSource:
    m = cfg.membership
    if m is None:
        return StaticMembership({member_id: address})
    if m.source == "static":
        if member_id not in m.members:
            raise ConfigError(
                "membership.members",
                f"does not list this member {member_id!r}; known: "
                + ", ".join(sorted(m.members))
                + " (set member_id or member_id_env to one of them)",
            )
        return StaticMembership(m.members)
    if m.source == "dns":
        return DnsMembership(
            m.name,
            record=m.record,
            member_id=member_id,
            port=m.port,
            nameservers=m.nameservers,
            interval_ms=m.interval_ms,
            epoch_slot_ms=m.epoch_slot_ms,
        )
    return EtcdMembership(
        EtcdClient(m.endpoints),
        prefix=m.prefix,
        member_id=member_id,
        addr=address,
        lease_ttl_s=m.lease_ttl_s,
        retry_s=m.poll_ms / 1000,
    )


def build_policy_source(cfg: NodeConfig, member_id: str = "") -> PolicySource | None:
    """governord (or another coordinator), told which generations this node loads itself."""
    if cfg.coordinator is None:
        return None
    c = cfg.coordinator
    return CoordinatorClient(
        c.addr,
        tls=cfg.tls,
        api_key=c.api_key,
        server_ca=c.ca,
        declared=cfg.policies,
        member_id=member_id,
    )


def build_redis(cfg: NodeConfig) -> Counter | None:
    """Redis limits' shared counter, only when the config consents (shared_state.redis with
    external: allow). Lazy: it dials at the first admission of a redis limit."""
    if cfg.shared_state.redis is None:
        return None
    from mesh.sharedstate import RedisCounter  # redis-py loads only for a node that uses it

    return RedisCounter.from_config(cfg.shared_state.redis)


# The cell tier's round trips are a flush a second per quota key, off the event loop and
# off the hot path: they get a wider deadline than redis mode's 5 ms admission step.
CELL_TIER_DEADLINE_MS = 250


def build_cell_tier(cfg: NodeConfig) -> CellTier | None:
    """Spend quotas' shared cell tier (seed 002), when the config consents to a Redis or a
    PostgreSQL: the fold from the workers' cells there, beside the owners' (docs/quotas.md,
    docs/postgres.md). Lazy: nothing dials until the first flush."""
    if cfg.shared_state.postgres is not None:
        from mesh.sharedstate import PostgresCellTier

        return PostgresCellTier(cfg.shared_state.postgres, deadline_ms=CELL_TIER_DEADLINE_MS)
    if cfg.shared_state.redis is None:
        return None
    from mesh.sharedstate import RedisCellTier, redis_client

    return RedisCellTier(redis_client(cfg.shared_state.redis, deadline_ms=CELL_TIER_DEADLINE_MS))


async def claim_static_id(cfg: NodeConfig, member_id: str) -> None:
    """Static membership: ask the address the list gives for our id who serves there,
    before this node has a driver (so our own server answers with an empty status). An
    answer naming our id is another incarnation: ConfigError naming member_id. Nothing
    answering, or another id, is not a collision this check can see."""
    m = cfg.membership
    addr = m.members.get(member_id) if m is not None and m.source == "static" else None
    if not addr:
        return
    try:
        status = await fetch_status(  # proved as our streams are: the member may need it
            addr,
            tls=cfg.tls,
            timeout_s=STATIC_PROBE_S,
            fleet_secret=cfg.fleet_secret,
            target=member_id,
        )
    except PeerError:
        return
    if status.get("member_id") == member_id:
        raise ConfigError(
            "member_id",
            f"{member_id!r} is already served at {addr} by another live member "
            f"(worker_epoch {status.get('worker_epoch')}); give each process its own member_id",
        )
