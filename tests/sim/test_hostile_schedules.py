"""Schedules chosen to break the envelope: traffic that moves between workers and comes back,
on/off bursts with idles past every horizon, amounts at and above each share. The workload
shapes and the checkers that judge them (every interval of the recorded admissions;
starvation against an exact token bucket fed the same history) are tested on their own
first, then the mesh on each scenario over a few seeds."""

from __future__ import annotations

from typing import Any

import pytest

from mesh.core.gcra import NS_PER_S
from mesh.errors import ConfigError, MeshError
from sim.measure import Asked, Recorder, starvation
from sim.runner import run
from sim.scenario import load, names, parse
from sim.workload import Arrival, Workload

MS = 1_000_000
HOSTILE = ("migrating", "migrating-short", "on-off", "large-amounts")
SEEDS = (0, 1, 2)
# Scenarios the mesh core does not yet keep within its envelope, or starves on, and how. Each
# is expected to fail until the core is fixed (strict: a pass says so, and the name comes
# off this list); the failure lists every seed with its figures.
KNOWN_BROKEN = {
    "on-off": "an ask of exactly b on a worker whose own smaller asks always have a unit or "
    "two in flight waits two retries (the view holds at most b unreflected): 0-1 a run",
    "large-amounts": "the same: asks of exactly b beside a trickle, 1-4 of about 1,000 a run",
}

BASE: dict[str, Any] = {
    "name": "x",
    "duration_s": 1,
    "fleet": {"workers": 4},
    "policy": {"rate": 1000, "burst": 100, "local_burst_cap": 20},
}


def arrivals(sc_data: dict[str, Any], seconds: float) -> list[tuple[int, str, str, int]]:
    sc = parse(sc_data)
    w = Workload(sc, 1, sc.worker_ids())
    out = []
    for step in range(1, int(seconds * 1000) + 1):
        t = step * MS
        out += [(t, a.worker, a.tenant, a.amount) for a in w.step(t)]
    return out


def test_the_hostile_scenarios_ship() -> None:
    assert set(HOSTILE) <= set(names())


# -- the workload shapes ---------------------------------------------------------------


def test_phases_move_traffic_between_workers_and_idle_between() -> None:
    tenant = {
        "name": "m",
        "offered": 2000,
        "phases": [
            {"for_s": 0.2, "workers": ["w0000"]},
            {"for_s": 0.2, "workers": ["w0001"]},
            {"for_s": 0.3, "offered": 0},
            {"for_s": 0.2, "workers": ["w0000"], "offered": 500},
        ],
    }
    got = arrivals({**BASE, "tenants": [tenant]}, 1.0)

    def where(t0_s: float, t1_s: float) -> tuple[set[str], int]:
        rows = [a for a in got if t0_s * NS_PER_S <= a[0] < t1_s * NS_PER_S]
        return {a[1] for a in rows}, len(rows)

    for (t0, t1), (workers, n) in {
        (0.0, 0.2): ({"w0000"}, 400),
        (0.2, 0.4): ({"w0001"}, 400),
        (0.4, 0.7): (set(), 0),
        (0.7, 0.9): ({"w0000"}, 100),
        (0.9, 1.0): (set(), 0),  # past the last phase, no repeat: idle
    }.items():
        got_workers, got_n = where(t0, t1)
        assert got_workers == workers and abs(got_n - n) <= 0.2 * n, (t0, t1, got_workers, got_n)


def test_repeated_phases_cycle_and_spread_over_their_workers() -> None:
    tenant = {
        "name": "m",
        "offered": 3000,
        "repeat": True,
        "start_s": 0.1,
        "phases": [{"for_s": 0.1, "workers": ["w0002", "w0003"]}, {"for_s": 0.15, "offered": 0}],
    }
    got = arrivals({**BASE, "tenants": [tenant]}, 1.0)
    on = [a for a in got if (a[0] // MS - 100) % 250 < 100]  # 0.1 s on in every 0.25 s
    assert len(on) == len(got) > 0
    assert {a[1] for a in got} == {"w0002", "w0003"}
    starts = sorted({(a[0] // MS - 100) // 250 for a in got})
    assert starts == [0, 1, 2, 3]  # four cycles in 0.9 s


def test_amounts_are_drawn_by_weight_and_offered_counts_units() -> None:
    tenant = {"name": "a", "offered": 5000, "amounts": [{"amount": 1, "weight": 3}, 10]}
    got = arrivals({**BASE, "tenants": [tenant]}, 1.0)
    sizes = [a[3] for a in got]
    assert set(sizes) == {1, 10}
    assert sizes.count(1) / len(sizes) == pytest.approx(0.75, abs=0.05)
    assert sum(sizes) == pytest.approx(5000, rel=0.1)


def test_plain_tenants_draw_the_same_arrivals_as_before() -> None:
    """A tenant without the new fields draws nothing more: old seeds replay exactly."""
    plain = {**BASE, "tenants": [{"name": "a", "offered": 3000}]}
    shaped = {**BASE, "tenants": [{"name": "a", "offered": 3000, "retry_ms": 50}]}
    assert arrivals(plain, 0.3) == arrivals(shaped, 0.3)


@pytest.mark.parametrize(
    "tenant, field",
    [
        ({"phases": [{"for_s": 1, "workers": ["w0009"]}]}, "tenants[0].phases[0].workers[0]"),
        ({"phases": [{"workers": ["w0000"]}]}, "tenants[0].phases[0].for_s"),
        ({"phases": [{"for_s": 1, "rate": 5}]}, "tenants[0].phases[0].rate"),
        ({"repeat": True}, "tenants[0].repeat"),
        ({"amounts": [0]}, "tenants[0].amounts[0].amount"),
        ({"amounts": [{"amount": 5, "weight": -1}]}, "tenants[0].amounts[0].weight"),
        ({"amounts": []}, "tenants[0].amounts"),
        ({"retry_ms": 0}, "tenants[0].retry_ms"),
    ],
)
def test_bad_shapes_name_the_field(tenant: dict[str, Any], field: str) -> None:
    with pytest.raises(MeshError) as info:
        parse({**BASE, "tenants": [{"name": "a", "offered": 100, **tenant}]})
    assert info.value.field == field, info.value


def test_a_scenario_sets_the_cores_config() -> None:
    sc = parse({**BASE, "core": {"views_idle_ms": 300}, "tenants": [{"name": "a", "offered": 1}]})
    cfg = sc.core_config()
    assert cfg.views_idle_ms == 300 and cfg.sync_interval_ms == sc.fleet.sync_interval_ms
    for core, field in [
        ({"views_idle": 300}, "core.views_idle"),
        ({"views_idle_ms": 0}, "core.views_idle_ms"),
        ({"sync_interval_ms": 2}, "core.sync_interval_ms"),  # set under fleet:
    ]:
        with pytest.raises(ConfigError) as info:
            parse({**BASE, "core": core, "tenants": [{"name": "a", "offered": 1}]})
        assert info.value.field == field, info.value


# -- the checkers, on hand-made histories --------------------------------------------------


def starved(asked: list[Asked], admissions: list[tuple[int, int]], **kw: Any) -> list[Asked]:
    args: dict[str, Any] = {
        "rate": 1000,
        "burst": 100,
        "largest": 100,
        "d_ns": 10 * MS,
        "start_ns": 0,
        "end_ns": 2000 * MS,
        "step_ns": MS,
    }
    return starvation(asked, admissions, **{**args, **kw})


def test_a_request_never_admitted_while_the_bucket_had_room_starved() -> None:
    never = Asked(20, 100 * MS, 1100 * MS, None, 50 * MS)
    assert starved([never], []) == [never]
    late = Asked(20, 100 * MS, 1100 * MS, 900 * MS, 50 * MS)
    assert starved([late], [(900 * MS, 20)]) == [late]


def test_a_request_served_within_d_and_a_retry_did_not_starve() -> None:
    soon = Asked(20, 100 * MS, 155 * MS, 155 * MS, 50 * MS)
    assert starved([soon], [(155 * MS, 20)]) == []
    gave_up_soon = Asked(20, 100 * MS, 150 * MS, None, 50 * MS)
    assert starved([gave_up_soon], []) == []


def test_no_room_in_the_exact_bucket_is_no_starvation() -> None:
    """The strategy spent the room on other requests (R every millisecond): an exact limiter
    could not have served this one either."""
    busy = [(t * MS, 1) for t in range(0, 2000)]
    busy[0] = (0, 100)  # the burst spent at once
    waiting = Asked(20, 100 * MS, 1100 * MS, None, 50 * MS)
    assert starved([waiting], busy) == []
    # ... but one pause of 100 ms refills 100 units: then it could have been served
    paused = [(t, u) for t, u in busy if not 500 * MS <= t < 600 * MS]
    assert starved([waiting], paused) == [waiting]


def test_the_interval_check_sees_a_burst_the_lead_over_the_ideal_misses() -> None:
    """Offered R throughout, and 3x R for 100 ms near the end. The strategy admits nothing for
    0.5 s, then R, then all of the burst: behind the ideal by 500, its cumulative lead never
    turns positive; over the burst's 100 ms it admitted 300 against R x 0.1 s + B = 200."""
    sc = parse({**BASE, "tenants": [{"name": "a", "offered": 1000}]})
    w = Workload(sc, 1, sc.worker_ids())
    rec = Recorder(w.tenants, 0, MS)
    a = Arrival("w0000", "a", sc.policy.metric, 1)
    for step in range(1, 1001):
        t = step * MS
        for _ in range(3 if 800 < step <= 900 else 1):
            rec.record(a, step > 500, t)
        rec.sample(step, {"a"})
    rec.finish(1000, 1000 * MS)
    s = rec.summary(d_ns=0, n_default=1)
    assert s["lead_excess"] == 0
    assert s["interval_excess"] == pytest.approx(100, abs=3)
    assert s["max_excess"] == s["interval_excess"]
    assert not s["within_bound"] and s["bound"] == 20  # N*b + R*d with N = 1, d = 0


# -- the strategies on the scenarios -------------------------------------------------------


def figures(name: str, seed: int, strategy: str) -> dict[str, Any]:
    result, _ = run(load(name), seed, [strategy])
    return dict(result["strategies"][strategy])


def verdicts(name: str, strategy: str, seeds: tuple[int, ...]) -> list[str]:
    """One line per seed that broke the envelope or starved a request."""
    bad = []
    for seed in seeds:
        f = figures(name, seed, strategy)
        if not f["within_bound"] or f["starved"]:
            bad.append(
                f"{name} seed {seed} ({strategy}): max_excess {f['max_excess']} "
                f"(tenant {f['max_excess_tenant']}) vs bound {f['bound']} ({f['bound_formula']}),"
                f" starved {f['starved']} (by size, those above b not counted: "
                f"{f['starved_amounts']}), replay: "
                f"mesh sim run --scenario {name} --seed {seed} --strategies {strategy}"
            )
    return bad


@pytest.mark.slow
@pytest.mark.parametrize("name", HOSTILE)
def test_an_exact_limiter_passes_the_checkers(name: str) -> None:
    """The checkers do not flag a limiter that is exact (one counter, a round trip each)."""
    assert verdicts(name, "central-closed", (0,)) == []


@pytest.mark.slow
def test_the_checkers_catch_a_limiter_per_worker_when_traffic_moves() -> None:
    f = figures("migrating", 0, "local")
    assert not f["within_bound"] and f["max_excess"] > 2 * f["bound"], f


@pytest.mark.slow
def test_a_request_the_verdict_says_to_retry_is_asked_again() -> None:
    f = figures("large-amounts", 0, "central-closed")
    assert f["asked_again"] > 0 and f["attempts"] > f["requests"], f
    assert f["starved"] == 0 and f["unservable_said_retry"] == 0, f


def mesh_param(name: str) -> Any:
    marks = []
    if name in KNOWN_BROKEN:
        marks.append(pytest.mark.xfail(strict=True, reason=KNOWN_BROKEN[name]))
    return pytest.param(name, marks=marks)


@pytest.mark.slow
@pytest.mark.parametrize("name", [mesh_param(n) for n in HOSTILE])
def test_mesh_keeps_its_envelope_and_starves_nothing(name: str) -> None:
    bad = verdicts(name, "mesh", SEEDS)
    assert not bad, "\n".join(bad)


def test_idles_outlast_the_views_horizon() -> None:
    """Where a scenario idles a tenant to have its views forgotten, the idle is longer than
    twice views_idle_ms (a view is gone within about that), and the run stays short."""
    for name in HOSTILE:
        sc = load(name)
        assert sc.duration_s + sc.warmup_s <= 8, name
        horizon_s = 2 * sc.core_config().views_idle_ms / 1000
        idles = [p.for_s for t in sc.tenants for p in t.phases if p.offered == 0]
        if name in ("migrating", "on-off"):
            assert idles and max(idles) > horizon_s, (name, idles, horizon_s)
        if name == "migrating-short":
            assert idles and max(idles) < horizon_s / 2, (name, idles, horizon_s)
