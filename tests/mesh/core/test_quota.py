"""Spend quotas (docs/quotas.md): the policy fields, periods, the cell messages,
the owner's folds and the worker's ledger, joined by an in-memory link."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

import pytest

from mesh.core.effects import Send
from mesh.core.member import Member
from mesh.core.messages import Cell, CellFold, CellPublish, FoldRow, decode, encode
from mesh.core.policy import BOUNDS, PolicyCache, RateKey, TenantRatePolicy
from mesh.core.quota import (
    CELL_RETENTION_MS,
    DAY_MS,
    MemoryCellTier,
    QuotaDesk,
    QuotaFolds,
    QuotaLedger,
    period_end_ms,
    period_index,
)
from mesh.core.ring import Ring
from mesh.core.verdict import Reason, Step
from mesh.errors import MessageError
from ratemesh.errors import ConfigError
from ratemesh.policy import Period

T0 = int(datetime(2026, 3, 31, 12, tzinfo=UTC).timestamp() * 1000)  # noon, last of March


def quota(cap: int = 100, period: str = "day", **kw: object) -> TenantRatePolicy:
    return TenantRatePolicy.from_dict(
        {
            "tenant_id": "t",
            "metric": "spend",
            "unit": "usd_micros",
            "generation": 1,
            "period": period,
            "quota": cap,
            **kw,
        }
    )


# -- the policy model -------------------------------------------------------------------


def test_a_quota_policy_needs_no_rate_fields_and_round_trips() -> None:
    p = quota(5_000_000, "month")
    assert (p.period, p.quota, p.target_rate, p.unit.value) == (
        Period.MONTH,
        5_000_000,
        0,
        "usd_micros",
    )
    d = p.to_dict()
    assert "target_rate" not in d and d["period"] == "month" and d["quota"] == 5_000_000
    assert TenantRatePolicy.from_dict(d) == p


def test_old_policies_write_no_quota_keys() -> None:
    p = TenantRatePolicy("a", "read_iops", 1, 10, 10, 5)
    assert "period" not in p.to_dict() and "quota" not in p.to_dict()
    assert p.quota is None and TenantRatePolicy.from_dict(p.to_dict()) == p


@pytest.mark.parametrize(
    ("extra", "field", "text"),
    [
        ({"period": "day"}, "policy.quota", "is required with period"),
        ({"quota": 5}, "policy.period", "is required with quota"),
        ({"period": "week", "quota": 5}, "policy.period", "unknown value 'week'"),
        ({"period": "day", "quota": 0}, "policy.quota", ">= 1"),
        ({"period": "day", "quota": -3}, "policy.quota", ">= 1"),
        ({}, "policy.target_rate", "is required"),
    ],
)
def test_bad_quota_fields_are_one_error_naming_the_field(
    extra: dict[str, object], field: str, text: str
) -> None:
    base = {"tenant_id": "t", "metric": "spend", "generation": 1, **extra}
    with pytest.raises(ConfigError) as exc:
        TenantRatePolicy.from_dict(base)
    assert exc.value.field == field and text in str(exc.value)


def test_a_quota_amount_may_be_text() -> None:
    assert quota("5k").quota == 5000  # type: ignore[arg-type]


# -- periods ----------------------------------------------------------------------------


def test_periods_are_utc_calendar_days_and_months() -> None:
    day = period_index(Period.DAY, T0)
    assert period_end_ms(Period.DAY, day) - T0 == DAY_MS // 2
    month = period_index(Period.MONTH, T0)
    end = period_end_ms(Period.MONTH, month)
    assert end == int(datetime(2026, 4, 1, tzinfo=UTC).timestamp() * 1000)
    assert period_index(Period.MONTH, end) == month + 1
    assert period_index(Period.MONTH, end - 1) == month
    dec = period_index(Period.MONTH, int(datetime(2026, 12, 5, tzinfo=UTC).timestamp() * 1000))
    assert period_end_ms(Period.MONTH, dec) == int(
        datetime(2027, 1, 1, tzinfo=UTC).timestamp() * 1000
    )


# -- the wire ---------------------------------------------------------------------------

K = RateKey("t", "spend", 1)


def test_cell_messages_round_trip() -> None:
    pub = CellPublish("a", 3, (Cell(K, 7, 42),))
    fold = CellFold("o", 3, (FoldRow(K, 7, 50, 42),))
    assert decode(encode(pub)) == pub
    assert decode(encode(fold)) == fold


@pytest.mark.parametrize(
    "wire",
    [
        [3, "cells", "a", 1, [[["t", "spend", 1], 7, -1]]],  # negative burn
        [3, "cells", "a", 1, [[["t", "spend", 1], 7, (1 << 64) - 1]]],  # absurd burn
        [3, "cells", "a", 1, [[["t", "spend", 1], 1 << 40, 1]]],  # far-future period
        [3, "cells", "a", 1, [[["t", "spend", 1], 7, 1]] * 257],  # too many rows
        [3, "cells", "a", 1, [[["t", "spend", 1], 7, 1], [["t", "spend", 1], 7, 2]]],
        [3, "folds", "o", 1, [[["t", "spend", 1], 7, 5, 6]]],  # own above combined
        [3, "cells", "a", 1, [[["t", "Bad", 1], 7, 1]]],  # not a metric name
    ],
)
def test_bad_cell_messages_are_refused(wire: list[object]) -> None:
    import msgpack

    with pytest.raises(MessageError):
        decode(msgpack.packb(wire, use_bin_type=True))


# -- the owner's folds ------------------------------------------------------------------


def _folds(cap: int = 100, **kw: int) -> QuotaFolds:
    return QuotaFolds("o", lambda key: (cap, Period.DAY) if key == K else None, **kw)


DAY = period_index(Period.DAY, T0)


def test_a_cell_is_max_per_member_so_retries_and_reorders_never_double_count() -> None:
    f = _folds()
    for burn in (10, 10, 30, 20, 30):  # a duplicate, a newer one, an old one arriving late
        f.publish(T0, "a", CellPublish("a", 1, (Cell(K, DAY, burn),)))
    reply = f.publish(T0, "b", CellPublish("b", 1, (Cell(K, DAY, 5),)))
    assert reply.rows == (FoldRow(K, DAY, 35, 5),)
    assert f.fold(K, DAY) == (35, {"a": 30, "b": 5})


def test_cells_an_owner_cannot_believe_are_refused_and_change_nothing() -> None:
    f = _folds(cap=100)
    f.publish(T0, "a", CellPublish("a", 1, (Cell(K, DAY, 101),)))  # above the quota
    f.publish(T0, "a", CellPublish("a", 1, (Cell(K, DAY + 2, 1),)))  # a period not held
    f.publish(T0, "a", CellPublish("a", 1, (Cell(RateKey("u", "spend", 1), DAY, 1),)))
    assert f.fold(K, DAY) == (0, {})
    assert f.refused == {"burn_above_quota": 1, "period_out_of_range": 1, "not_a_quota": 1}
    assert len(f) == 0


def test_a_departed_members_cell_ages_out_after_the_retention() -> None:
    f = _folds()
    f.publish(T0, "gone", CellPublish("gone", 1, (Cell(K, DAY, 40),)))
    f.publish(T0, "live", CellPublish("live", 1, (Cell(K, DAY, 10),)))
    later = T0 + CELL_RETENTION_MS // 2
    f.publish(later, "live", CellPublish("live", 1, (Cell(K, DAY, 10),)))  # live re-publishes
    f.expire(T0 + CELL_RETENTION_MS)
    assert f.fold(K, DAY) == (50, {"gone": 40, "live": 10})  # not yet past the retention
    f.expire(T0 + CELL_RETENTION_MS + 1)
    assert f.fold(K, DAY) == (10, {"live": 10})


def test_folds_are_bounded() -> None:
    f = _folds(cells_max=2)
    for m in ("a", "b", "c"):
        f.publish(T0, m, CellPublish(m, 1, (Cell(K, DAY, 1),)))
    assert f.fold(K, DAY)[0] == 2 and f.refused == {"cells_full": 1}


# -- the worker's ledger, with an owner -------------------------------------------------


class Fleet:
    """Workers' ledgers and one owner's folds joined by an in-memory link."""

    def __init__(self, ids: list[str], cap: int = 100) -> None:
        self.policy = quota(cap)
        self.now = T0
        self.ledgers = {m: QuotaLedger(m) for m in ids}
        for led in self.ledgers.values():
            led.n_live = len(ids)
        self.owner = _folds(cap)

    def sync(self, *ids: str) -> None:
        for m in ids or list(self.ledgers):
            for send in self.ledgers[m].flush(self.now, 1, lambda _key: "o"):
                assert isinstance(send.message, CellPublish)
                reply = self.owner.publish(self.now, m, send.message)
                self.ledgers[m].folded(self.now, reply)

    def spend(self, m: str, amount: int = 1) -> bool:
        return self.ledgers[m].try_spend(self.now, self.policy, amount).allowed


def test_admission_compares_own_plus_remote_with_the_cap() -> None:
    fl = Fleet(["a", "b"])
    fl.spend("a")
    fl.spend("b")
    fl.sync()
    fl.sync()
    fl.sync()
    assert sum(fl.spend("a") for _ in range(60)) == 60
    fl.sync()  # a publishes 61, then b folds it
    assert sum(fl.spend("b") for _ in range(60)) == 38  # 100 - 61 - 1
    v = fl.ledgers["b"].try_spend(fl.now, fl.policy, 1, detailed=True)
    assert (v.reason, v.step, v.bound, v.limit) == (
        Reason.QUOTA_EXHAUSTED,
        Step.QUOTA,
        BOUNDS["quota"],
        100,
    )
    assert v.quota is not None and (v.quota.cap, v.quota.own, v.quota.remote) == (100, 39, 61)
    assert v.quota.lag_ms == 0 and v.quota.unpublished == 38
    assert v.reset_after_ms == DAY_MS // 2 and v.remaining == 0


def test_an_unfolded_worker_spends_at_most_its_share_and_says_so() -> None:
    fl = Fleet(["a", "b", "c", "d"])
    assert sum(fl.spend("a") for _ in range(50)) == 25
    v = fl.ledgers["a"].try_spend(fl.now, fl.policy, 1)
    assert v.bound == BOUNDS["quota_unfolded"]


def test_a_restart_under_the_same_id_recovers_its_burn_and_never_double_counts() -> None:
    fl = Fleet(["a", "b"])
    assert sum(fl.spend("a") for _ in range(40)) == 40
    fl.sync()
    fl.sync()  # the hello, then the cell
    assert fl.owner.fold(K, DAY) == (40, {"a": 40})
    fl.ledgers["a"] = QuotaLedger("a")  # the process restarts: own starts at 0
    fl.ledgers["a"].n_live = 2
    assert sum(fl.spend("a") for _ in range(5)) == 5  # before any fold: within cap // 2
    fl.sync("a")  # the hello (0) brings back the old cell: own = 40 + 5
    fl.sync("a")
    assert fl.owner.fold(K, DAY) == (45, {"a": 45})
    fl.sync("a")  # re-publishing changes nothing
    assert fl.owner.fold(K, DAY)[0] == 45


def test_a_new_owner_is_rebuilt_from_the_workers_cells() -> None:
    fl = Fleet(["a", "b"])
    fl.sync()
    for m, n in (("a", 30), ("b", 20)):
        assert sum(fl.spend(m) for _ in range(n)) == n
    fl.sync()
    fl.sync()
    fl.owner = _folds(100)  # the owner crashed: its folds are gone
    for led in fl.ledgers.values():
        led.ring_changed(fl.now)
    fl.sync()
    assert fl.owner.fold(K, DAY) == (50, {"a": 30, "b": 20})
    fl.now += 1000
    fl.sync()  # a cadence later, each worker has the others' burn
    assert fl.ledgers["a"].state(fl.now, fl.policy).remote == 20  # type: ignore[union-attr]


def test_period_roll_over_starts_from_zero_and_drops_past_cells() -> None:
    fl = Fleet(["a"])
    fl.sync()
    assert sum(fl.spend("a") for _ in range(150)) == 100
    fl.sync()
    fl.sync()
    assert fl.owner.fold(K, DAY)[0] == 100
    fl.now = period_end_ms(Period.DAY, DAY)  # midnight UTC
    assert sum(fl.spend("a") for _ in range(10)) == 10  # a new day, from zero
    fl.sync()
    assert fl.owner.fold(K, DAY + 1) == (10, {"a": 10})
    fl.now += CELL_RETENTION_MS // 2
    fl.spend("a")
    fl.sync()
    fl.owner.expire(fl.now + CELL_RETENTION_MS // 2 + 1)  # nobody publishes yesterday
    assert fl.owner.fold(K, DAY) == (0, {}) and len(fl.owner) == 1
    fl.ledgers["a"].expire(fl.now)
    assert len(fl.ledgers["a"]) == 1


def test_a_skewed_clock_at_the_boundary_counts_in_its_own_period() -> None:
    fl = Fleet(["a", "b"])
    fl.sync()
    late = period_end_ms(Period.DAY, DAY) - 10  # b's clock is 20 ms behind a's
    fl.now = late + 20
    fl.spend("a", 5)
    fl.sync("a")
    fl.sync("a")
    fl.now = late
    fl.spend("b", 5)
    fl.sync("b")
    fl.sync("b")  # b's cell lands in yesterday's fold; the owner (also behind) takes it
    assert fl.owner.fold(K, DAY)[1].get("b") == 5
    assert fl.owner.fold(K, DAY + 1)[1] == {"a": 5}


# -- the tier ---------------------------------------------------------------------------


def test_the_tier_folds_max_per_member_and_remote_takes_the_larger_fold() -> None:
    tier = MemoryCellTier(retention_ms=1000)
    assert tier.exchange(T0, K, DAY, "a", 10) == {"a": 10}
    assert tier.exchange(T0, K, DAY, "a", 4) == {"a": 10}  # a retry of an older value
    assert tier.exchange(T0, K, DAY, "b", 7) == {"a": 10, "b": 7}
    assert tier.exchange(T0 + 1001, K, DAY, "b", 7) == {"b": 7}  # a's beat aged out
    led = QuotaLedger("b")
    p = quota()
    led.try_spend(T0, p, 1)
    led.tier_folded(T0, K, DAY, {"a": 30, "b": 0})
    led.folded(T0, CellFold("o", 1, (FoldRow(K, DAY, 21, 1),)))  # the owner knows less
    lag = led.state(T0, p)
    assert lag is not None and lag.remote == 30 and lag.own == 1


# -- wired into a Member ----------------------------------------------------------------


def test_members_admit_a_quota_through_admission_and_converge() -> None:
    now = [T0]
    ring = Ring(["a", "b"], 1)
    p = quota(100)
    members = {}
    for m in ("a", "b"):
        cache = PolicyCache([p])
        members[m] = Member(m, 1, ring, cache, 0, quotas=QuotaDesk(m, cache, lambda: now[0]))

    def run(effects: Sequence[object], sender: str) -> None:
        queue = [(sender, e) for e in effects]
        while queue:
            frm, e = queue.pop(0)
            assert isinstance(e, Send)
            msg = decode(encode(e.message))
            queue += [(e.to, x) for x in members[e.to].deliver(0, msg)]

    def tick() -> None:
        for m, member in members.items():
            run(member.tick(0), m)
        now[0] += 1000

    tick()
    assert sum(members["a"].admission.try_admit("t", "spend", 1).allowed for _ in range(70)) == 50
    tick()
    tick()
    tick()
    got = sum(members["b"].admission.try_admit("t", "spend", 1).allowed for _ in range(70))
    assert got == 50
    v = members["b"].admission.try_admit_detailed("t", "spend", 1)
    assert v.reason is Reason.QUOTA_EXHAUSTED and v.quota is not None
    assert v.to_dict()["quota"]["cap"] == 100
    tick()
    tick()
    tick()  # b's hello, b's cell, then a's next publish folds it
    assert members["a"].admission.try_admit("t", "spend", 1).allowed is False


def test_admission_without_a_quota_desk_fails_closed() -> None:
    from mesh.core.admission import Admission

    a = Admission(PolicyCache([quota()]), 0)
    v = a.try_admit("t", "spend", 1)
    assert not v.allowed and v.bound == BOUNDS["quota_unattached"]


def test_a_refund_on_a_quota_gives_nothing_back() -> None:
    now = [T0]
    cache = PolicyCache([quota(3)])
    m = Member("a", 1, Ring(["a"], 1), cache, 0, quotas=QuotaDesk("a", cache, lambda: now[0]))
    assert sum(m.admission.try_admit("t", "spend", 1).allowed for _ in range(5)) == 3
    m.admission.refund("t", "spend", 2)
    assert not m.admission.try_admit("t", "spend", 1).allowed


def test_an_unanswered_worker_publishes_once_a_cadence_not_every_tick() -> None:
    led = QuotaLedger("a")
    p = quota()
    led.try_spend(T0, p, 1)
    assert led.fresh and len(led.flush(T0, 1, lambda _k: "o")) == 1
    for ms in range(5, 1000, 5):  # ticks while the owner does not answer
        led.try_spend(T0 + ms, p, 1)
        assert not led.fresh, ms
