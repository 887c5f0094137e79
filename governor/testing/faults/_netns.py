"""A network namespace joined to the host by a veth pair, and a partition of it (root only).

It models a governord that loses the network while it keeps running: the process inside the
namespace reaches the host only over the veth pair (there is no other route), and
`partition(True)` adds iptables DROP rules in the namespace for everything to and from the
host's end, so its packets vanish silently (no RST, no ICMP) until `partition(False)`; TCP
retransmits then carry on what was in flight. PostgreSQL listens only on 127.0.0.1, so the
process inside reaches it through `proxy_to`: a `DelayProxy` on the host's end of the pair.
Clients on the host reach a server inside at `ns_address` directly.

Addresses are 10.X.Y.Z/30 with X in 214..253 and Y from the pid (the mesh's partition test
uses 10.213.*), Z from a per-process sequence; names carry the pid, so namespaces left behind
by a killed run are deleted by the next one (`sweep_stale`).
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import signal
import subprocess
import threading
from collections.abc import Sequence
from types import TracebackType
from typing import Any

from ._proxy import DelayProxy

SUBNET_SECOND_OCTET_MIN = 214  # 10.214.0.0 .. 10.253.255.255; 10.213.* is the mesh test's
SUBNET_SECOND_OCTETS = 40
NETNS_PER_PROCESS_MAX = 64  # /30 blocks in one 10.X.Y.0/24
COMMAND_TIMEOUT_S = 30.0  # one `ip` or `iptables` call (tenths of a second under load)
KILL_WAIT_S = 10.0  # for a process started with `popen` to exit at cleanup
NAME_PREFIX = "govf"
_NAME_RE = re.compile(rf"^{NAME_PREFIX}-(\d+)-(\d+)$")

_seq = itertools.count()
_seq_lock = threading.Lock()


class NetnsError(RuntimeError):
    """An `ip` or `iptables` command failed; the message names it and its stderr."""


class NetnsUnavailable(NetnsError):
    """Namespaces cannot be made here: not root, or `ip` / `iptables` is not installed."""


def tool(name: str) -> str:
    """The path of `name` (PATH, then /usr/sbin, as root's PATH may lack it), or raise."""
    path = shutil.which(name) or (
        f"/usr/sbin/{name}" if os.path.exists(f"/usr/sbin/{name}") else None
    )
    if path is None:
        package = "iproute2" if name == "ip" else name
        raise NetnsUnavailable(f"`{name}` is not installed (Debian package {package})")
    return path


def check_available() -> tuple[str, str]:
    """(ip, iptables) paths if namespaces can be made and partitioned here, else raise."""
    if os.geteuid() != 0:
        raise NetnsUnavailable("network namespaces need root (euid is not 0)")
    return tool("ip"), tool("iptables")


def _sh(argv: Sequence[str]) -> str:
    try:
        done = subprocess.run(
            list(argv), capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise NetnsError(f"{' '.join(argv)}: no answer in {COMMAND_TIMEOUT_S} s") from exc
    if done.returncode != 0:
        raise NetnsError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()}")
    return done.stdout


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale() -> list[str]:
    """Delete namespaces (and their veth) left by processes that are gone; their names."""
    ip, _ = check_available()
    swept = []
    for line in _sh([ip, "netns", "list"]).splitlines():
        name = line.split(" ", 1)[0]
        m = _NAME_RE.match(name)
        if m is None or _alive(int(m.group(1))):
            continue
        subprocess.run(
            [ip, "link", "del", _host_if(int(m.group(1)), int(m.group(2)))],
            capture_output=True,
            timeout=COMMAND_TIMEOUT_S,
        )
        subprocess.run([ip, "netns", "del", name], capture_output=True, timeout=COMMAND_TIMEOUT_S)
        swept.append(name)
    return swept


def _host_if(pid: int, seq: int) -> str:
    return f"gfh{pid}s{seq}"  # <= 13 characters: IFNAMSIZ is 16 with the NUL


def _ns_if(pid: int, seq: int) -> str:
    return f"gfn{pid}s{seq}"


def _block(pid: int, seq: int) -> tuple[str, str]:
    """(host, ns) addresses of this pid's `seq`-th /30."""
    idx = pid % (SUBNET_SECOND_OCTETS * 256)
    base = f"10.{SUBNET_SECOND_OCTET_MIN + idx // 256}.{idx % 256}"
    z = 4 * (seq % NETNS_PER_PROCESS_MAX)
    return f"{base}.{z + 1}", f"{base}.{z + 2}"


class Netns:
    """A namespace `name` whose veth end has `ns_address`; the host's end has `host_address`.

    `with Netns() as ns:` creates it and deletes it (processes started by `popen`, proxies
    from `proxy_to`, the veth pair, the namespace) even when the body fails.
    """

    def __init__(self) -> None:
        self.name = ""
        self.host_address = ""
        self.ns_address = ""
        self.host_if = ""
        self.ns_if = ""
        self._ip = ""
        self._iptables = ""
        self._partitioned = False
        self._partition_port: int | None = None
        self._procs: list[subprocess.Popen[Any]] = []
        self._proxies: list[DelayProxy] = []
        self._created = False

    # -- life cycle ------------------------------------------------------------------------

    def create(self) -> Netns:
        if self._created:
            raise NetnsError(f"Netns {self.name}: already created")
        self._ip, self._iptables = check_available()
        sweep_stale()
        pid = os.getpid()
        in_use = _sh([self._ip, "-o", "-4", "addr", "show"])
        for _ in range(NETNS_PER_PROCESS_MAX):
            with _seq_lock:
                seq = next(_seq) % NETNS_PER_PROCESS_MAX
            host, ns = _block(pid, seq)
            if f" {host}/" not in in_use and f" {ns}/" not in in_use:
                break
        else:
            raise NetnsError(
                f"Netns: all {NETNS_PER_PROCESS_MAX} address blocks of pid {pid} in use"
            )
        self.name = f"{NAME_PREFIX}-{pid}-{seq}"
        self.host_address, self.ns_address = host, ns
        self.host_if, self.ns_if = _host_if(pid, seq), _ns_if(pid, seq)
        ip, n = self._ip, self.name
        self._created = True  # from here on, close() undoes what was done
        try:
            for argv in (
                [ip, "netns", "add", n],
                [ip, "link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if],
                [ip, "link", "set", self.ns_if, "netns", n],
                [ip, "addr", "add", f"{host}/30", "dev", self.host_if],
                [ip, "-n", n, "addr", "add", f"{ns}/30", "dev", self.ns_if],
                [ip, "link", "set", self.host_if, "up"],
                [ip, "-n", n, "link", "set", self.ns_if, "up"],
                [ip, "-n", n, "link", "set", "lo", "up"],
            ):
                _sh(argv)
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        """Kill what `popen` started, close the proxies, delete the veth pair and namespace.
        Every step is tried; the first failure is raised after the rest."""
        if not self._created:
            return
        self._created = False
        errors: list[str] = []
        for p in self._procs:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
            try:
                p.wait(KILL_WAIT_S)
            except subprocess.TimeoutExpired:
                errors.append(f"pid {p.pid} did not exit after SIGKILL")
            for stream in (p.stdin, p.stdout, p.stderr):
                if stream is not None:
                    stream.close()
        self._procs.clear()
        for proxy in self._proxies:
            proxy.close()
        self._proxies.clear()
        for argv in (
            [self._ip, "link", "del", self.host_if],
            [self._ip, "netns", "del", self.name],
        ):
            done = subprocess.run(argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
            # The veth may be absent (creation failed before it, or it went with the namespace).
            if done.returncode != 0 and "Cannot find device" not in done.stderr:
                errors.append(f"{' '.join(argv)}: {done.stderr.strip()}")
        if errors:
            raise NetnsError(f"Netns {self.name} cleanup: " + "; ".join(errors))

    def __enter__(self) -> Netns:
        return self.create()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- processes inside ------------------------------------------------------------------

    def exec_argv(self, argv: Sequence[str]) -> list[str]:
        """`argv` run inside the namespace (`ip netns exec NAME ...`)."""
        self._require()
        return [self._ip, "netns", "exec", self.name, *argv]

    def run(self, argv: Sequence[str], **kw: Any) -> subprocess.CompletedProcess[Any]:
        """`subprocess.run` inside the namespace (pass `timeout=`: a partition can hang it)."""
        return subprocess.run(self.exec_argv(argv), **kw)

    def popen(self, argv: Sequence[str], **kw: Any) -> subprocess.Popen[Any]:
        """`subprocess.Popen` inside the namespace; SIGKILLed at cleanup if still running.
        (`ip netns exec` execs the command, so the pid is the process's own: send it signals.)"""
        p: subprocess.Popen[Any] = subprocess.Popen(self.exec_argv(argv), **kw)
        self._procs.append(p)
        return p

    # -- faults ----------------------------------------------------------------------------

    def partition(self, on: bool, *, port: int | None = None) -> None:
        """Drop (True) or stop dropping (False) every packet between the namespace and the
        host's end of the pair; with ``port``, only TCP to and from that host port (cut a
        process off from its database's proxy while its clients still reach it). Idempotent;
        returns once the rules are in place."""
        self._require()
        if on == self._partitioned:
            return
        if not on:
            port = self._partition_port  # remove exactly the rules that were added
        op = "-A" if on else "-D"
        rules = [("INPUT", "-s", "--sport"), ("OUTPUT", "-d", "--dport")]
        for chain, flag, port_flag in rules:
            match = [flag, f"{self.host_address}/32"]
            if port is not None:
                match += ["-p", "tcp", port_flag, str(port)]
            _sh(self.exec_argv([self._iptables, op, chain, *match, "-j", "DROP"]))
        self._partitioned = on
        self._partition_port = port

    @property
    def partitioned(self) -> bool:
        return self._partitioned

    def proxy_to(self, target: tuple[str, int], **kw: Any) -> DelayProxy:
        """A started `DelayProxy` on `host_address` (port 0) forwarding to `target` on the
        host, e.g. ("127.0.0.1", 5432); closed at cleanup. A process inside connects to its
        `address`. `kw` goes to `DelayProxy` (connections_max, buffered_bytes_max)."""
        self._require()
        proxy = DelayProxy(target, (self.host_address, 0), **kw).start()
        self._proxies.append(proxy)
        return proxy

    def _require(self) -> None:
        if not self._created:
            raise NetnsError("Netns: not created (use `with Netns() as ns:` or create())")
