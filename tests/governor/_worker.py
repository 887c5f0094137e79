"""A worker process for the dead-worker test: opens a session (TTL from argv), takes N leases of
``db`` under one task, prints ``token T`` and ``lease L`` lines, then waits to be SIGKILLed."""

from __future__ import annotations

import asyncio
import sys

from governor.client import Client


async def main(addr: str, key: str, ttl_ms: int, leases: int) -> None:
    client = await Client(addr, key, ttl_ms=ttl_ms).connect()
    node = await client.create_node("worker-job")
    print(f"token {client._rpc.token}", flush=True)
    for _ in range(leases):
        lease = await client.acquire_at(node, "db")
        print(f"lease {lease.lease_id}", flush=True)
    print("ready", flush=True)
    await asyncio.sleep(3600)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])))
