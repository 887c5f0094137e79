"""The read-only worker key cannot veto a policy push, and watch declarations are bounded:
against a real governord.

The attack: a Watch with the mesh nodes' ``worker`` key declared generation N+1 of a key with
made-up values, and the operator's next Put failed FAILED_PRECONDITION; 6,144 declared
generations cost 6.7 MiB per watch (40 watches: 67 -> 340 MB). Now a watch's declarations are
what the node has, never a precondition on writers (a put that disagrees is reported, not
refused), one watch declares at most DECLARED_MAX, and governord keeps at most PINS_MAX.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from governor import wire
from governor.server._coordinator import DECLARED_MAX, PINS_MAX
from ratemesh import coordinator as cw
from tests.governor._daemon import Daemon, wait_until
from tests.governor._stores import make_target
from tests.governor.server.test_coordinator import (
    ADMIN_KEY,
    POLICY,
    WORKER_KEY,
    coordinator_section,
)

PUTS = 6  # the operator's pushes per phase


@pytest.fixture
def gov(tmp_path: Path) -> Iterator[Daemon]:
    for store in make_target("sqlite", tmp_path):
        d = Daemon(tmp_path, store, coordinator=coordinator_section())
        d.start()
        try:
            yield d
        finally:
            d.close()


class Coord:
    """Raw coordinator calls on one channel: (reply | None, code, detail)."""

    def __init__(self, addr: str) -> None:
        self.channel = grpc.insecure_channel(addr)

    def __call__(
        self, method: str, body: dict[str, Any], key: str = ADMIN_KEY
    ) -> tuple[dict[str, Any] | None, grpc.StatusCode, dict[str, Any]]:
        fn = self.channel.unary_unary(cw.method_path(method))
        try:
            reply = fn(cw.pack(body), metadata=((cw.API_KEY_MD, key),), timeout=30)
            return cw.unpack(reply, method), grpc.StatusCode.OK, {}
        except grpc.RpcError as exc:
            raw = dict(exc.trailing_metadata() or ()).get(wire.ERROR_MD)
            return None, exc.code(), wire.unpack(raw) if raw else {}

    def watch(self, declared: list[dict[str, Any]], member: str) -> Any:
        """Open a worker's watch and wait for its first snapshot (it is registered then)."""
        fn = self.channel.unary_stream(cw.method_path("Watch"))
        body = {"after_revision": 0, "declared": declared, "member_id": member}
        call = fn(cw.pack(body), metadata=((cw.API_KEY_MD, WORKER_KEY),), timeout=120)
        next(call)
        return call

    def close(self) -> None:
        self.channel.close()


def _push(coord: Coord, tenant: str, n: int) -> tuple[int, list[dict[str, Any]]]:
    """The operator's pushes: ``n`` changes of one key; (how many succeeded, the replies)."""
    ok, replies = 0, []
    for i in range(n):
        reply, code, detail = coord(
            "Put", {"policy": dict(POLICY, tenant_id=tenant, target_rate=100 + i)}
        )
        if code is grpc.StatusCode.OK:
            ok += 1
            assert reply is not None
            replies.append(reply)
    return ok, replies


def _made_up(tenant: str, first: int, count: int) -> list[dict[str, Any]]:
    """Generations the attacker declares for a key: above what governord holds, odd values."""
    return [
        dict(POLICY, tenant_id=tenant, generation=g, target_rate=999_999)
        for g in range(first, first + count)
    ]


@pytest.mark.slow
def test_a_worker_key_cannot_veto_the_operators_push(gov: Daemon) -> None:
    coord = Coord(gov.addr)
    try:
        baseline, _ = _push(coord, "acme", PUTS)
        assert baseline == PUTS
        # the attack: the next generations of acme (and of a key governord does not hold yet)
        attack = coord.watch(
            _made_up("acme", PUTS + 1, 2 * PUTS) + _made_up("globex", 1, 2 * PUTS), "mallory"
        )
        try:
            during, replies = _push(coord, "acme", PUTS)
            fresh, _ = _push(coord, "globex", PUTS)
            assert during == fresh == baseline  # the victim: every push lands
            # ...and the explicit generation the attacker declared lands too
            explicit = dict(POLICY, generation=3 * PUTS, target_rate=7)
            _, code, detail = coord("Put", {"policy": explicit})
            assert code is grpc.StatusCode.OK, detail
            # the disagreement is said, not obeyed: the reply names the watching node
            assert all(
                "node mallory loads acme/read_iops" in r["disagreements"][0] for r in replies
            )
            # the worker key itself still cannot write
            _, code, _ = coord("Put", {"policy": POLICY}, key=WORKER_KEY)
            assert code is grpc.StatusCode.PERMISSION_DENIED
        finally:
            attack.cancel()
        snap, code, _ = coord("List", {}, key=WORKER_KEY)
        assert code is grpc.StatusCode.OK and snap is not None
        gens = {p["tenant_id"]: p["generation"] for p in snap["policies"]}
        assert gens == {"acme": 3 * PUTS, "globex": PUTS}
    finally:
        coord.close()
    assert wait_until(lambda: "node mallory loads acme/read_iops" in gov.stderr(), 10)


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


@pytest.mark.slow
def test_watch_declarations_are_bounded(gov: Daemon) -> None:
    coord = Coord(gov.addr)
    watches: list[Any] = []
    try:
        # one watch declaring more than a policies file holds is refused, naming the bound
        fn = coord.channel.unary_stream(cw.method_path("Watch"))
        body = {"after_revision": 0, "declared": _made_up("acme", 1, 6144)}
        call = fn(cw.pack(body), metadata=((cw.API_KEY_MD, WORKER_KEY),), timeout=60)
        with pytest.raises(grpc.RpcError) as err:
            next(call)
        assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert str(DECLARED_MAX) in str(err.value.details()) and "declared" in str(
            err.value.details()
        )

        # 40 watches each declaring the most allowed: governord keeps at most PINS_MAX of them
        assert gov.proc is not None
        before = _rss_kib(gov.proc.pid)
        baseline, _ = _push(coord, "acme", PUTS)
        for i in range(40):
            watches.append(coord.watch(_made_up(f"t{i}", 1, DECLARED_MAX), f"w{i}"))
        grown_mib = (_rss_kib(gov.proc.pid) - before) / 1024
        # each watch kept its whole declaration: 40 x 2,048 took about 96 MiB; now governord
        # keeps PINS_MAX small entries in all (about 22 MiB with the decoder's leftovers)
        assert grown_mib < 48, grown_mib
        assert "PINS_MAX" in gov.stderr() or wait_until(lambda: "PINS_MAX" in gov.stderr(), 10)
        # the victim: a node's own watch still opens, and the operator's pushes land
        watches.append(coord.watch([dict(POLICY, generation=1)], "node-a"))
        during, _ = _push(coord, "acme", PUTS)
        assert during == baseline == PUTS
    finally:
        for w in watches:
            w.cancel()
        coord.close()
    assert PINS_MAX < 40 * DECLARED_MAX  # the test reaches the bound
