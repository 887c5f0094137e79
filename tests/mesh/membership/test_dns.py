"""DNS membership against a real DNS server (Debian's dnsmasq, started per test on a free
loopback port): the ring follows A and SRV records, members agree on the epoch, and a dead
server keeps the last ring, marked stale. Plus the config's dns section."""

from __future__ import annotations

import asyncio
import getpass
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import dns.nameserver
import dns.resolver
import pytest

from bench._procs import free_port
from mesh.config import parse_config
from mesh.core.policy import BOUNDS
from mesh.core.verdict import Suspension
from mesh.errors import ConfigError
from mesh.membership import DnsMembership, MembershipView
from mesh.membership._dns import next_epoch
from mesh.node import Mesh
from tests.mesh._util import require_binary, until

NAME = "mesh.test"
SRV = "_ratemesh._tcp.mesh.test"
INTERVAL_MS, SLOT_MS = 100, 1000


def require_dnsmasq() -> str:
    return require_binary("dnsmasq", "dnsmasq")


class Dnsmasq:
    """A dnsmasq on 127.0.0.1:<free port> serving only what the test writes: A records from
    a hosts file (re-read on SIGHUP) and SRV records from its config (read at start)."""

    def __init__(self, tmp: Path) -> None:
        self.binary = require_dnsmasq()
        self.port = free_port()
        self.hosts = tmp / "hosts"
        self.conf = tmp / "dnsmasq.conf"
        self.log = tmp / "dnsmasq.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.set_hosts({})

    def set_hosts(self, records: dict[str, list[str]], *, reload: bool = False) -> None:
        lines = [f"{ip} {name}" for name, ips in records.items() for ip in ips]
        self.hosts.write_text("".join(f"{line}\n" for line in lines))
        if reload and self.proc is not None:
            self.proc.send_signal(signal.SIGHUP)  # dnsmasq re-reads --addn-hosts files

    def start(self, srv: Sequence[tuple[str, int]] = ()) -> None:
        self.conf.write_text("".join(f"srv-host={SRV},{target},{port}\n" for target, port in srv))
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [
                    self.binary,
                    "--no-daemon",
                    f"--port={self.port}",
                    "--listen-address=127.0.0.1",
                    "--bind-interfaces",
                    "--no-resolv",
                    "--no-hosts",
                    f"--addn-hosts={self.hosts}",
                    "-C",
                    str(self.conf),
                    "--pid-file=",
                    "--local-ttl=0",
                    f"--user={getpass.getuser()}",
                ],
                stdout=log,
                stderr=log,
            )
        resolver = dns.resolver.Resolver(configure=False)
        resolver.nameservers = [dns.nameserver.Do53Nameserver("127.0.0.1", self.port)]
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                resolver.resolve("nothing.test", "A", lifetime=0.2)
            except dns.resolver.NoNameservers:  # it answers (REFUSED for unknown names)
                return
            except dns.exception.DNSException:
                pass
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise RuntimeError(f"dnsmasq did not start: {self.log.read_text()[-2000:]}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None


@pytest.fixture
def dnsmasq(tmp_path: Path) -> Iterator[Dnsmasq]:
    server = Dnsmasq(tmp_path)
    try:
        yield server
    finally:
        server.stop()


class _Member:
    """One member's DNS source, as a node would run it."""

    def __init__(self, server: Dnsmasq, member_id: str, record: str = "a") -> None:
        name = NAME if record == "a" else SRV
        self.source = DnsMembership(
            name,
            record=record,
            member_id=member_id,
            port=7001 if record == "a" else 0,
            nameservers=[("127.0.0.1", server.port)],
            interval_ms=INTERVAL_MS,
            epoch_slot_ms=SLOT_MS,
        )
        self.views: list[MembershipView] = []
        self.task = asyncio.get_running_loop().create_task(self.source.run(self.views.append))

    @property
    def view(self) -> MembershipView:
        return self.views[-1] if self.views else MembershipView()

    async def halt(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
        await self.source.close()


def _agree(members: list[_Member], ids: set[str]) -> Callable[[], bool]:
    def check() -> bool:
        views = [m.view for m in members]
        return (
            all(set(v.members) == ids and not v.stale for v in views)
            and len({v.epoch for v in views}) == 1
        )

    return check


def _monotone(m: _Member) -> bool:
    epochs = [v.epoch for v in m.views]
    return all(a <= b for a, b in zip(epochs, epochs[1:], strict=False))


@pytest.mark.slow
def test_a_records_ring_follows_and_a_dead_server_keeps_it_stale(dnsmasq: Dnsmasq) -> None:
    dnsmasq.set_hosts({NAME: ["127.0.0.2", "127.0.0.3"]})
    dnsmasq.start()

    async def main() -> None:
        a, b = _Member(dnsmasq, "127.0.0.2"), _Member(dnsmasq, "127.0.0.3")
        both = {"127.0.0.2", "127.0.0.3"}
        await until(_agree([a, b], both), 5, "both members resolved and agree")
        assert a.view.members == {"127.0.0.2": "127.0.0.2:7001", "127.0.0.3": "127.0.0.3:7001"}
        first = a.view.epoch
        assert first % SLOT_MS == 0, "a first answer takes the slot's start"

        dnsmasq.set_hosts({NAME: ["127.0.0.2", "127.0.0.3", "127.0.0.4"]}, reload=True)
        await until(_agree([a, b], both | {"127.0.0.4"}), 5, "a third member appeared")
        grown = a.view.epoch
        assert grown > first
        late = _Member(dnsmasq, "127.0.0.4")  # starts after the change: a slot later at worst
        await until(
            _agree([a, b, late], both | {"127.0.0.4"}),
            2 * SLOT_MS / 1000 + 3,
            "a member that started late agrees by the next slot",
        )

        dnsmasq.set_hosts({NAME: ["127.0.0.3", "127.0.0.4"]}, reload=True)
        await until(
            _agree([a, b, late], {"127.0.0.3", "127.0.0.4"}),
            2 * SLOT_MS / 1000 + 3,
            "the first member left the records",
        )
        shrunk = a.view.epoch
        assert shrunk > grown
        await until(
            lambda: a.view.epoch // SLOT_MS > shrunk // SLOT_MS,
            2 * SLOT_MS / 1000 + 2,
            "a new slot re-stamps the epoch",
        )
        await until(_agree([a, b, late], {"127.0.0.3", "127.0.0.4"}), 2, "re-stamped alike")
        assert a.view.epoch % SLOT_MS == 0

        dnsmasq.stop()  # unreachable: keep the last ring, marked stale
        kept = a.view
        await until(lambda: a.view.stale and b.view.stale, 5, "membership marked stale")
        assert a.view.members == kept.members and a.view.epoch == kept.epoch
        assert "dns" in a.source.last_error
        await asyncio.sleep(2 * SLOT_MS / 1000)  # no re-stamp while stale
        assert a.view.epoch == kept.epoch and a.view.stale

        dnsmasq.start()  # same records: fresh again, the same members
        await until(_agree([a, b, late], {"127.0.0.3", "127.0.0.4"}), 5, "fresh again")
        assert a.view.epoch >= kept.epoch
        for m in (a, b, late):
            assert _monotone(m), [v.epoch for v in m.views]
            await m.halt()

    asyncio.run(main())


@pytest.mark.slow
def test_an_empty_answer_keeps_the_last_ring(dnsmasq: Dnsmasq) -> None:
    dnsmasq.set_hosts({NAME: ["127.0.0.2"]})
    dnsmasq.start()

    async def main() -> None:
        a = _Member(dnsmasq, "127.0.0.2")
        await until(lambda: set(a.view.members) == {"127.0.0.2"}, 5, "resolved")
        dnsmasq.set_hosts({}, reload=True)  # the record vanished: not "no members"
        await until(lambda: a.view.stale, 5, "an empty answer marks membership stale")
        assert set(a.view.members) == {"127.0.0.2"}
        await a.halt()

    asyncio.run(main())


@pytest.mark.slow
def test_srv_records_name_members_by_target(dnsmasq: Dnsmasq) -> None:
    dnsmasq.set_hosts({"a.mesh.test": ["127.0.0.2"], "b.mesh.test": ["127.0.0.3"]})
    dnsmasq.start([("a.mesh.test", 7001), ("b.mesh.test", 7002)])

    async def main() -> None:
        a, b = _Member(dnsmasq, "a.mesh.test", "srv"), _Member(dnsmasq, "b.mesh.test", "srv")
        await until(_agree([a, b], {"a.mesh.test", "b.mesh.test"}), 5, "SRV resolved")
        assert a.view.members == {"a.mesh.test": "127.0.0.2:7001", "b.mesh.test": "127.0.0.3:7002"}
        before = a.view.epoch
        # SRV records live in dnsmasq's config, read at start: restart it with a third
        # target, one without an address record (dialled by name).
        dnsmasq.stop()
        await until(lambda: a.view.stale, 5, "stale while the server restarts")
        dnsmasq.start([("a.mesh.test", 7001), ("b.mesh.test", 7002), ("c.mesh.test", 7003)])
        ids = {"a.mesh.test", "b.mesh.test", "c.mesh.test"}
        await until(_agree([a, b], ids), 2 * SLOT_MS / 1000 + 3, "the ring follows SRV")
        assert a.view.members["c.mesh.test"] == "c.mesh.test:7003"
        assert a.view.epoch > before
        for m in (a, b):
            await m.halt()

    asyncio.run(main())


@pytest.mark.slow
def test_mesh_nodes_follow_dns_and_share_limits_disclose_staleness(dnsmasq: Dnsmasq) -> None:
    port = free_port()
    ids = ["127.0.0.2", "127.0.0.3"]
    dnsmasq.set_hosts({NAME: ids})
    dnsmasq.start()
    share = {
        "tenant_id": "acme",
        "metric": "read_iops",
        "generation": 1,
        "mode": "share",
        "target_rate": 1000,
        "global_burst": 100,
        "local_burst_cap": 20,
    }

    def config(ip: str) -> dict[str, Any]:
        return {
            "member_id": ip,
            "listen": f"{ip}:{port}",
            "shutdown_drain_ms": 200,
            "policies": {"inline": [share]},
            "membership": {
                "source": "dns",
                "name": NAME,
                "record": "a",
                "port": port,
                "nameservers": [f"127.0.0.1:{dnsmasq.port}"],
                "interval_ms": INTERVAL_MS,
                "epoch_slot_ms": SLOT_MS,
            },
        }

    async def main() -> None:
        async with Mesh(config(ids[0])) as a, Mesh(config(ids[1])) as b:
            await until(
                lambda: (
                    a.ring.members == b.ring.members == tuple(ids) and a.ring.epoch == b.ring.epoch
                ),
                5,
                "both rings from DNS",
            )
            v = a.try_admit("acme", "read_iops")
            assert v.bound == BOUNDS["share"] and v.suspended is None, v
            assert a.health()["membership"]["N"] == 2

            dnsmasq.set_hosts({NAME: ids[:1]}, reload=True)
            await until(
                lambda: a.ring.members == b.ring.members == (ids[0],),
                5,
                "the ring follows the records",
            )

            dnsmasq.stop()
            epoch = a.ring.epoch
            await until(lambda: a.health()["membership"]["stale"], 5, "stale")
            assert a.ring.members == (ids[0],) and a.ring.epoch == epoch
            v = a.try_admit("acme", "read_iops")
            assert v.suspended is Suspension.MEMBERSHIP_STALE, v
            assert v.bound == BOUNDS["share_stale"]

    asyncio.run(main())


def test_epoch_rule() -> None:
    slot = 7 * SLOT_MS
    assert next_epoch(0, slot, first=True, changed=True) == slot
    assert next_epoch(slot, slot, first=False, changed=False) == slot
    assert next_epoch(slot, slot, first=False, changed=True) == slot + 1
    assert next_epoch(slot + 1, slot, first=False, changed=True) == slot + 2
    assert next_epoch(slot + 2, slot + SLOT_MS, first=False, changed=False) == slot + SLOT_MS
    # seen at the slot's first resolution or at a later one: the same epoch
    assert next_epoch(slot - SLOT_MS + 3, slot, first=False, changed=True) == slot + 1
    assert next_epoch(slot + 5, slot - SLOT_MS, first=False, changed=True) == slot + 6  # clock back


# -- the config's dns section --------------------------------------------------------------

DNS = {"source": "dns", "name": NAME, "record": "a", "port": 7001}


@pytest.mark.parametrize(
    "membership, field",
    [
        ({"source": "dns"}, "membership.name"),
        (dict(DNS, name="bad..name"), "membership.name"),
        (dict(DNS, record="mx"), "membership.record"),
        ({"source": "dns", "name": NAME}, "membership.port"),
        (dict(DNS, port=70000), "membership.port"),
        (dict(DNS, record="srv"), "membership.port"),
        (dict(DNS, nameservers=["dns.example:53"]), "membership.nameservers[0]"),
        (dict(DNS, nameservers="10.0.0.1"), "membership.nameservers"),
        (dict(DNS, interval_ms=5), "membership.interval_ms"),
        (dict(DNS, epoch_slot_ms=1500, interval_ms=1000), "membership.epoch_slot_ms"),
        (dict(DNS, members={"a": "127.0.0.1:1"}), "membership.members"),
        ({"source": "static", "members": {"a": "127.0.0.1:1"}, "name": NAME}, "membership.name"),
        ({"source": "consul"}, "membership.source"),
    ],
)
def test_dns_config_errors_name_the_key(membership: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config({"member_id": "127.0.0.2", "membership": membership})
    assert err.value.field == field, str(err.value)


def test_dns_config_parses_and_warns() -> None:
    cfg = parse_config(
        {
            "member_id": "127.0.0.2",
            "membership": dict(
                DNS, nameservers=["127.0.0.1:5353", "[::1]", "10.0.0.10"], interval_ms=500
            ),
        }
    )
    m = cfg.membership
    assert m is not None and m.source == "dns" and m.port == 7001
    assert m.nameservers == (("127.0.0.1", 5353), ("::1", 53), ("10.0.0.10", 53))
    assert m.interval_ms == 500 and m.epoch_slot_ms == 30_000
    assert not [w for w in cfg.warnings() if w.startswith(("member_id", "membership"))]

    named = parse_config({"member_id": "web-0", "membership": DNS})
    assert any("A records name members by address" in w for w in named.warnings())
    srv = parse_config(
        {"member_id": "web-0", "membership": {"source": "dns", "name": SRV, "record": "srv"}}
    )
    assert any("SRV records name members by target" in w for w in srv.warnings())
    open_dns = parse_config(
        {
            "member_id": "10.0.0.5",
            "listen": "10.0.0.5:7001",
            "allow_plaintext": True,
            "membership": DNS,
        }
    )
    assert any("peers come from DNS without tls" in w for w in open_dns.warnings())
