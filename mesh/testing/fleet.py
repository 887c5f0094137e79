"""An in-memory, deterministic fleet: real Members joined by a simulated network.

The in-memory transport beside the gRPC one (the httpx/uvicorn habit): tests, `mesh demo --memory`
and the simulator drive the same Member objects production runs, on a virtual clock.
Everything random comes from one `random.Random(seed)`; events at the same instant run in
the order they were scheduled, so a seed replays a run exactly.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from mesh.core.config import MS, CoreConfig
from mesh.core.effects import Effect, FetchPolicy, Send
from mesh.core.gcra import NS_PER_S, Gcra
from mesh.core.member import Member
from mesh.core.messages import Message
from mesh.core.policy import PolicyCache
from mesh.core.ring import Ring
from mesh.core.verdict import Verdict

__all__ = ["MemoryFleet", "Network", "Offered", "Scheduler", "SimpleNetwork", "drive"]


class Network(Protocol):
    """Decides the fate of one message: the delays of the copies that arrive (none: lost)."""

    def transit(self, src: str, dst: str, now_ns: int) -> list[int]: ...


class SimpleNetwork:
    """Uniform latency, independent loss and duplication, and pairs that are cut off."""

    def __init__(
        self,
        rng: random.Random,
        *,
        latency_ms: tuple[float, float] = (0.5, 1.5),
        loss: float = 0.0,
        duplicate: float = 0.0,
    ) -> None:
        self.rng = rng
        self.latency_ns = (int(latency_ms[0] * MS), int(latency_ms[1] * MS))
        self.loss = loss
        self.duplicate = duplicate
        self.cut: set[frozenset[str]] = set()  # pairs that cannot reach each other
        self.max_delay_ns = self.latency_ns[1]

    def transit(self, src: str, dst: str, now_ns: int) -> list[int]:
        if frozenset((src, dst)) in self.cut or self.rng.random() < self.loss:
            return []
        copies = 2 if self.rng.random() < self.duplicate else 1
        return [self.rng.randint(*self.latency_ns) for _ in range(copies)]


class Scheduler:
    """A virtual clock and its event queue; ties run in the order they were scheduled."""

    def __init__(self, start_ns: int = 0) -> None:
        self.now_ns = start_ns
        self._seq = 0
        self._queue: list[tuple[int, int, Callable[..., None], tuple[Any, ...]]] = []

    def at(self, t_ns: int, fn: Callable[..., None], *args: Any) -> None:
        self._seq += 1
        heapq.heappush(self._queue, (t_ns, self._seq, fn, args))

    def run_until(self, t_ns: int) -> None:
        queue = self._queue
        while queue and queue[0][0] <= t_ns:
            when, _, fn, args = heapq.heappop(queue)
            self.now_ns = when
            fn(*args)
        self.now_ns = t_ns


class MemoryFleet(Scheduler):
    """Members on one virtual clock, joined by a `Network` (loss, delay, duplication...).

    `skew_ns` shifts a member's clock: it is handed `now + skew`, as a member whose clock
    runs ahead or behind would see it.
    """

    def __init__(
        self,
        member_ids: Iterable[str],
        policies: PolicyCache,
        *,
        seed: int = 0,
        config: CoreConfig | None = None,
        latency_ms: tuple[float, float] = (0.5, 1.5),
        loss: float = 0.0,
        duplicate: float = 0.0,
        network: Network | None = None,
        start_ns: int = 0,
        on_member: Callable[[Member], None] | None = None,
    ) -> None:
        super().__init__(start_ns)
        self.config = config or CoreConfig()
        self.policies = policies
        self.rng = random.Random(seed)
        self.network: Network = network or SimpleNetwork(
            self.rng, latency_ms=latency_ms, loss=loss, duplicate=duplicate
        )
        self.skew_ns: dict[str, int] = {}
        self.max_delay_ns = 0
        self.messages = 0
        self.ring = Ring(member_ids, 1)
        self.members: dict[str, Member] = {}
        self._epochs: dict[str, int] = {}
        self.on_member = on_member  # told of every member started (e.g. to hook telemetry)
        for i, m in enumerate(self.ring.members):
            self._start(m, 1, offset_ns=i * self.config.sync_interval_ns // len(self.ring))

    @property
    def cut(self) -> set[frozenset[str]]:
        """The cut pairs of a SimpleNetwork (tests partition members through this)."""
        assert isinstance(self.network, SimpleNetwork)
        return self.network.cut

    def local_ns(self, member_id: str) -> int:
        return self.now_ns + self.skew_ns.get(member_id, 0)

    # -- members --------------------------------------------------------------------------

    def _start(self, member_id: str, epoch: int, offset_ns: int = 0) -> None:
        m = Member(
            member_id, epoch, self.ring, self.policies, self.local_ns(member_id), config=self.config
        )
        m.reporter.wake = lambda: self.at(self.now_ns, self._flush, m)
        self.members[member_id] = m
        self._epochs[member_id] = epoch
        if self.on_member is not None:
            self.on_member(m)
        self.at(self.now_ns + offset_ns, self._tick, m)

    def _alive(self, m: Member) -> bool:
        return self.members.get(m.member_id) is m

    def _tick(self, m: Member) -> None:
        if not self._alive(m):
            return
        self._carry(m.member_id, m.tick(self.local_ns(m.member_id)))
        self.at(self.now_ns + self.config.sync_interval_ns, self._tick, m)

    def _flush(self, m: Member) -> None:
        if self._alive(m):
            self._carry(m.member_id, m.flush(self.local_ns(m.member_id)))

    def crash(self, member_id: str, *, notice: bool = True) -> None:
        """The process dies: its state is gone. With `notice`, membership drops it now."""
        del self.members[member_id]
        if notice:
            self.set_ring([m for m in self.ring.members if m != member_id])

    def join(self, member_id: str) -> None:
        """A new member starts and enters the ring."""
        self._start(member_id, self._epochs.get(member_id, 0) + 1)
        if member_id not in self.ring:
            self.set_ring(list(self.ring.members) + [member_id])

    restart = join  # a crashed member comes back as a new incarnation (new worker_epoch)

    def leave(self, member_id: str, *, handover: bool = True) -> None:
        """Graceful leave: flush what is pending, hand the held keys to their next owners
        (`handover`), leave the ring, then stop."""
        m = self.members[member_id]
        now = self.local_ns(member_id)
        effects = m.flush(now)
        mine = [isinstance(e, Send) and e.to == member_id for e in effects]
        self._carry(member_id, [e for e, own in zip(effects, mine, strict=True) if not own])
        for e, own in zip(effects, mine, strict=True):
            if own and isinstance(e, Send):  # its own keys' reports: applied before hand-over
                m.deliver(now, e.message)
        if handover:
            self._carry(member_id, m.leave(now))
        self.set_ring([x for x in self.ring.members if x != member_id])
        del self.members[member_id]

    def set_ring(self, member_ids: Iterable[str]) -> None:
        self.ring = self.ring.with_members(member_ids)
        for mid, m in self.members.items():
            m.ring_changed(self.local_ns(mid), self.ring)

    # -- the network ----------------------------------------------------------------------

    def _carry(self, src: str, effects: list[Effect]) -> None:
        for e in effects:
            if isinstance(e, FetchPolicy):
                owner = self.members[src].owner
                self.at(self.now_ns + self.max_delay_ns, owner.policy_learned, e.rate_key)
            elif isinstance(e, Send):
                self._send(src, e.to, e.message)

    def _send(self, src: str, dst: str, msg: Message) -> None:
        if src == dst:  # a member's own keys: a local call in the node, not a message
            self.at(self.now_ns, self._deliver, dst, msg)
            return
        self.messages += 1
        for delay in self.network.transit(src, dst, self.now_ns):
            if delay > self.max_delay_ns:
                self.max_delay_ns = delay
            self.at(self.now_ns + delay, self._deliver, dst, msg)

    def _deliver(self, dst: str, msg: Message) -> None:
        m = self.members.get(dst)
        if m is not None:
            self._carry(dst, m.deliver(self.local_ns(dst), msg))

    # -- the workload's side --------------------------------------------------------------

    def try_admit(self, member_id: str, tenant: str, metric: str, amount: int = 1) -> Verdict:
        return self.members[member_id].admission.try_admit(tenant, metric, amount)

    def propagation_delay_ns(self) -> int:
        """d in the envelope: a report waits up to one sync interval, crosses the network,
        and the owner's answer crosses back (an owner tick may add one more interval)."""
        latency = self.max_delay_ns
        if isinstance(self.network, SimpleNetwork):
            latency = max(latency, self.network.latency_ns[1])
        return 2 * self.config.sync_interval_ns + 2 * latency


class Offered:
    """One tenant's demand in `drive`, and what it got beside the ideal.

    The ideal is one exact GCRA that sees every request of the fleet in time order: the
    admissions a perfectly coordinated limiter would make. `max_excess` is the largest lead
    of the fleet's cumulative admissions over the ideal's, at any instant.
    """

    def __init__(self, tenant: str, per_s: float, *, metric: str = "read_iops") -> None:
        self.tenant = tenant
        self.metric = metric
        self.per_s = per_s
        self.offered = 0
        self.admitted = 0
        self.ideal = 0
        self.max_excess = 0
        self.meter: Gcra | None = None
        self.scale = 1  # the policy's sub-units per unit

    def report(self) -> dict[str, Any]:
        return {
            "offered": self.offered,
            "admitted": self.admitted,
            "ideal": self.ideal,
            "max_excess": self.max_excess,
        }


def drive(fleet: MemoryFleet, demand: list[Offered], until_ns: int, *, step_ns: int = MS) -> None:
    """Offer each tenant's demand, spread over the live workers with random jitter, one
    step at a time until `until_ns`, counting what the fleet and the ideal admit."""
    carry: dict[tuple[str, str], float] = {}
    t = fleet.now_ns
    while t < until_ns:
        t += step_ns
        fleet.run_until(t)
        workers = sorted(fleet.members)
        for d in demand:
            if d.meter is None:
                policy = fleet.policies.current(d.tenant, d.metric)  # type: ignore[arg-type]
                assert policy is not None, f"no policy for {d.tenant}"
                d.meter = Gcra(policy.target_rate, policy.global_burst, t)
                d.scale = policy.scale  # the ideal meter is in sub-units too
            per_step = d.per_s * step_ns / NS_PER_S / len(workers)
            for w in workers:
                c = carry.get((d.tenant, w), 0.0) + per_step * (0.5 + fleet.rng.random())
                n = int(c)
                carry[d.tenant, w] = c - n
                for _ in range(n):
                    d.offered += 1
                    d.admitted += fleet.try_admit(w, d.tenant, d.metric).allowed
                    d.ideal += d.meter.try_take(t, d.scale)
            if d.admitted - d.ideal > d.max_excess:
                d.max_excess = d.admitted - d.ideal
