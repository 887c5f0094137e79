"""Runs worker processes of `bench.cluster` for the node tests and checks the envelope."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench._procs import HOT, cluster_config, free_port, go, read_ready, spawn, stop, write_config
from bench.cluster import (
    D_HORIZON_NS,
    SYNC_INTERVAL_NS,
    excess_over_windows,
    read_buckets,
    worker_args,
)
from ratemesh.envelope import d_estimate_ns, excess_bound

__all__ = ["Run", "start_workers", "Envelope"]

R, B, b = HOT["target_rate"], HOT["global_burst"], HOT["local_burst_cap"]


@dataclass
class Envelope:
    admitted: int
    ideal: int
    offered: int
    excess: float
    d_s: float
    bound: float  # N*b + R*d
    total_bound: float  # R*t + B + N*b + R*d

    def explain(self) -> str:
        return (
            f"admitted={self.admitted} ideal={self.ideal} offered={self.offered} "
            f"excess={self.excess} d={self.d_s * 1000:.1f}ms bound={self.bound:.1f} "
            f"total_bound={self.total_bound:.1f}"
        )


class Run:
    def __init__(
        self,
        tmp: Path,
        ids: list[str],
        *,
        seconds: float,
        hot_total: float,
        membership: dict[str, Any] | None = None,
    ) -> None:
        self.ids = ids
        self.seconds = seconds
        self.addrs = {m: f"127.0.0.1:{free_port()}" for m in ids}
        cfg = write_config(
            tmp / "cluster.yaml", cluster_config(self.addrs, policies=[HOT], membership=membership)
        )
        self.files = {m: str(tmp / f"buckets-{m}.bin") for m in ids}
        self.procs: dict[str, subprocess.Popen[str]] = {}
        for m in ids:
            self.procs[m] = spawn(
                worker_args(
                    cfg,
                    m,
                    seconds,
                    hot_total / len(ids),
                    "--listen",
                    self.addrs[m],
                    "--buckets-file",
                    self.files[m],
                )  # fmt: skip
            )
        for p in self.procs.values():
            read_ready(p)
        self.start_at = go(list(self.procs.values()))

    def results(self, alive: list[str]) -> dict[str, dict[str, Any]]:
        out = {}
        for m in alive:
            p = self.procs[m]
            out[m] = read_ready(p, timeout_s=self.seconds + 60)
            p.wait(30)
            assert p.returncode == 0, f"worker {m} exited with {p.returncode}"
        return out

    def buckets(self) -> list[int]:
        """Fleet-wide admissions per 10 ms, read from every worker's shared file (a
        SIGKILLed worker's count up to its death included)."""
        per = [read_buckets(f) for f in self.files.values()]
        return [sum(x[i] for x in per if i < len(x)) for i in range(max(map(len, per)))]

    def close(self) -> None:
        for p in self.procs.values():
            stop(p, kill=True)

    def envelope(self, results: dict[str, dict[str, Any]]) -> Envelope:
        buckets = self.buckets()
        # d as the mesh defines it: the worst delay within the owner-unreachable horizon
        # (a report stranded at a dead owner waits out failover time, not propagation)
        delays = [d for r in results.values() for d in r["delays_ns"]]
        d_ns = d_estimate_ns(delays, SYNC_INTERVAL_NS, horizon_ns=D_HORIZON_NS)
        offered = sum(r["hot_offered"] for r in results.values())
        admitted = sum(buckets)
        bound = excess_bound(len(self.ids), b, R, d_ns)
        return Envelope(
            admitted=admitted,
            ideal=int(min(offered, B + R * self.seconds)),
            offered=offered,
            excess=excess_over_windows(buckets, R, B),
            d_s=d_ns / 1e9,
            bound=bound,
            total_bound=R * self.seconds + B + bound,
        )


def start_workers(tmp: Path, ids: list[str], **kw: Any) -> Run:
    return Run(tmp, ids, **kw)
