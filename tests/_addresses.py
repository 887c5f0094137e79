"""Reading the addresses a test's listeners report, with the one host:port parser."""

from __future__ import annotations

from ratemesh.checks import address_parts

__all__ = ["host_port", "on_loopback", "port_of"]


def host_port(address: str) -> tuple[str, int]:
    """`host:port` (an IPv6 host in brackets) as (host without brackets, port)."""
    return address_parts("address", address, allow_zero_port=True)


def port_of(address: str) -> int:
    return host_port(address)[1]


def on_loopback(address: str) -> str:
    """127.0.0.1 on `address`'s port: how a test dials a listener bound to every interface."""
    return f"127.0.0.1:{port_of(address)}"
