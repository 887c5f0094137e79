"""The global mode's fleet envelope, checked on real members from outside.

Over every interval [t0, t1], the units all workers admitted must stay within
`R*(t1-t0) + B + N*b + R*d`. Each test records every admission's instant at the caller
(`time.monotonic_ns`) and hands the history to an independent checker
(tests/mesh/_envelope.py), which knows nothing of the mesh's own counters.

* Traffic that migrates between members and back, with an idle longer than `views_idle_ms`
  on the member it comes back to: embedded `Mesh` members on loopback gRPC.
* Random adversarial schedules (migrations, on/off bursts, idles below and past the snapshot
  TTL and `views_idle_ms`, amounts from 1 to above b and B) through `mesh node` processes'
  sidecar gRPC API, each schedule on its own tenant; every one printed with its seed.

d, the propagation delay in `N*b + R*d`, is taken generously: two sync intervals plus the
largest d any member reports on /health (`d_ms`, `ratemesh.envelope.d_estimate_ns`, which counts
the worst recent lateness of its sync tick: a view expires only when its tick runs), plus the
caller's worst round trip to the sidecar (an admission's instant is known to that much).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import gc
import os
import secrets
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
import yaml

from bench._procs import free_port, read_ready, spawn, stop
from mesh.core.policy import Metric, RateKey
from mesh.core.ring import Ring
from mesh.node import Mesh
from mesh.sidecar import admission_pb2 as pb
from tests.mesh._adversary import (
    RETRY_EVERY_MS,
    RETRY_FOR_MS,
    Answer,
    Judgement,
    Offer,
    Request,
    Schedule,
    judge,
    make_schedule,
)
from tests.mesh._envelope import NS, Admission, violations, worst_interval
from tests.mesh._util import static_nodes, until

pytestmark = pytest.mark.slow  # real gRPC between members, seconds of traffic

SYNC_MS = 5
METRIC = "read_iops"


def _owned_by(owner: str, ids: list[str], prefix: str) -> str:
    """A tenant name whose key the ring gives to `owner` (static membership, one ring)."""
    ring = Ring(ids, 1)
    for k in range(1000):
        if ring.owner_of(RateKey(f"{prefix}{k}", Metric.READ_IOPS, 1)) == owner:
            return f"{prefix}{k}"
    raise AssertionError(f"no tenant owned by {owner}")


async def _offer(node: Mesh, tenant: str, rate: float, seconds: float, out: list[Admission]) -> int:
    """Offer `rate` units/s of `tenant` through `node` for `seconds`; record admissions."""
    offered, carry = 0, 0.0
    last = start = time.monotonic_ns()
    while (now := time.monotonic_ns()) < start + int(seconds * NS):
        carry += rate * (now - last) / NS
        last = now
        while carry >= 1:
            carry -= 1
            offered += 1
            if node.try_admit(tenant, METRIC).allowed:
                out.append(Admission(time.monotonic_ns(), 1, where=node.member_id))
        await asyncio.sleep(0.002)
    return offered


def test_traffic_that_migrates_and_returns_after_an_idle_stays_in_the_envelope() -> None:
    """180 offers/s through a, then b, then a again, against R=50/s, B=10, b=2 on a key c
    owns. a idles for a phase, longer than `views_idle_ms` (1.5 s): it forgets its view, and
    its reports after the idle must still be applied, so the fleet stays within
    `R*t + B + N*b + R*d` over every interval, and the owner applies every unit admitted."""
    ids = ["a", "b", "c"]
    rate, burst, cap = 50, 10, 2
    phase_s, offered_rate, idle_ms = 3.5, 180.0, 1500
    tenant = _owned_by("c", ids, "mig")
    policy = {
        "tenant_id": tenant,
        "metric": METRIC,
        "generation": 1,
        "target_rate": rate,
        "global_burst": burst,
        "local_burst_cap": cap,
    }
    core = {"sync_interval_ms": SYNC_MS, "views_idle_ms": idle_ms}
    cfgs = static_nodes(ids, [policy], core=core)
    history: list[Admission] = []

    async def main() -> dict[str, Any]:
        async with Mesh(cfgs[0]) as a, Mesh(cfgs[1]) as b, Mesh(cfgs[2]) as c:
            await until(lambda: all(len(m.ring) == 3 for m in (a, b, c)), 5, "ring complete")
            assert a.ring.owner_of(RateKey(tenant, Metric.READ_IOPS, 1)) == "c"
            t0 = time.monotonic_ns()
            offered = 0
            for node in (a, b, a):
                offered += await _offer(node, tenant, offered_rate, phase_s, history)
            admitted = len(history)
            try:  # every admitted unit reaches the owner and is applied there
                await until(
                    lambda: c.health()["owner"]["applied_units"] >= admitted, 3, "owner applied"
                )
            except AssertionError:
                pass  # reported below, beside the envelope
            return {
                "t0": t0,
                "offered": offered,
                "d_ms": max(_staleness_ms(m.health()) for m in (a, b, c)),
                "owner": c.health()["owner"],
                "phases": _per_phase(history, t0, phase_s),
            }

    run = asyncio.run(main())
    d_s = 2 * SYNC_MS / 1000 + run["d_ms"] / 1000
    bound = len(ids) * cap + rate * d_s
    worst = worst_interval(history, rate)
    assert worst is not None
    said = (
        f"offered={run['offered']} admitted={len(history)} per phase={run['phases']} "
        f"d={d_s * 1000:.1f}ms allowed excess B+N*b+R*d={burst + bound:.1f}; worst: "
        f"{worst.explain(run['t0'])}; owner={run['owner']}"
    )
    over = violations(history, rate, burst + bound)
    assert over == 0, f"{over} interval ends past the envelope: {said}"
    assert run["owner"]["applied_units"] == len(history), said


def _per_phase(history: list[Admission], t0: int, phase_s: float) -> list[int]:
    out = [0, 0, 0]
    for a in history:
        out[min(2, int((a.hi_ns - t0) / NS / phase_s))] += a.units
    return out


# -- random adversarial schedules through `mesh node` processes ----------------------------

MEMBERS = 4
VIEWS_IDLE_MS = 800  # short, so idles past it (and the sweep after it) fit a schedule
TTL_MS = 20


def _seeds(spec: str) -> list[int]:
    """`RATEMESH_ENVELOPE_SEEDS`: more seeds to run, as `7,9` or `100-139`."""
    out: list[int] = []
    for part in filter(None, (p.strip() for p in spec.split(","))):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


# Seeds 1-24 always run (a seed found failing elsewhere joins them); more explore:
# RATEMESH_ENVELOPE_SEEDS=100-139
SEEDS = sorted({*range(1, 25), *_seeds(os.environ.get("RATEMESH_ENVELOPE_SEEDS", ""))})
WAVE = 8  # schedules run at once (each on its own tenant)


class _Fleet:
    """`mesh node` processes on loopback, started once: static membership (peer ports
    picked before the start, as a static list needs), a fleet secret, and each node's
    sidecar and telemetry on port 0, read back from its ready line."""

    def __init__(self, tmp: Path, policies: list[dict[str, Any]]) -> None:
        ids = [f"n{i}" for i in range(MEMBERS)]
        peers = {m: f"127.0.0.1:{free_port()}" for m in ids}
        secret = tmp / "fleet-secret"
        secret.write_text(secrets.token_hex(24) + "\n")
        secret.chmod(0o600)
        self.procs: list[subprocess.Popen[str]] = []
        self.ready: list[dict[str, Any]] = []
        try:
            for m in ids:
                cfg = {
                    "member_id": m,
                    "listen": peers[m],
                    "telemetry_listen": "127.0.0.1:0",
                    "sidecar": {"grpc_listen": "127.0.0.1:0"},
                    "fleet_secret_file": str(secret),
                    "membership": {"source": "static", "members": peers},
                    "policies": {"inline": policies},
                    "core": {
                        "sync_interval_ms": SYNC_MS,
                        "snapshot_ttl_ms": TTL_MS,
                        "views_idle_ms": VIEWS_IDLE_MS,
                    },
                    "shutdown_drain_ms": 300,
                }
                path = tmp / f"{m}.yaml"
                path.write_text(yaml.safe_dump(cfg))
                self.procs.append(spawn(["-m", "mesh.cli", "node", "--config", str(path)]))
            self.ready = [read_ready(p, timeout_s=30) for p in self.procs]
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        for p in self.procs:
            stop(p)

    def health(self, i: int) -> dict[str, Any]:
        r = httpx.get(f"http://{self.ready[i]['telemetry']}/health", timeout=5)
        r.raise_for_status()
        out = r.json()
        assert isinstance(out, dict)
        return out

    def applied_units(self) -> int:
        """Units the members applied as owners, over every key (/health `owner`)."""
        return sum(self.health(i)["owner"]["applied_units"] for i in range(MEMBERS))

    def escrow_units(self) -> tuple[int, int, int]:
        """Units the members as owners charged for silent members' floors, netted, refunded."""
        owners = [self.health(i)["owner"] for i in range(MEMBERS)]
        return (
            sum(o["escrow_charged_units"] for o in owners),
            sum(o["escrow_netted_units"] for o in owners),
            sum(o["escrow_refunded_units"] for o in owners),
        )


BATCH_MAX = 256  # items per AdmitStream message
D_POLL_S = 0.1
WARMUP_S = 1.5
WARMUP: dict[str, Any] = {  # the warm-up's own tenant, over its limit from every node
    "tenant_id": "warmup",
    "metric": METRIC,
    "generation": 1,
    "target_rate": 100,
    "global_burst": 10,
    "local_burst_cap": 2,
}


class _Stream:
    """One node's `AdmitStream`, shared by every request to it: the requests asked in the
    same turn of the loop go in one message, and the answers come back in order."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        method = channel.stream_stream(
            "/ratemesh.sidecar.v1.Admission/AdmitStream",
            request_serializer=pb.AdmitRequest.SerializeToString,
            response_deserializer=pb.AdmitResponse.FromString,
        )
        self.call = method()
        self.queued: list[tuple[pb.AdmitItem, asyncio.Future[pb.Verdict]]] = []
        self.waiting: collections.deque[list[asyncio.Future[pb.Verdict]]] = collections.deque()
        self.wake = asyncio.Event()
        self.tasks = [asyncio.create_task(self._send()), asyncio.create_task(self._read())]

    def ask(self, item: pb.AdmitItem) -> asyncio.Future[pb.Verdict]:
        fut: asyncio.Future[pb.Verdict] = asyncio.get_running_loop().create_future()
        self.queued.append((item, fut))
        self.wake.set()
        return fut

    async def _send(self) -> None:
        while True:
            await self.wake.wait()
            batch, self.queued = self.queued[:BATCH_MAX], self.queued[BATCH_MAX:]
            if not self.queued:
                self.wake.clear()
            self.waiting.append([f for _, f in batch])
            await self.call.write(pb.AdmitRequest(items=[i for i, _ in batch]))

    async def _read(self) -> None:
        while True:
            resp = await self.call.read()
            if resp is grpc.aio.EOF:
                return
            futs = self.waiting.popleft()
            assert len(resp.verdicts) == len(futs), "one verdict an item"
            for f, v in zip(futs, resp.verdicts, strict=True):
                if not f.done():
                    f.set_result(v)

    async def close(self) -> None:
        for t in self.tasks:
            t.cancel()
        self.call.cancel()


class _Caller:
    """One caller process's view of the fleet: an `AdmitStream` to each node's sidecar
    (unary calls cost this 2-core machine too much to offer a dozen schedules at once).
    A request is timed at the caller with `time.monotonic_ns`, from its ask to its answer."""

    def __init__(self, fleet: _Fleet) -> None:
        self.channels = [grpc.aio.insecure_channel(n["sidecar"]["grpc"]) for n in fleet.ready]
        self.streams: list[_Stream] = []

    async def warm(self) -> int:
        """Connect every channel and run every node's paths once before the clock starts:
        a first call waits for its connection, and a node's first seconds of traffic
        (views, owner keys, reports) were seen to stall it for up to 2 s on this machine."""
        for ch in self.channels:
            await asyncio.wait_for(ch.channel_ready(), 10)
        self.streams = [_Stream(ch) for ch in self.channels]
        loop = asyncio.get_running_loop()
        end, admitted = loop.time() + WARMUP_S, 0
        while loop.time() < end:
            said = await asyncio.gather(
                *(self.ask(n, WARMUP["tenant_id"], 1) for n in range(len(self.streams)))
            )
            admitted += sum(a.allowed for a in said)
            await asyncio.sleep(0.002)
        return admitted

    async def ask(self, node: int, tenant: str, amount: int) -> Answer:
        item = pb.AdmitItem(tenant=tenant, metric=METRIC, amount=amount)
        send = time.monotonic_ns()
        v = await asyncio.wait_for(self.streams[node].ask(item), 10)
        recv = time.monotonic_ns()
        return Answer(
            send_ns=send,
            recv_ns=recv,
            allowed=v.allowed,
            reason=v.reason,
            retry_after_ms=v.retry_after_ms if v.HasField("retry_after_ms") else None,
            error=v.error if v.HasField("error") else None,
            remaining=v.remaining if v.HasField("remaining") else None,
            suspended=v.suspended if v.HasField("suspended") else None,
        )

    async def close(self) -> None:
        for st in self.streams:
            await st.close()
        for ch in self.channels:
            await ch.close()


async def _request(caller: _Caller, s: Schedule, o: Offer) -> Request:
    r = Request(o)
    first = time.monotonic_ns()
    while True:
        a = await caller.ask(o.node, s.tenant, o.amount)
        r.answers.append(a)
        if a.allowed or not o.retry or a.error is not None:
            return r
        if a.reason == "too_large" and a.retry_after_ms is None:
            return r
        if time.monotonic_ns() - first >= RETRY_FOR_MS * 1_000_000:
            return r
        await asyncio.sleep(RETRY_EVERY_MS / 1000)


async def _run_schedule(caller: _Caller, s: Schedule) -> tuple[int, list[Request]]:
    loop = asyncio.get_running_loop()
    start, t0 = loop.time(), time.monotonic_ns()
    tasks = []
    for o in s.offers:
        delay = start + o.at_ms / 1000 - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(_request(caller, s, o)))
    return t0, list(await asyncio.gather(*tasks))


async def _run_all(
    fleet: _Fleet, schedules: list[Schedule]
) -> tuple[dict[int, tuple[int, list[Request]]], float, int]:
    """Every schedule, WAVE at a time, after the warm-up: their records, the worst d_ms any
    node reported meanwhile, and the units the warm-up admitted."""
    caller = _Caller(fleet)
    out: dict[int, tuple[int, list[Request]]] = {}
    worst = [0.0]
    watch = None
    try:
        warmed = await caller.warm()
        watch = asyncio.create_task(_watch_d(fleet, worst))
        for k in range(0, len(schedules), WAVE):
            wave = schedules[k : k + WAVE]
            done = await asyncio.gather(*(_run_schedule(caller, s) for s in wave))
            out.update({s.seed: res for s, res in zip(wave, done, strict=True)})
    finally:
        if watch is not None:  # and wait for it, so its client closes its connections
            watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watch
        await caller.close()
    return out, max(worst[0], *(_staleness_ms(fleet.health(i)) for i in range(MEMBERS))), warmed


def _staleness_ms(health: dict[str, Any]) -> float:
    """How stale a node's views may run, in ms: the d it discloses (`d_ms`), which counts
    its sync tick's worst recent lateness (a view expires only when its tick runs, and a
    loaded machine delays it)."""
    return float(health["d_ms"])


async def _watch_d(fleet: _Fleet, worst: list[float]) -> None:
    """/health `d_ms` of every node, every D_POLL_S: a node keeps its last DELAYS_KEPT
    (512) report delays only, a fraction of a second of this traffic."""
    async with httpx.AsyncClient(timeout=5) as client:
        while True:
            for node in fleet.ready:
                r = await client.get(f"http://{node['telemetry']}/health")
                worst[0] = max(worst[0], _staleness_ms(r.json()))
            await asyncio.sleep(D_POLL_S)


def _selected_seeds(request: pytest.FixtureRequest) -> list[int]:
    """The seeds of this module's schedule tests that the session runs (all by default)."""
    seeds: set[int] = set()
    for item in request.session.items:
        if isinstance(item, pytest.Function) and item.module is request.module:
            seed = item.callspec.params.get("seed") if hasattr(item, "callspec") else None
            if isinstance(seed, int):
                seeds.add(seed)
    return sorted(seeds) or SEEDS


@dataclass
class _Run:
    judged: dict[int, Judgement]
    admitted: int  # units, over every schedule and the warm-up
    applied: int  # units the owners applied, over every member
    wall_s: float


@pytest.fixture(scope="module")
def run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> _Run:
    """Every selected schedule through one fleet of `mesh node` processes, judged.

    Each schedule is printed with its seed first (`-s` shows it; a failure shows it too).
    The owners' applied units are checked over the whole run: /metrics labels a tenant's
    `ratemesh_owner_applied_total` only from the scrape that first ranks it (its earlier
    units stay under `other`), so a per-tenant count would need a scrape before its first
    report.
    """
    started = time.monotonic()
    schedules = [
        make_schedule(seed, members=MEMBERS, views_idle_ms=VIEWS_IDLE_MS, ttl_ms=TTL_MS)
        for seed in _selected_seeds(request)
    ]
    for s in schedules:
        print(s.describe())
    policies = [WARMUP, *(s.policy(METRIC) for s in schedules)]
    fleet = _Fleet(tmp_path_factory.mktemp("fleet"), policies)
    try:
        records, d_ms, warmed = asyncio.run(_run_all(fleet, schedules))
        admitted = warmed + sum(
            r.offer.amount for _, reqs in records.values() for r in reqs if r.admitted
        )
        deadline = time.monotonic() + 3  # the last reports reach their owners
        while (applied := fleet.applied_units()) < admitted and time.monotonic() < deadline:
            time.sleep(0.05)
        charged, netted, refunded = fleet.escrow_units()
    finally:
        fleet.close()
        # What the run left for the collector (channels, pipes) is collected here, so an
        # unraisable warning from it fails this fixture, not whichever test runs next.
        gc.collect()
    d_s = 2 * SYNC_MS / 1000 + d_ms / 1000
    judged = {}
    for s in schedules:
        t0, reqs = records[s.seed]
        j = judged[s.seed] = judge(s, reqs, t0, d_s)
        print(f"seed {s.seed}: {'ok' if j.ok else 'FAILED'}; {j.summary}")
    wall_s = time.monotonic() - started
    print(
        f"{len(schedules)} schedules in {wall_s:.1f} s; admitted {admitted}, applied {applied}; "
        f"escrow charged {charged}, netted {netted}, refunded {refunded}"
    )
    return _Run(judged, admitted, applied, wall_s)


# Seeds whose envelope is known to break in some runs, until the cause is found
# (docs/guarantees.md, "What is not yet proven"): b = 1 and traffic moving to a member and
# flowing at 3-4x R for over half a second. Seed 22 (R=30, B=6) exceeds B + N*b + R*d by
# 0.2-1.5 units in about half the runs; seed 23 (R=50, B=4) by up to about 4, with d the
# worst report delay the nodes disclosed (a slow lead over R, not a stale view).
KNOWN_BREAKS = {22, 23}


@pytest.mark.parametrize(
    "seed",
    [
        pytest.param(
            s,
            marks=pytest.mark.xfail(strict=False, reason="known envelope break, see KNOWN_BREAKS"),
        )
        if s in KNOWN_BREAKS
        else s
        for s in SEEDS
    ],
)
def test_a_random_adversarial_schedule_stays_in_the_envelope_and_answers_honestly(
    seed: int, run: _Run
) -> None:
    j = run.judged[seed]
    problems = len(j.problems)
    assert problems == 0, f"schedule seed {seed} failed:\n{j.explain()}"


@pytest.mark.xfail(
    strict=False,
    reason="under 3-4x overload a few schedules (about 3 of 24) still see a member deny "
    "asks of at most b for 200 ms while an exact bucket fed the same admissions (and the "
    "owners' most escrow) holds a few units more: a known gap, docs/guarantees.md",
)
def test_no_schedule_starves_a_request_within_b(run: _Run) -> None:
    starved = {seed: j for seed, j in run.judged.items() if j.starved}
    shown = "\n".join(j.explain(j.starved) for j in list(starved.values())[:3])
    assert not starved, f"{len(starved)} of {len(run.judged)} schedules starved:\n{shown}"


def test_the_owners_applied_every_unit_the_schedules_admitted(run: _Run) -> None:
    failed = sorted(seed for seed, j in run.judged.items() if not j.ok)
    applied, admitted = run.applied, run.admitted
    assert applied == admitted, (
        f"owners applied {run.applied} units of the {run.admitted} admitted over "
        f"{len(run.judged)} schedules (seeds {sorted(run.judged)}; failing: {failed})"
    )
