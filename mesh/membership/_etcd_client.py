"""A small etcd v3 client over its JSON gRPC gateway (`/v3/...`), with httpx.

Why the gateway: python-etcd3 is unmaintained and breaks with current protobuf; the
gateway is part of every etcd v3 server, and speaks JSON with base64 keys and values.
Errors are translated into `PeerUnavailable` / `PeerRefused` here.
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx

from mesh.errors import PeerRefused, PeerUnavailable

__all__ = ["EtcdClient", "KeyValue", "WatchEvent"]


def _b64(s: str | bytes) -> str:
    return base64.b64encode(s.encode() if isinstance(s, str) else s).decode()


def _unb64(s: str) -> str:
    return base64.b64decode(s).decode()


def prefix_end(prefix: str) -> str:
    """The range_end that selects every key starting with `prefix`."""
    b = bytearray(prefix.encode())
    b[-1] += 1
    return bytes(b).decode()


@dataclass(frozen=True, slots=True)
class KeyValue:
    key: str
    value: str
    mod_revision: int
    lease: int = 0  # the lease that holds the key (0: none)


@dataclass(frozen=True, slots=True)
class WatchEvent:
    deleted: bool
    kv: KeyValue


class EtcdClient:
    def __init__(self, endpoints: tuple[str, ...], *, timeout_s: float = 2.0) -> None:
        self.endpoints = tuple(e.rstrip("/") for e in endpoints)
        self._http = httpx.AsyncClient(timeout=timeout_s)
        self._current = 0

    async def close(self) -> None:
        await self._http.aclose()

    async def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        last: Exception | None = None
        for i in range(len(self.endpoints)):
            ep = self.endpoints[(self._current + i) % len(self.endpoints)]
            try:
                resp = await self._http.post(f"{ep}{path}", json=body)
            except httpx.HTTPError as exc:
                last = exc
                continue
            self._current = (self._current + i) % len(self.endpoints)
            if resp.status_code != 200:
                raise PeerRefused(f"etcd{path}", f"HTTP {resp.status_code}: {resp.text[:200]}")
            try:
                out = resp.json()
            except ValueError as exc:
                raise PeerRefused(f"etcd{path}", f"answer is not JSON: {exc}") from exc
            if not isinstance(out, dict):
                kind = type(out).__name__
                raise PeerRefused(f"etcd{path}", f"answer is a JSON {kind}, not an object")
            return out
        raise PeerUnavailable(f"etcd{path}", f"no endpoint answered: {last}") from last

    async def grant(self, ttl_s: int) -> int:
        out = await self._post("/v3/lease/grant", {"TTL": ttl_s})
        return int(out["ID"])

    async def keepalive(self, lease: int) -> int:
        """Refresh a lease; returns its TTL, 0 if etcd no longer knows it."""
        out = await self._post("/v3/lease/keepalive", {"ID": str(lease)})
        return int(out.get("result", {}).get("TTL", 0))

    async def revoke(self, lease: int) -> None:
        await self._post("/v3/lease/revoke", {"ID": str(lease)})

    async def put(self, key: str, value: str, *, lease: int = 0) -> int:
        body: dict[str, Any] = {"key": _b64(key), "value": _b64(value)}
        if lease:
            body["lease"] = str(lease)
        out = await self._post("/v3/kv/put", body)
        return int(out["header"]["revision"])

    async def claim(self, key: str, value: str, *, lease: int) -> int:
        """Put `key` under `lease` only if the key is absent or already held by `lease`,
        in one transaction each; returns 0 when written, else the lease holding it."""
        put = {"request_put": {"key": _b64(key), "value": _b64(value), "lease": str(lease)}}
        get = {"request_range": {"key": _b64(key)}}
        absent = {"key": _b64(key), "result": "EQUAL", "target": "CREATE", "create_revision": "0"}
        ours = {"key": _b64(key), "result": "EQUAL", "target": "LEASE", "lease": str(lease)}
        for _ in range(3):  # the key may come or go between the two transactions
            for compare in (absent, ours):
                out = await self._post(
                    "/v3/kv/txn", {"compare": [compare], "success": [put], "failure": [get]}
                )
                if out.get("succeeded"):
                    return 0
                kvs = out.get("responses", [{}])[0].get("response_range", {}).get("kvs", [])
                holder = _kv(kvs[0]).lease if kvs else 0
                if kvs and holder != lease:
                    return holder or -1  # -1: held with no lease, by hand
        raise PeerUnavailable("etcd/v3/kv/txn", f"{key} kept changing while claimed")

    async def lease_ttl(self, lease: int) -> int:
        """Seconds left on a lease; -1 when etcd no longer knows it."""
        out = await self._post("/v3/lease/timetolive", {"ID": str(lease)})
        return int(out.get("TTL", -1))

    async def delete(self, key: str) -> None:
        await self._post("/v3/kv/deleterange", {"key": _b64(key)})

    async def range_prefix(self, prefix: str) -> tuple[int, list[KeyValue]]:
        out = await self._post(
            "/v3/kv/range", {"key": _b64(prefix), "range_end": _b64(prefix_end(prefix))}
        )
        kvs = [_kv(kv) for kv in out.get("kvs", [])]
        return int(out["header"]["revision"]), kvs

    async def watch(self, prefix: str, start_revision: int) -> AsyncIterator[list[WatchEvent]]:
        """Events under `prefix` from `start_revision` on, one list per etcd response."""
        body = {
            "create_request": {
                "key": _b64(prefix),
                "range_end": _b64(prefix_end(prefix)),
                "start_revision": str(start_revision),
            }
        }
        ep = self.endpoints[self._current]
        try:
            async with self._http.stream(
                "POST", f"{ep}/v3/watch", json=body, timeout=httpx.Timeout(5.0, read=None)
            ) as resp:
                if resp.status_code != 200:
                    raise PeerRefused("etcd/v3/watch", f"HTTP {resp.status_code}")
                async for line in resp.aiter_lines():
                    if not line.strip():
                        continue
                    result = json.loads(line).get("result", {})
                    if result.get("canceled") or result.get("compact_revision"):
                        raise PeerRefused("etcd/v3/watch", f"watch canceled: {result}")
                    events = [
                        WatchEvent(e.get("type") == "DELETE", _kv(e["kv"]))
                        for e in result.get("events", [])
                    ]
                    if events:
                        yield events
        except httpx.HTTPError as exc:
            raise PeerUnavailable("etcd/v3/watch", str(exc) or type(exc).__name__) from exc
        except (ValueError, KeyError) as exc:
            raise PeerRefused("etcd/v3/watch", f"unexpected answer: {exc!r}") from exc
        raise PeerUnavailable("etcd/v3/watch", "stream ended")


def _kv(kv: dict[str, Any]) -> KeyValue:
    return KeyValue(
        _unb64(kv["key"]),
        _unb64(kv.get("value", "")),
        int(kv.get("mod_revision", 0)),
        int(kv.get("lease", 0)),
    )
