"""`Mesh`: one worker's mesh node, embedded in an asyncio app or a threaded one.

    async with Mesh(config) as mesh:        # asyncio: runs on the caller's loop
        verdict = mesh.try_admit("acme", "read_iops")

    mesh = Mesh(config); mesh.start()       # threads: a daemon thread runs the loop
    verdict = mesh.try_admit("acme", "read_iops")
    verdict = mesh.admit_blocking("acme", "read_iops", timeout_s=0.5)  # waits, bounded
    verdict = mesh.try_admit_detailed("acme", "read_iops")  # + remaining, retry_after_ms, ...
    mesh.stop()                             # graceful leave: flush, leave, drain

`try_admit` is synchronous and network-free in both: it reads the local view only, and
returns a shared verdict (no allocation). The one exception is a `redis`-mode limit: one
round trip to the shared counter, bounded at 5 ms, made with the node's lock released
(mesh/node/_redis.py, docs/redis.md). `try_admit_detailed` makes the same decision and
adds the view's numbers (`remaining`, `retry_after_ms`, `reset_after_ms`; docs/api.md);
it is what an API in front of the mesh calls. The waiting forms (`await admit()`,
`admit_blocking()`) wait on the node's loop, where the tenant queues are served at every
tick, and return detailed verdicts. Once stopping begins, every form answers the shared
STOPPED verdict (reason `stopped`), and `refund` does nothing.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

from mesh.aio import admit as _admit
from mesh.callsite import Limited
from mesh.config import NodeConfig, load_config, parse_config
from mesh.coordinator import PolicyFeed, PolicySource
from mesh.core.admission import (
    DEADLINE,
    REDIS_ASK,
    STOPPED,
    UNKNOWN,
    Counter,
    CreditDesk,
    RedisDesk,
)
from mesh.core.concurrency import SlotVerdict
from mesh.core.gate import STEPS
from mesh.core.member import Member
from mesh.core.messages import COOLDOWN_MS_MAX
from mesh.core.policy import BOUNDS, Mode, PolicyCache, TenantRatePolicy
from mesh.core.quota import QuotaDesk
from mesh.core.ring import Ring
from mesh.core.verdict import Numbers, Reason, Step, Verdict, shadowed, verdict
from mesh.errors import ConfigError
from mesh.membership import EtcdMembership, MembershipSource
from mesh.node._build import (
    build_cell_tier,
    build_membership,
    build_policy_source,
    build_redis,
    build_transport,
    claim_static_id,
)
from mesh.node._credit import CreditDriver
from mesh.node._driver import NodeDriver
from mesh.node._health import health, node_stats, probe_routes, status
from mesh.node._redis import RedisRounds
from mesh.node._reload import PolicyReloader
from mesh.node._slots import EGRESS_CHUNK_DEFAULT, Egress, Slot
from mesh.node._watch import DependencyWatch
from mesh.peer import CoordinatorClient, PeerHandler, Transport
from mesh.sidecar import Sidecar
from mesh.sidecar._items import _unknown_metric as unknown_metric  # the sidecar's words
from mesh.telemetry import Telemetry, telemetry_routes
from mesh.telemetry._dependencies import Dependencies
from ratemesh.logs import event
from ratemesh.policy import check_metric

__all__ = ["Mesh", "TransportFactory"]

# (member_id, worker_epoch, handler) -> Transport; the default builds the gRPC one.
TransportFactory = Callable[[str, int, PeerHandler], Transport]

log = logging.getLogger("mesh.node")
# How long a blocked thread waits past its own deadline for the node's loop to answer: the
# loop's timer gives the deadline verdict; this only bounds a loop that stopped answering.
ADMIT_GRACE_S = 2.0


class Mesh:
    def __init__(
        self,
        config: NodeConfig | dict[str, Any] | str | Path,
        *,
        transport: TransportFactory | None = None,
        membership: MembershipSource | None = None,
        policy_source: PolicySource | None = None,
        environ: dict[str, str] | None = None,
        count_decisions: bool = True,
        redis_counter: Counter | None = None,
    ) -> None:
        if isinstance(config, (str, Path)):
            config = load_config(config)
        elif isinstance(config, dict):
            config = parse_config(config)
        self.config = config
        self.identity = config.identity(environ)
        self._transport_arg = transport
        self._membership_arg = membership
        self._source_arg = policy_source
        # redis limits' shared counter: this one (tests, the simulator's MemoryCounter), else
        # the one shared_state.redis names (mesh.sharedstate), else none: nothing dials
        self._counter_arg = redis_counter
        self._counter: Counter | None = None
        self._rounds = RedisRounds(None, contextlib.nullcontext(), None)
        self._lock: threading.Lock | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._driver: NodeDriver | None = None
        self._sidecar: Sidecar | None = None  # the HTTP and gRPC servers beside the peer port
        self._watching: asyncio.Task[None] | None = None  # the dependencies' probes
        self._parked: set[asyncio.Future[Verdict]] = set()  # waiters stop() must release
        self._gate = threading.Lock()  # orders admit submissions against stop()
        self._closed = False
        self.address = ""  # the peer address, once started
        self.telemetry_address = ""
        self.sidecar_addresses: dict[str, str] = {}  # {"grpc": ..., "http": ...}, those on
        # Decisions by (tenant, metric, id(verdict)) for /metrics: about 0.3 us per call;
        # count_decisions=False drops that (and the admitted/denied families) from try_admit.
        self.count_decisions = count_decisions
        self.decisions: dict[tuple[str, str, int], int] = {}
        self.verdicts: dict[int, Verdict] = {}

    # -- the hot path ---------------------------------------------------------------------

    def try_admit(self, tenant: str, metric: str, amount: int = 1) -> Verdict:
        """Admit now or say why not: local, synchronous, no network (but for a redis-mode
        limit's one bounded round trip). A shared verdict (no numbers: `try_admit_detailed`
        has them); STOPPED once stopping began."""
        d = self._driver
        if d is None:
            raise ConfigError("mesh", "not started: use `async with Mesh(...)` or .start()")
        if self._lock is not None:
            with self._lock:  # the count too: `+=` on a shared dict is not atomic everywhere
                v = d.member.admission.try_admit(tenant, metric, amount)
                if v is REDIS_ASK:  # the round trip is made with the lock dropped
                    pending = self._rounds.begin(d.member.admission, tenant, metric, amount)
                elif self.count_decisions:
                    self._count(tenant, metric, v)
            if v is REDIS_ASK:
                return self._rounds.end(pending, tenant, metric, amount)[0]
            return v
        v = d.member.admission.try_admit(tenant, metric, amount)
        if v is REDIS_ASK:
            pending = self._rounds.begin(d.member.admission, tenant, metric, amount)
            return self._rounds.end(pending, tenant, metric, amount)[0]
        if self.count_decisions:
            try:  # count by the verdict's identity: verdicts are interned, shared values
                self.decisions[(tenant, metric, id(v))] += 1
            except KeyError:
                self._count_first(tenant, metric, v)
        return v

    def _count(self, tenant: str, metric: str, v: Verdict) -> None:
        """The unthreaded path's count, inlined there (a call costs the hot path)."""
        try:
            self.decisions[(tenant, metric, id(v))] += 1
        except KeyError:
            self._count_first(tenant, metric, v)

    def try_admit_detailed(self, tenant: str, metric: str, amount: int = 1) -> Verdict:
        """`try_admit`'s decision (counted the same way) as a fresh verdict carrying the
        view's numbers as of the node's last tick: `remaining`, `retry_after_ms` (0 when
        allowed; None when waiting cannot help), `reset_after_ms` (docs/api.md). The one
        call for an API in front of the mesh; `Verdict.to_dict()` is its JSON shape."""
        v, n = self.try_admit_numbers(tenant, metric, amount)
        return v if n is None else v.with_numbers(n)

    def try_admit_numbers(
        self, tenant: str, metric: str, amount: int = 1
    ) -> tuple[Verdict, Numbers | None]:
        """`try_admit_detailed` without building the detailed verdict: the shared verdict
        and the view's numbers (None with no view). For an API that encodes both onto a
        wire itself (the sidecar), so a batch item costs no Verdict of its own."""
        (answer,) = self.try_admit_numbers_many([(tenant, metric, amount)])
        if isinstance(answer, ConfigError):
            raise answer
        return answer

    def try_admit_numbers_many(
        self, rows: list[tuple[str, str, int]]
    ) -> list[tuple[Verdict, Numbers | None] | ConfigError]:
        """`try_admit_numbers` for each (tenant, metric, amount) in order, under one take of
        the node's lock (a sidecar batch). A row the node refuses (an invalid metric name,
        say) is its ConfigError in place of an answer; the rest are decided as usual. A
        redis row drops the lock for its round trip and takes it again for the rest. A spend
        quota's row is a detailed verdict (numbers None: it carries its own) with the
        disclosed lag beside the cap (`Verdict.quota`, docs/quotas.md)."""
        d = self._driver
        if d is None:
            raise ConfigError("mesh", "not started: use `async with Mesh(...)` or .start()")
        adm = d.member.admission
        admit, numbers = adm.try_admit, adm.numbers
        quotas = d.member.quotas
        count = self._count if self.count_decisions else None
        out: list[tuple[Verdict, Numbers | None] | ConfigError] = []
        i, n_rows = 0, len(rows)
        while i < n_rows:
            asked = None
            with self._lock or contextlib.nullcontext():
                while i < n_rows:
                    tenant, metric, amount = rows[i]
                    i += 1
                    try:
                        v = admit(tenant, metric, amount)
                    except ConfigError as exc:
                        out.append(exc)
                        continue
                    if v is REDIS_ASK:
                        pending = self._rounds.begin(adm, tenant, metric, amount)
                        asked = (pending, tenant, metric, amount)
                        break
                    if count is not None:
                        count(tenant, metric, v)
                    n = numbers(v, tenant, metric, amount)
                    if v.step is Step.QUOTA and n is not None and quotas is not None:
                        lag = quotas.lag_for(tenant, metric)
                        out.append((replace(v.with_numbers(n), quota=lag), None))
                        continue
                    out.append((v, n))
            if asked is not None:
                out.append(self._rounds.end(*asked))
        return out

    def _count_first(self, tenant: str, metric: str, v: Verdict) -> None:
        shared = v.shared()  # a detailed verdict counts as its shared equivalent
        self.verdicts[id(shared)] = shared  # kept alive, so its id is never reused
        k = (tenant, metric, id(shared))
        self.decisions[k] = self.decisions.get(k, 0) + 1

    def charge(self, tenant: str, metric: str, nbytes: int) -> Verdict:
        """Pre-charge a transfer chunk (byte metrics) before it is sent."""
        return self.try_admit(tenant, metric, nbytes)

    def refund(self, tenant: str, metric: str, amount: int) -> None:
        """Give back bytes charged and not sent (a short send). After `stop()` it does
        nothing (`Admission.refund`)."""
        d = self._require()
        if self._lock is None:
            d.member.admission.refund(tenant, metric, amount)
        else:
            with self._lock:
                d.member.admission.refund(tenant, metric, amount)

    async def admit(
        self, tenant: str, metric: str, amount: int = 1, *, timeout_s: float
    ) -> Verdict:
        """Wait (bounded) in the tenant's queue for capacity.

        On the node's own loop it waits in place. In threaded mode it may be awaited from
        any other loop too: the wait runs on the node's loop, where the queues are served.
        The verdict is detailed; one that waiting cannot change (`policy_unknown`,
        `too_large`, ...) comes at once (`mesh.aio.admit`). Stopping the node answers every
        waiter, and every later call, with STOPPED rather than leaving it to a deadline on
        a loop that is going away.
        """
        loop = self._admit_loop()
        if loop is None:
            return STOPPED
        adm = self._require().member.admission
        if self._rounds.applies(adm, tenant, metric):  # asks again itself, on this loop
            return await self._rounds.wait(adm, tenant, metric, amount, timeout_s, self._is_closed)
        coro = self._wait(tenant, metric, amount, timeout_s)
        if asyncio.get_running_loop() is loop:
            return await coro
        if self._lock is None:
            coro.close()
            raise ConfigError(
                "mesh",
                "admit() from another event loop needs the threaded "
                "mode (.start()); await it on the node's loop",
            )
        fut = self._submit(coro, loop)
        if fut is None:
            return STOPPED
        try:
            return await asyncio.wrap_future(fut)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if fut.cancelled() and self._closed and not (task and task.cancelling()):
                return STOPPED  # the node's loop went away under the wait
            raise

    def admit_blocking(
        self, tenant: str, metric: str, amount: int = 1, *, timeout_s: float
    ) -> Verdict:
        """`admit()` for threads: block this thread until the verdict, at most `timeout_s`.

        The wait runs on the node's loop (same queues, verdicts and errors as `admit()`,
        STOPPED once stopping began); this thread only blocks on its result. Called on the
        node's own loop thread it raises ConfigError instead of deadlocking: await
        `admit()` there.
        """
        loop = self._admit_loop()
        if loop is None:
            return STOPPED
        if threading.current_thread() is self._thread or _running_loop() is loop:
            raise ConfigError(
                "mesh",
                "admit_blocking() on the node's own event loop would deadlock; await admit() there",
            )
        adm = self._require().member.admission
        if self._rounds.applies(adm, tenant, metric):  # asks again itself, on this thread
            return self._rounds.wait_blocking(
                adm, tenant, metric, amount, timeout_s, self._is_closed
            )
        fut = self._submit(self._wait(tenant, metric, amount, timeout_s), loop)
        if fut is None:
            return STOPPED
        try:
            return fut.result(max(timeout_s, 0.0) + ADMIT_GRACE_S)
        except concurrent.futures.CancelledError:
            return STOPPED  # the node's loop went away under the wait
        except TimeoutError:
            if fut.cancel() or not fut.done():
                log.warning("admit_blocking: the node's loop did not answer in time")
                return DEADLINE
            return fut.result()  # answered just as we gave up

    def _is_closed(self) -> bool:
        return self._closed

    def _admit_loop(self) -> asyncio.AbstractEventLoop | None:
        """The loop a wait runs on; None once stopping began (the caller answers STOPPED)."""
        d = self._require()
        if self._closed:
            return None
        loop = self._loop if self._lock is not None else d.loop
        if loop is None:
            raise ConfigError("mesh", "not started")
        return loop

    async def _wait(self, tenant: str, metric: str, amount: int, timeout_s: float) -> Verdict:
        v = await _admit(
            self._require().member.admission,
            tenant,
            metric,
            amount,
            timeout_s=timeout_s,
            lock=self._lock,
            parked=self._parked,
        )
        if v.reason is Reason.POLICY_UNKNOWN:
            self._check_metric(metric)
        return v

    def _check_metric(self, metric: str) -> None:
        """A `policy_unknown` for a metric no policy of any tenant names, while the node has
        policies, is likelier a typo (`read_lops`) than a limit not configured yet: raise
        ConfigError naming it, as the sidecar answers (one message: `unknown_metric`)."""
        d = self._require()
        with self._lock or contextlib.nullcontext():
            if not d.member.policies.declared():
                return  # nothing loaded yet: every metric is unknown, and readiness says so
        why = unknown_metric(self, metric)
        if why is not None:
            raise ConfigError("metric", why.removeprefix("metric: "))

    def _submit(
        self, coro: Coroutine[Any, Any, Verdict], loop: asyncio.AbstractEventLoop
    ) -> concurrent.futures.Future[Verdict] | None:
        """Run `coro` on the node's loop, unless stop() got there first (then None)."""
        with self._gate:
            if not self._closed:
                try:
                    return asyncio.run_coroutine_threadsafe(coro, loop)
                except RuntimeError:  # the loop is already closed
                    pass
        coro.close()
        return None

    def _release_waiters(self) -> None:
        """Refuse new waits, stop the admission (every form answers STOPPED from here, and
        its queued waiters get it now), and answer any other parked one (on the node's
        loop)."""
        with self._gate:
            self._closed = True
        if self._driver is not None:
            with self._lock or contextlib.nullcontext():
                self._driver.member.admission.stop()
        for f in list(self._parked):
            if not f.done():
                f.set_result(STOPPED)

    # -- introspection --------------------------------------------------------------------

    @property
    def member_id(self) -> str:
        return self.identity.member_id

    @property
    def ring(self) -> Ring:
        return self._require().member.ring

    def health(self) -> dict[str, Any]:
        """/health's JSON. From another thread it is built on the node's loop."""
        d = self._require()
        loop = self._foreign_loop()
        if loop is not None:

            async def build() -> dict[str, Any]:
                return health(d)

            return asyncio.run_coroutine_threadsafe(build(), loop).result(10)
        return health(d)

    def reload_policies(self, trigger: str = "api") -> bool:
        """Re-read the node's policy file now (what SIGHUP does to `mesh node`): True if
        accepted, False if refused (logged; nothing changed). ConfigError naming
        `policies.file` when the node has none."""
        reloader = self._require().reloader
        if reloader is None:
            raise ConfigError("policies.file", "not set: this node has no policy file to reload")
        loop = self._foreign_loop()
        if loop is not None:  # on the node's loop, as its file watch reloads: one at a time

            async def on_loop() -> bool:
                return reloader.reload(trigger)

            return asyncio.run_coroutine_threadsafe(on_loop(), loop).result(10)
        return reloader.reload(trigger)

    def report_429(self, tenant: str, metric: str, cooldown_s: float = 90.0) -> None:
        """The service behind (`tenant`, `metric`)'s limit answered 429: back the whole fleet
        off. This worker admits nothing for it from now on; the key's owner tells every
        worker that uses the limit within d, and their verdicts say `suspended: cooldown`
        with the time left (`retry_after_ms`) until it ends (docs/cooldown.md)."""
        d = self._require()
        check_metric(metric, error=ConfigError)
        if type(tenant) is not str or not tenant:
            raise ConfigError("tenant", f"must be a non-empty string, got {tenant!r}")
        if isinstance(cooldown_s, bool) or not isinstance(cooldown_s, (int, float)):
            raise ConfigError("cooldown_s", f"must be a number of seconds, got {cooldown_s!r}")
        if not 0 < cooldown_s <= COOLDOWN_MS_MAX / 1000:
            raise ConfigError(
                "cooldown_s", f"must be in (0, {COOLDOWN_MS_MAX // 1000}], got {cooldown_s}"
            )
        ms = max(1, int(cooldown_s * 1000))
        loop = self._foreign_loop()
        if loop is not None:
            loop.call_soon_threadsafe(d.report_429, tenant, metric, ms)
            # cooled here at once too, so this thread's next try_admit already sees it
            with self._lock or contextlib.nullcontext():
                policy = d.member.policies.current(tenant, metric)
                if policy is not None:
                    d.member.admission.cool(tenant, metric, d.clock_ns() + ms * 1_000_000)
        else:
            d.report_429(tenant, metric, ms)

    def clear_429(self, tenant: str, metric: str) -> bool:
        """End (`tenant`, `metric`)'s cooldown on this worker, and at its owner if that is
        this member; False if it was not cooling here (docs/cooldown.md)."""
        return self._require().clear_429(tenant, metric)  # under the driver's lock

    def policy_known(self, tenant: str, metric: str) -> bool:
        """Whether a policy covers (`tenant`, `metric`) here (its own, or a default's); a
        metric that is no metric's name is a ConfigError naming `metric`."""
        d = self._require()
        check_metric(metric, error=ConfigError)
        with self._lock or contextlib.nullcontext():
            return d.member.policies.current(tenant, metric) is not None

    def policy_for(self, tenant: str, metric: str) -> TenantRatePolicy | None:
        """The policy that decides (`tenant`, `metric`) here (its own, or a default's), or
        None; a metric that is no metric's name is a ConfigError naming `metric`."""
        d = self._require()
        check_metric(metric, error=ConfigError)
        with self._lock or contextlib.nullcontext():
            return d.member.policies.current(tenant, metric)

    def metric_declared(self, metric: str) -> bool:
        """Whether any current policy, of any tenant, names `metric`: a name none does is
        likelier a typo than a limit not configured yet (the sidecar says so)."""
        d = self._require()
        with self._lock or contextlib.nullcontext():
            return d.member.policies.unit_of(metric) is not None

    def peek_numbers(self, tenant: str, metric: str) -> tuple[Verdict, Numbers | None]:
        """What an admission of one unit would see now, charging nothing (the sidecar's
        amount 0, Gubernator's hits=0): the view's verdict for one unit (`allowed` if it
        holds one) and its numbers. A limit this node has not used yet has no view, and
        opening one is a charge's job: it answers as a full view of its policy would
        (`remaining` its burst, nothing to wait for), with its mode's bound. A redis-mode
        limit's state is in Redis, which only a round trip reads: a ConfigError."""
        d = self._require()
        adm = d.member.admission
        with self._lock or contextlib.nullcontext():
            if adm.stopped:
                return STOPPED, None
            g = adm.gate(tenant, metric)  # a bad metric name: a ConfigError naming it
            policy = d.member.policies.current(tenant, metric) if g is None else g.policy
            if policy is not None and policy.mode is Mode.REDIS:
                raise ConfigError(
                    "amount",
                    f"0 (a peek) is not served for {metric}, a redis-mode limit: its state is "
                    "in Redis, and a peek makes no round trip; admit to see its numbers",
                )
            if g is not None:
                v = g.ok if g.avail >= 1 else shadowed(g.no) if g.no.shadow else g.no
                return v, adm.numbers(v, tenant, metric, 1)
        if policy is None:
            return UNKNOWN, None
        return _unused(policy)

    # -- in-flight slots and chunked egress (mesh.node._slots; docs/api.md) ----------------

    def acquire_slot(self, tenant: str, metric: str, *, ttl_ms: int | None = None) -> SlotVerdict:
        """Take one in-flight slot of a concurrency limit, or say why not: local, no
        network. `lease` on the verdict is what `release_slot` takes; with `ttl_ms` the
        slot is released by itself once it runs out (a client that may crash)."""
        d = self._require()
        check_metric(metric, error=ConfigError)
        with self._lock or contextlib.nullcontext():
            policy = d.member.policies.current(tenant, metric)
            if policy is None or policy.concurrency is None:
                raise ConfigError(
                    "metric",
                    f"{metric!r} has no concurrency limit for {tenant!r} here; slots are taken "
                    "under a policy with `concurrency: C`",
                )
            if policy.tenant_id != tenant:
                policy = policy.for_tenant(tenant)
            now_ms = d.clock_ns() // 1_000_000  # the clock the node's tick reports on
            desk = d.member.slots.desk
            desk.expire(now_ms)
            adm = d.member.admission
            return desk.acquire(policy, now_ms, adm.n_live, ttl_ms, stale=adm.membership_stale)

    def release_slot(self, lease: int) -> bool:
        """Give a slot back; False if it was not held (released, expired, unknown)."""
        d = self._require()
        with self._lock or contextlib.nullcontext():
            return d.member.slots.desk.release(lease)

    def slot(self, tenant: str, metric: str, *, timeout_s: float = 0.0) -> Slot:
        """A context manager (`with`, `async with`) holding one slot for its block; waits up
        to `timeout_s` for one. The block gets the SlotVerdict (`allowed` False: not held)."""
        return Slot(self, tenant, metric, timeout_s)

    def egress(
        self,
        tenant: str,
        expected_bytes: int,
        *,
        metric: str = "client_egress_bytes",
        chunk: int = EGRESS_CHUNK_DEFAULT,
    ) -> Egress:
        """A streamed response's bytes: `.sent(n)` charges whole chunks ahead, and the
        exit refunds what was charged and not sent (a short send)."""
        self._require()
        check_metric(metric, error=ConfigError)
        return Egress(self, tenant, metric, expected_bytes, chunk)

    def limited(
        self,
        tenant: str,
        metric: str,
        amount: int = 1,
        *,
        descriptor: Any = None,
        timeout_s: float | None = None,
        refund_on_error: bool = False,
    ) -> Limited:
        """A decorator and context manager (`with`, `async with`) that admits `amount` on
        enter, raises `RateLimited` when denied, and refunds what the block did not use
        (mesh.callsite; docs/api.md, call sites)."""
        return Limited(
            self,
            tenant,
            metric,
            amount,
            descriptor=descriptor,
            timeout_s=timeout_s,
            refund_on_error=refund_on_error,
        )

    def _foreign_loop(self) -> asyncio.AbstractEventLoop | None:
        """The node's running loop when called from another thread of a threaded node (what
        reads its state must then run there), else None."""
        loop = self._loop
        if (
            self._lock is not None
            and loop is not None
            and loop.is_running()
            and threading.current_thread() is not self._thread
        ):
            return loop
        return None

    def _require(self) -> NodeDriver:
        if self._driver is None:
            raise ConfigError("mesh", "not started")
        return self._driver

    # -- asyncio lifecycle ----------------------------------------------------------------

    async def __aenter__(self) -> Mesh:
        await self.astart()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def astart(self) -> None:
        cfg = self.config
        self._closed = False
        now = time.monotonic_ns()
        policies = PolicyCache(cfg.policies)
        ring = Ring([self.member_id], 0)
        worker_epoch = time.time_ns() // 1000  # grows across restarts: a new incarnation
        desk = None
        if cfg.strict is not None:  # strict limits spend governord credit (else fail closed)
            desk = CreditDesk(time.monotonic_ns, cfg.strict.credit)
        counter = self._counter_arg or build_redis(cfg)  # lazy: nothing dials yet
        self._counter = counter
        redis_desk = None if counter is None else RedisDesk(time.monotonic_ns)
        # Spend quotas run on the wall clock (UTC calendar periods, docs/quotas.md).
        quotas = QuotaDesk(self.member_id, policies, _wall_ms, publish_ms=cfg.core.quota_publish_ms)
        member = Member(
            self.member_id,
            worker_epoch,
            ring,
            policies,
            now,
            config=cfg.core,
            credit=desk,
            redis=redis_desk,
            quotas=quotas,
        )
        self._rounds = RedisRounds(
            counter,
            self._lock or contextlib.nullcontext(),
            self._count if self.count_decisions else None,
        )
        handler = _Handler()
        make = self._transport_arg or partial(build_transport, cfg)
        transport = make(self.member_id, worker_epoch, handler)
        self.address = await transport.start()
        membership: MembershipSource | None = None
        try:
            membership = self._membership_arg or build_membership(cfg, self.member_id, self.address)
            await self._claim_identity(membership)
            source = self._source_arg or build_policy_source(cfg, self.member_id)
        except BaseException:
            if membership is not None and membership is not self._membership_arg:
                await membership.close()
            await transport.close(0)
            raise
        feed = None
        if source is not None:
            poll_s = cfg.coordinator.poll_ttl_ms / 1000 if cfg.coordinator else 1.0
            feed = PolicyFeed(source, policies, poll_ttl_s=poll_s)
        tel = Telemetry(
            lambda: node_stats(driver),
            metric_declared=lambda m: driver.member.policies.unit_of(m) is not None,
            policy_of=lambda t, m: driver.member.policies.current(t, m),
        )
        tel.decisions, tel.verdicts = self.decisions, self.verdicts
        deps = Dependencies(time.monotonic)
        tel.registry.register(deps)  # ratemesh_dependency_up, ..._failures_total
        reloader = None
        if cfg.policy_file is not None:
            reloader = PolicyReloader(
                cfg.policy_file,
                policies,
                watch_ms=cfg.policy_watch_ms,
                lock=self._lock,
                on_loaded=_declare_to(source),
            )
        credit = None
        if cfg.strict is not None and desk is not None:

            def served() -> None:
                with driver.lock:
                    member.admission.service(time.monotonic_ns())

            lock = self._lock or contextlib.nullcontext()
            credit = CreditDriver(cfg.strict, desk, lock=lock, served=served)
        driver = NodeDriver(
            cfg,
            self.identity,
            member,
            transport,
            membership,
            feed,
            tel,
            lock=self._lock,
            reloader=reloader,
            credit=credit,
            redis=counter,
        )
        handler.driver = driver
        driver.cell_tier = build_cell_tier(cfg)  # None without shared_state.redis
        if self.count_decisions:  # a forgotten view's counts go with it (Telemetry.forget_view)
            member.admission.on_forget = tel.forget_view
        tel.shadow.source = member.admission.would_deny  # shadow posture's counts, at scrape
        self._driver = driver
        watch = driver.watch = DependencyWatch(driver, deps)
        # from before the first coordinator call, which resends for up to its timeout
        self._watching = asyncio.get_running_loop().create_task(
            watch.run(), name="mesh-dependencies"
        )
        try:
            await driver.start()
        except BaseException:
            self._watching.cancel()
            raise
        await watch.probe()  # what is known by now is said before "serving"
        # /metrics and /health (telemetry_listen) and the sidecar admission API, on uvicorn
        # and grpc beside the peer port (mesh/sidecar); a bind that fails stops the node
        routes = telemetry_routes(tel, lambda: health(driver))
        routes.update(probe_routes(watch))  # /health/live, /health/ready
        self._sidecar = Sidecar(
            self,
            cfg,
            routes,
            ready=lambda: not watch.ready_reasons(),  # gRPC health, as /health/ready
        )
        try:
            await self._sidecar.start()
        except BaseException:
            self._sidecar = None
            await self.aclose()
            raise
        self.telemetry_address = self._sidecar.telemetry_address
        self.sidecar_addresses = self._sidecar.addresses
        log.info(
            "member %s (%s, stable=%s) serving on %s",
            self.member_id,
            self.identity.source,
            self.identity.stable,
            self.address,
        )

    async def _claim_identity(self, membership: MembershipSource) -> None:
        """One id, one member: before serving, refuse to start (ConfigError naming
        member_id) if a live member already holds our id. etcd: our key held by another
        lease. static: the address listed for our id answers as our id; while we have no
        driver our own server's status is empty, so such an answer is another process.
        dns has nothing to check: records name addresses, and one address is one bind."""
        if isinstance(membership, EtcdMembership):
            await membership.join()
        elif self._membership_arg is None and self._transport_arg is None:
            await claim_static_id(self.config, self.member_id)

    async def aclose(self) -> None:
        self._release_waiters()
        if self._sidecar is not None:  # stop accepting callers before the peers go
            await self._sidecar.stop()
            self._sidecar = None
            event(log, logging.INFO, "closing: no new callers", name="shutdown_callers_stopped")
        if self._watching is not None:
            self._watching.cancel()
            self._watching = None
        if self._driver is not None and not self._driver.closing:
            await self._driver.close()
            close_tier = getattr(self._driver.cell_tier, "close", None)
            if close_tier is not None:
                close_tier()  # the PostgreSQL tier's connection (built from shared_state)
            left = self._driver.handover_keys_late
            event(
                log,
                logging.INFO,
                f"closing: left the ring, {self._driver.handover_keys} keys handed over",
                name="shutdown_left_ring",
                handover_keys=self._driver.handover_keys,
                handover_keys_late=left or None,
            )
        close = getattr(self._counter, "close", None)
        if close is not None and self._counter is not self._counter_arg:
            close()  # ours (built from shared_state.redis): its sockets go

    # -- threaded lifecycle ---------------------------------------------------------------

    def start(self, timeout_s: float = 10.0) -> Mesh:
        """Run the node's loop in a daemon thread (uvloop when installed)."""
        if self._thread is not None:
            raise ConfigError("mesh", "already started")
        self._lock = threading.Lock()
        started: Future[None] = Future()
        self._thread = threading.Thread(
            target=self._thread_main, args=(started,), name=f"mesh-{self.member_id}", daemon=True
        )
        self._thread.start()
        started.result(timeout_s)
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        """Graceful leave from another thread: flush, leave the ring, drain, stop."""
        if self._loop is None or self._thread is None:
            return
        with self._gate:  # no admit is submitted after this; aclose fails the parked ones
            self._closed = True
        fut = asyncio.run_coroutine_threadsafe(self.aclose(), self._loop)
        try:
            fut.result(timeout_s)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout_s)
            self._thread = None

    def _thread_main(self, started: Future[None]) -> None:
        loop = new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self.astart())
        except BaseException as exc:  # handed to the starting thread, which raises it
            started.set_exception(exc)
            loop.close()
            return
        started.set_result(None)
        try:
            loop.run_forever()
        finally:
            pending = asyncio.all_tasks(loop)
            for t in pending:
                t.cancel()
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.close()


def _unused(policy: TenantRatePolicy) -> tuple[Verdict, Numbers]:
    """A peek's answer for a limit with no view here yet: full, as a fresh view starts."""
    if not policy.enabled:
        bound, rate, n = BOUNDS["disabled"], None, Numbers(None, 0, None)
    elif policy.quota is not None:  # its cells are not folded here yet
        bound, rate, n = BOUNDS["quota_unfolded"], policy.limit_per_s, Numbers(None, 0, None)
    else:
        bound, rate, n = (
            BOUNDS[policy.mode.value],
            policy.limit_per_s,
            Numbers(policy.burst_units, 0, 0),
        )
    step = Step.POLICY if not policy.enabled else STEPS[policy.mode]
    return verdict(True, Reason.ADMITTED, policy.mode, bound, limit=rate, step=step), n


def _wall_ms() -> int:
    """Epoch milliseconds: spend quotas' periods are UTC calendar days and months."""
    return time.time_ns() // 1_000_000


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def new_event_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


class _Handler:
    """The transport's callbacks, bound to the driver once it exists."""

    driver: NodeDriver | None = None

    def deliver(self, message: Any) -> None:
        if self.driver is not None:
            self.driver.deliver(message)

    def link_reset(self, peer: str) -> None:
        if self.driver is not None:
            self.driver.link_reset(peer)

    def busy(self, sender: str) -> bool:
        """Flow control for a stream: `NodeDriver.busy`."""
        return self.driver is not None and self.driver.busy(sender)

    def status(self) -> dict[str, Any]:
        return {} if self.driver is None else status(self.driver)

    async def forget_member(self, name: str) -> dict[str, Any]:
        """Decommission `name`: its spend-quota cells purged here (`CellTierWriter`)."""
        if self.driver is None:
            raise ConfigError("member", "this member is starting: ask again")
        return await self.driver.tier.forget_member(name)


def _declare_to(source: object) -> Callable[[tuple[TenantRatePolicy, ...]], None] | None:
    """What tells a coordinator client the generations a reload loaded: it declares them,
    with those it had, at its next watch (so the coordinator refuses a push that would give
    one of them other values). None when the node has no coordinator client."""
    if not isinstance(source, CoordinatorClient):
        return None
    client = source

    def declare(loaded: tuple[TenantRatePolicy, ...]) -> None:
        known = {p.rate_key: p for p in client.declared}
        known.update((p.rate_key, p) for p in loaded)
        client.declared = tuple(known.values())

    return declare
