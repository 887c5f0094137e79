"""Admitted rate against the limit over time, one panel per strategy, the envelope a band."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sim.measure import WINDOW_NS
from sim.runner import StrategyRun

__all__ = ["plot"]


def plot(
    result: dict[str, Any],
    runs: list[StrategyRun],
    path: str | Path,
    limits: dict[str, int],
    tenant: str | None = None,
) -> str:
    """Draw the focus tenant's admitted rate per strategy; returns the tenant drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    focus = tenant or next(iter(runs[0].series), None)
    if focus is None:
        raise ValueError("nothing was admitted: no series to plot")
    window_s = WINDOW_NS / 1e9
    fig, axes = plt.subplots(
        len(runs), 1, figsize=(9, 1.9 * len(runs) + 0.6), sharex=True, squeeze=False
    )
    limit = limits[focus]
    for ax, r in zip(axes[:, 0], runs, strict=True):
        series = r.series.get(focus, [])
        t = [i * window_s for i in range(len(series))]
        rate = [v / window_s for v in series]
        bound = r.summary["bound"]
        ax.axhspan(
            limit,
            limit + bound / window_s,
            color="tab:orange",
            alpha=0.15,
            label="envelope per window: " + ("B" if r.name == "strict" else "N*b+R*d"),
        )
        ax.axhline(limit, color="tab:red", lw=1, ls="--", label="limit R")
        ax.plot(t, rate, color="tab:blue", lw=1.2, label="admitted")
        ax.set_ylabel("per s")
        ax.set_title(
            f"{r.name}: max excess {r.summary['max_excess']}, "
            f"utilisation {r.summary['utilisation']:.3f}",
            fontsize=9,
            loc="left",
        )
        ax.set_ylim(0, max(max(rate, default=0), limit + bound / window_s) * 1.1)
    axes[0, 0].legend(fontsize=7, loc="upper right")
    axes[-1, 0].set_xlabel("seconds")
    fig.suptitle(
        f"{result['scenario']} (seed {result['seed']}): admitted rate of {focus!r} per strategy",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return focus
