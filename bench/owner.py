"""`mesh bench owner`: key-deltas one owner process applies per second, fed batched
reports over gRPC by other processes.

The owner is a real `mesh node` process (static membership of one, a `*` policy so large
that no key exhausts). Each feeder process opens the same long-lived stream a worker
would (`mesh.peer.PeerLink`) and sends report batches of `--batch` keys, keeping a few
batches in flight and counting the snapshot batches that acknowledge them. The rate is
the owner's own count of applied deltas (`mesh status`), over the measured window.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgpack

from bench._procs import free_port, read_ready, spawn, stop, write_config

__all__ = ["run"]

BIG = 10**12
WINDOW = 4  # batches in flight per feeder


def run(
    *, seconds: float = 5.0, feeders: int = 2, keys: int = 10_000, batch: int = 256
) -> dict[str, Any]:
    from mesh.peer import fetch_status

    with tempfile.TemporaryDirectory() as tmp:
        addr = f"127.0.0.1:{free_port()}"
        # The feeders are ring members (an owner refuses reports from anyone else); they
        # serve nothing, so their addresses are only placeholders, and each feeds only the
        # keys the ring gives the owner.
        members = {"owner": addr} | {f"f{i}": f"127.0.0.1:{free_port()}" for i in range(feeders)}
        cfg = write_config(
            Path(tmp) / "owner.yaml",
            {
                "member_id": "owner",
                "listen": addr,
                "membership": {"source": "static", "members": members},
                "policies": {
                    "inline": [
                        {
                            "tenant_id": "*",
                            "metric": "read_iops",
                            "generation": 1,
                            "target_rate": BIG,
                            "global_burst": BIG,
                            "local_burst_cap": BIG,
                        }
                    ]
                },
            },
        )
        owner = spawn(["-m", "mesh.cli", "node", "--config", str(cfg)])
        procs = []
        try:
            read_ready(owner)
            start_at = time.time() + 2.5
            procs = [
                spawn(
                    [
                        "-m",
                        "bench.owner",
                        "feeder",
                        "--addr",
                        addr,
                        "--id",
                        f"f{i}",
                        "--feeders",
                        str(feeders),
                        "--keys",
                        str(keys),
                        "--batch",
                        str(batch),
                        "--start-at",
                        str(start_at),
                        "--seconds",
                        str(seconds + 1.0),
                    ]
                )
                for i in range(feeders)
            ]
            for p in procs:
                read_ready(p)
            time.sleep(max(0.0, start_at - time.time()) + 0.5)
            s0 = asyncio.run(fetch_status(addr))["owner"]["applied_units"]
            t0 = time.monotonic()
            time.sleep(seconds)
            s1 = asyncio.run(fetch_status(addr))["owner"]["applied_units"]
            elapsed = time.monotonic() - t0
            sent = [read_ready(p, timeout_s=60) for p in procs]
        finally:
            for p in procs:
                stop(p)
            stop(owner)
    return {
        "deltas_per_s": round((s1 - s0) / elapsed),
        "feeders": feeders,
        "keys": keys,
        "batch": batch,
        "seconds": round(elapsed, 2),
        "reports_sent": sum(s["reports_sent"] for s in sent),
    }


def _owned_keys(n: int, members: list[str]) -> list[list[Any]]:
    """The first `n` keys (as wire rows) that the ring over `members` gives the owner."""
    from mesh.core.policy import Metric, RateKey
    from mesh.core.ring import Ring

    ring = Ring(members, 1)
    out: list[list[Any]] = []
    k = 0
    while len(out) < n:
        if ring.owner_of(RateKey(f"t{k}", Metric.READ_IOPS, 1)) == "owner":
            out.append([f"t{k}", "read_iops", 1])
        k += 1
    return out


async def _feed(a: argparse.Namespace) -> dict[str, Any]:
    from mesh.core.messages import SCHEMA_VERSION
    from mesh.core.messages._columns import pack_column
    from mesh.peer import PeerLink

    acked = asyncio.Queue[int]()

    def deliver(msg: Any) -> None:
        acked.put_nowait(len(msg.keys))

    link = PeerLink(
        member_id=a.id,
        worker_epoch=1,
        peer_id="owner",
        addr=a.addr,
        deliver=deliver,
        tls=None,
        max_message_bytes=64 << 20,
    )
    print(json.dumps({"feeder": a.id}), flush=True)
    while time.time() < a.start_at:
        await asyncio.sleep(0.01)
    seq: list[int] = [0] * a.keys
    keys = _owned_keys(a.keys, ["owner", *(f"f{i}" for i in range(a.feeders))])
    ones, zeros = pack_column([1] * a.batch), pack_column([0] * a.batch)
    cursor = 0
    inflight = 0
    sent = 0
    end = time.time() + a.seconds
    while time.time() < end:
        while inflight < WINDOW:
            idx = [(cursor + i) % a.keys for i in range(a.batch)]
            cursor = (cursor + a.batch) % a.keys
            seqs = []
            for k in idx:
                seq[k] += 1
                seqs.append(seq[k])
            link.send(
                msgpack.packb(
                    [
                        SCHEMA_VERSION,
                        "reports",
                        a.id,
                        1,
                        1,
                        [keys[k] for k in idx],
                        pack_column(seqs),
                        ones,
                        zeros,
                        pack_column(seqs),
                    ],
                    use_bin_type=True,
                )
            )
            inflight += 1
            sent += a.batch
        got = 0
        try:
            while got < a.batch:
                got += await asyncio.wait_for(acked.get(), 2.0)
        except TimeoutError:
            pass
        inflight -= 1
    await link.close()
    return {"reports_sent": sent}


def core(*, batches: int = 1500, warm: int = 200) -> dict[str, Any]:
    """The owner's part of this bench in one process, without gRPC: the same wire batches
    (2 feeders, 10,000 keys, 256 rows) decoded, applied (`Owner.receive`) and answered
    (encoded), with the owner's tick every 5 ms of a clock that moves 1 ms a batch. Each
    step in CPU time of this thread (less moved by other processes than wall time), per
    row and per batch: docs/performance.md reads it, and a profiler can run it alone."""
    from mesh.core.effects import Send
    from mesh.core.messages import SCHEMA_VERSION, ReportBatch, decode, encode
    from mesh.core.messages._columns import pack_column
    from mesh.core.owner import Owner
    from mesh.core.policy import Metric, PolicyCache, TenantRatePolicy
    from mesh.core.ring import Ring

    feeders, keys_n, batch = 2, 10_000, 256
    members = ["owner", *(f"f{i}" for i in range(feeders))]
    policy = TenantRatePolicy(
        tenant_id="*",
        metric=Metric.READ_IOPS,
        generation=1,
        target_rate=BIG,
        global_burst=BIG,
        local_burst_cap=BIG,
    )
    owner = Owner("owner", Ring(members, 1), PolicyCache([policy]), 0)
    keys = _owned_keys(keys_n, members)
    seq = [[0] * keys_n for _ in range(feeders)]
    ones, zeros = pack_column([1] * batch), pack_column([0] * batch)
    wire = []
    for b in range(warm + batches):
        f = b % feeders
        idx = [(b // feeders * batch + i) % keys_n for i in range(batch)]
        seqs = []
        for k in idx:
            seq[f][k] += 1
            seqs.append(seq[f][k])
        rows = [keys[k] for k in idx]
        msg = [SCHEMA_VERSION, "reports", f"f{f}", 1, 1, rows, pack_column(seqs), ones, zeros]
        wire.append(msgpack.packb([*msg, pack_column(seqs)], use_bin_type=True))
    spent = {"decode": 0, "receive": 0, "encode": 0, "tick": 0}
    clock = time.thread_time_ns
    now = next_tick = 10**12
    for i, raw in enumerate(wire):
        now += 1_000_000
        t0 = clock()
        if now >= next_tick:
            for e in owner.tick(now):
                if isinstance(e, Send):
                    encode(e.message)
            next_tick += 5_000_000
        t1 = clock()
        message = decode(raw)
        t2 = clock()
        assert isinstance(message, ReportBatch)
        effects = owner.receive(now, message)
        t3 = clock()
        for e in effects:
            if isinstance(e, Send):
                encode(e.message)
        t4 = clock()
        if i >= warm:
            for step, ns in zip(spent, (t2 - t1, t3 - t2, t4 - t3, t1 - t0), strict=True):
                spent[step] += ns
    rows_n = batches * batch
    total = sum(spent.values())
    return {
        "rows_per_cpu_s": round(rows_n * 1e9 / total),
        "ns_per_row": {k: round(v / rows_n) for k, v in spent.items()},
        "us_per_batch": {k: round(v / batches / 1000, 1) for k, v in spent.items()},
        "batches": batches,
        "batch": batch,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.owner")
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("core", help="the owner's part alone, in this process (CPU time)")
    c.add_argument("--batches", type=int, default=1500)
    f = sub.add_parser("feeder")
    f.add_argument("--addr", required=True)
    f.add_argument("--id", required=True)
    f.add_argument("--keys", type=int, required=True)
    f.add_argument("--batch", type=int, required=True)
    f.add_argument("--start-at", type=float, required=True)
    f.add_argument("--seconds", type=float, required=True)
    f.add_argument("--feeders", type=int, required=True)
    a = p.parse_args(argv)
    from mesh.node import new_event_loop, tune_gc

    tune_gc()
    if a.cmd == "core":
        print(json.dumps(core(batches=a.batches)), flush=True)
        return 0
    loop = new_event_loop()
    try:
        out = loop.run_until_complete(_feed(a))
    finally:
        loop.close()
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
