"""What a node depends on, and whether each answers: said out loud, never served in silence.

A node needs its coordinator (policies), a strict limit's governord (credit), its own policy
file, and the owners of the keys it admits. Each is a `Dependency` whose state a probe
reports (`Dependencies.observe`) a few times a second; a change is one log line at once
(``dependency_down`` as a warning naming the reason, ``dependency_up`` when it answers again),
a gauge (``ratemesh_dependency_up{dependency}``, 1 or 0) and a counter of the times it went
down (``ratemesh_dependency_failures_total{dependency}``), and /health's ``degraded`` list.
The dependency names are a fixed set (`DEPENDENCIES`), so the series are bounded.

A dependency not yet heard from (a coordinator the node is still dialling) is neither up nor
down: no line, gauge absent, but /health says so and readiness waits for it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ratemesh.logs import event

__all__ = ["DEPENDENCIES", "REASON_CHARS_MAX", "REASON_RELOG_S", "Dependencies", "DependencyState"]

# The fixed label values: every dependency a node can have.
DEPENDENCIES = ("coordinator", "governord", "policy_file", "owners")
# A dependency still down for another reason is logged again at most this often (its
# /health reason is always the latest): a flapping error text is not a line per probe.
REASON_RELOG_S = 10.0
REASON_CHARS_MAX = 300  # a reason as logged and on /health (a peer's message is untrusted)

log = logging.getLogger("mesh.node")


@dataclass(slots=True)
class DependencyState:
    """One dependency: `up` (None: not heard from yet), why not, since when, how often down."""

    up: bool | None = None
    reason: str = ""
    since_s: float = 0.0
    failures: int = 0
    said_s: float = 0.0  # when its last down line was logged


class Dependencies(Collector):
    """The node's dependencies and their states; a prometheus Collector of both families."""

    def __init__(self, clock_s: Callable[[], float], logger: logging.Logger = log) -> None:
        self.clock_s = clock_s
        self.log = logger
        self.states: dict[str, DependencyState] = {}  # bounded: keys are DEPENDENCIES

    def declare(self, name: str) -> None:
        """The node has this dependency (configured); its state is not known yet."""
        if name not in DEPENDENCIES:
            raise ValueError(f"unknown dependency {name!r}")
        self.states.setdefault(name, DependencyState(since_s=self.clock_s()))

    def observe(self, name: str, up: bool | None, reason: str = "", **fields: Any) -> bool:
        """A probe's finding; True when it was logged (a change, but for one first heard up:
        nothing to say there). A reason that changes while the dependency stays down is
        logged too (a wrong key fixed into an unreachable address is news), at most once per
        REASON_RELOG_S; the same reason again is not."""
        self.declare(name)
        st = self.states[name]
        reason = " ".join(reason.split())[:REASON_CHARS_MAX]
        if up is None or (up == st.up and (up or reason == st.reason)):
            return False
        now = self.clock_s()
        if up:
            was_down = st.up is False
            down_s = round(now - st.since_s, 3)
            st.up, st.reason, st.since_s = True, "", now
            if not was_down:
                return False  # up from the start: nothing to say
            event(
                self.log,
                logging.INFO,
                f"{name} answers again",
                name="dependency_up",
                dependency=name,
                down_s=down_s,
            )
            return True
        was_down = st.up is False
        st.up, st.reason = False, reason
        if was_down and now - st.said_s < REASON_RELOG_S:
            return False  # a new reason while down: on /health now, in the log later
        if not was_down:
            st.failures += 1
            st.since_s = now
        st.said_s = now
        event(
            self.log,
            logging.WARNING,
            f"{name} failing: {reason}",
            name="dependency_down",
            dependency=name,
            reason=reason,
            **fields,
        )
        return True

    def degraded(self) -> list[dict[str, Any]]:
        """/health's reasons: each dependency down or not yet heard from, and why."""
        now = self.clock_s()
        out = []
        for name in sorted(self.states):
            st = self.states[name]
            if st.up is True:
                continue
            out.append(
                {
                    "dependency": name,
                    "reason": st.reason if st.up is False else "not answered yet",
                    "for_s": round(now - st.since_s, 3),
                }
            )
        return out

    def health(self) -> dict[str, Any]:
        """Every dependency's state, for /health's ``dependencies``."""
        return {
            name: {"up": st.up, "reason": st.reason or None, "failures": st.failures}
            for name, st in sorted(self.states.items())
        }

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily(
            "ratemesh_dependency_up",
            "Whether a dependency of the node answers (1) or fails (0); absent until heard from",
            labels=("dependency",),
        )
        failures = CounterMetricFamily(
            "ratemesh_dependency_failures",
            "Times a dependency of the node went from answering (or unknown) to failing",
            labels=("dependency",),
        )
        for name, st in sorted(self.states.items()):
            if st.up is not None:
                up.add_metric((name,), 1.0 if st.up else 0.0)
            failures.add_metric((name,), float(st.failures))
        yield up
        yield failures
