"""The mode registry: every mode has one opener, and `Admission` asks a view's own gate for
everything that differs by mode (deny, refund, idle, forget, deadline), so a mode is its gate
module and one line in `mesh.core.admission._modes.OPENERS` (docs/architecture.md)."""

from __future__ import annotations

import inspect

import pytest

from mesh.core.admission import Admission
from mesh.core.admission import _admission as admission_module
from mesh.core.admission._modes import OPENERS
from mesh.core.gate import NEVER, Gate
from mesh.core.policy import Mode, TenantRatePolicy
from mesh.core.verdict import Numbers, Reason, Step, Verdict, verdict
from tests.mesh._helpers import MS, cache, policy

FIVE_LEFT = 5


def test_every_mode_has_exactly_one_opener() -> None:
    assert set(OPENERS) == set(Mode)


def test_admission_names_no_mode() -> None:
    """The ladders are gone: what differs by mode is the gate's, reached through `Gate`."""
    source = inspect.getsource(admission_module)
    assert "Mode." not in source
    for method in ("deny", "refund", "idle", "forget", "deadline", "detailed", "health"):
        assert hasattr(Gate, method)


class _Recorded(Gate):
    """A mode written outside the admission package: a counter of FIVE_LEFT units that
    records what admission asked of it."""

    __slots__ = ("calls",)

    def __init__(self, policy: TenantRatePolicy) -> None:
        super().__init__(policy, _never)
        self.flush_at = NEVER
        self.avail = FIVE_LEFT
        self.calls: list[tuple[str, object]] = []

    def deny(self, amount: int, admission: Admission) -> Verdict:
        self.calls.append(("deny", amount))
        return self.no

    def refund(self, amount: int) -> None:
        self.calls.append(("refund", amount))
        self.avail += amount

    def idle(self, admission: Admission) -> bool:
        self.calls.append(("idle", None))
        return True

    def forget(self, admission: Admission, *, retire: bool) -> None:
        self.calls.append(("forget", retire))

    def deadline(self) -> Verdict | None:
        self.calls.append(("deadline", None))
        return verdict(False, Reason.DEADLINE_EXCEEDED, Mode.LOCAL, "recorded", step=Step.QUEUE)

    def numbers(self, amount: int, allowed: bool, now_ns: int) -> Numbers:
        return Numbers(self.avail, 0 if allowed else 1, None)


def _never(v: Gate) -> None:
    v.flush_at = NEVER


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> list[_Recorded]:
    """Local mode registered as `_Recorded`, for one test; the gates it opened."""
    gates: list[_Recorded] = []

    def open_recorded(admission: Admission, p: TenantRatePolicy) -> Gate:
        gates.append(_Recorded(p))
        return gates[-1]

    monkeypatch.setitem(OPENERS, Mode.LOCAL, open_recorded)
    return gates


def test_a_registered_gate_answers_everything_admission_asks_of_its_mode(
    opened: list[_Recorded],
) -> None:
    a = Admission(cache(policy(rate=100, burst=10, mode="local")), 0)
    assert sum(a.try_admit("t", "read_iops").allowed for _ in range(8)) == FIVE_LEFT
    (g,) = opened
    assert g.calls == [("deny", 1)] * 3
    a.refund("t", "read_iops", 2)
    assert g.calls[-1] == ("refund", 2) and a.try_admit("t", "read_iops").allowed
    assert a.deadline_verdict("t", "read_iops").bound == "recorded"
    assert a.try_admit_detailed("t", "read_iops").remaining == 0  # the last of the two
    assert a.evict_idle() == 1
    assert g.calls[-2:] == [("idle", None), ("forget", False)]


def test_a_new_generation_retires_the_old_gate_through_its_mode(
    opened: list[_Recorded],
) -> None:
    policies = cache(policy(rate=100, burst=10, mode="local"))
    a = Admission(policies, 0)
    assert a.try_admit("t", "read_iops").allowed
    assert policies.put(policy(rate=50, burst=10, mode="local", gen=2))
    a.tick(1 * MS)
    assert opened[0].calls == [("forget", True)] and len(opened) == 2
