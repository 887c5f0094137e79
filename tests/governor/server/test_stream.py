"""Multiplex, the stream that carries batches of short calls, against a real governord.

Streamed calls give the answers, status codes, details and SDK error classes of unary calls;
scope and credentials are as strict; malformed batches fail with the field named and change
nothing; calls in flight are resent across a governord restart and counted once.
"""

from __future__ import annotations

import asyncio
import functools
import signal
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import grpc
import pytest
from grpc import aio

from governor import wire
from governor.client import (
    AuthError,
    Client,
    Denied,
    GovernorClientError,
    NodeEnded,
    RequestError,
    ScopeError,
    SessionLost,
)
from tests.governor._daemon import KEYS, Daemon, Raw

A, B = KEYS["KEY_A"], KEYS["KEY_B"]
C = grpc.StatusCode


Outcome = tuple[str, str, dict[str, Any]]  # (code, reason, detail or reply)


class Stream:
    """A raw Multiplex call: send batches (maps or bytes), collect replies by id."""

    def __init__(self, addr: str, token: str | None = None, key: str | None = None) -> None:
        md = []
        if token is not None:
            md.append((wire.TOKEN_MD, token))
        if key is not None:
            md.append((wire.KEY_MD, key))
        self.channel = aio.insecure_channel(addr)
        self.call = self.channel.stream_stream(wire.path(wire.MULTIPLEX))(metadata=tuple(md))
        self.replies: dict[int, dict[str, Any]] = {}

    async def send(self, batch: list[dict[str, Any]] | bytes) -> None:
        data = batch if isinstance(batch, bytes) else wire.pack({"v": 1, "calls": batch})
        await self.call.write(data)

    async def wait(self, ids: list[int]) -> list[dict[str, Any]]:
        while not all(i in self.replies for i in ids):
            data = await asyncio.wait_for(self.call.read(), 30)
            assert data is not aio.EOF, "the stream ended early"
            message = wire.unpack(data)
            assert set(message) == {"v", "replies"} and message["v"] == 1
            for entry in message["replies"]:
                self.replies[entry["id"]] = entry
        return [self.replies.pop(i) for i in ids]

    async def ended(self) -> tuple[grpc.StatusCode, dict[str, Any]]:
        """Read to the end; the stream's status and governord's detail."""
        try:
            while (data := await asyncio.wait_for(self.call.read(), 30)) is not aio.EOF:
                for entry in wire.unpack(data)["replies"]:
                    self.replies[entry["id"]] = entry
        except grpc.RpcError as err:
            detail: dict[str, Any] = {}
            for k, v in err.trailing_metadata() or ():
                if k == wire.ERROR_MD:
                    detail = wire.unpack(v)
            return err.code(), detail
        return C.OK, {}

    async def close(self) -> None:
        self.call.cancel()
        await self.channel.close()


def call(cid: int, method: str, **body: Any) -> dict[str, Any]:
    return {"id": cid, "method": method, "body": wire.pack({"v": 1, **body})}


def outcome(entry: dict[str, Any]) -> Outcome:
    if "reply" in entry:
        return "OK", "", entry["reply"]
    return entry["code"], entry["error"]["reason"], entry["error"]


def unary_outcome(got: tuple[dict[str, Any] | None, grpc.StatusCode, dict[str, Any]]) -> Outcome:
    reply, code, detail = got
    return (code.name, "", reply or {}) if code is C.OK else (code.name, detail["reason"], detail)


@asynccontextmanager
async def stream(addr: str, **creds: Any) -> AsyncIterator[Stream]:
    s = Stream(addr, **creds)
    try:
        yield s
    finally:
        await s.close()


# ---- the schema, without a daemon ----------------------------------------------------------


def test_check_batch_refuses_bad_shapes_naming_the_field() -> None:
    good = call(1, "Consume", node_id=2, resource="http")
    for message, field in [
        ([good], "batch"),
        ({"calls": [good]}, "v"),
        ({"v": 2, "calls": [good]}, "v"),
        ({"v": 1, "calls": [good], "extra": 1}, "extra"),
        ({"v": 1}, "calls"),
        ({"v": 1, "calls": []}, "calls"),
        ({"v": 1, "calls": {"1": good}}, "calls"),
        ({"v": 1, "calls": [good, 7]}, "calls[1]"),
        ({"v": 1, "calls": [{**good, "id": "1"}]}, "calls[0].id"),
        ({"v": 1, "calls": [{**good, "id": -1}]}, "calls[0].id"),
        ({"v": 1, "calls": [{**good, "id": True}]}, "calls[0].id"),
        ({"v": 1, "calls": [good, good]}, "calls[1].id"),
    ]:
        with pytest.raises(wire.WireError) as err:
            wire.check_batch(message)
        assert err.value.field == field, message
    calls = wire.check_batch(
        {
            "v": 1,
            "calls": [
                good,
                {**call(2, "Consume"), "extra": 1},
                call(3, "Nope"),
                call(4, "Acquire", node_id=2, cls="db"),
                call(5, "WatchNode", node_id=2),
                {**call(6, "Consume"), "body": {"v": 1}},
            ],
        }
    )
    assert calls[0].method is wire.METHODS["Consume"] and calls[0].error is None
    assert [(c.id, c.method, c.error and c.error.field) for c in calls[1:]] == [
        (2, None, "calls[1].extra"),
        (3, None, "calls[2].method"),
        (4, None, "calls[3].method"),
        (5, None, "calls[4].method"),
        (6, None, "calls[5].body"),
    ]


def test_pack_batch_splits_what_would_not_fit() -> None:
    items = [{"id": i, "blob": b"x" * 100_000} for i in range(25)]
    chunks = wire.pack_batch("replies", items)
    assert len(chunks) > 1 and all(len(c) <= wire.MESSAGE_BYTES_MAX for c in chunks)
    assert [e["id"] for c in chunks for e in wire.unpack(c)["replies"]] == list(range(25))
    many = [{"id": i} for i in range(wire.CALLS_PER_BATCH_MAX + 5)]
    assert [len(wire.unpack(c)["replies"]) for c in wire.pack_batch("replies", many)] == [
        wire.CALLS_PER_BATCH_MAX,
        5,
    ]


# ---- the same answers as unary calls -------------------------------------------------------


@pytest.mark.slow
def test_streamed_calls_answer_like_unary_calls(daemon: Daemon, raw: Raw) -> None:
    """Each request goes once as a unary call and once on the stream, against twin nodes:
    the replies, status codes and details must be the same (node ids aside)."""
    tok, tok_b = raw.session(A), raw.session(B)
    scope = raw.ok("GetNode", {}, token=tok)["node_id"]
    node_b = raw.ok("CreateNode", {"name": "b"}, token=tok_b)["node_id"]
    lease_b = raw.ok("Acquire", {"node_id": node_b, "cls": "db"}, token=tok_b)["lease_id"]

    def script(node: int, rid: str) -> list[tuple[str, dict[str, Any]]]:
        return [
            ("Consume", {"node_id": node, "resource": "http", "amount": 2}),
            ("Consume", {"node_id": node, "resource": "http", "amount": 2}),  # denied: quota
            ("Consume", {"node_id": node, "resource": "http", "request_id": rid}),
            ("Consume", {"node_id": node, "resource": "http", "request_id": rid}),  # retry: same
            ("Consume", {"node_id": node, "resource": "http", "amount": 5, "request_id": rid}),
            ("Consume", {"node_id": node, "resource": "http", "amount": 0}),  # out of range
            ("Consume", {"node_id": node, "resource": 7}),  # wrong type
            ("Consume", {"node_id": node_b, "resource": "http"}),  # another tenant's node
            ("GetNode", {"node_id": 10_000}),  # not found
            ("SetQuota", {"node_id": scope, "resource": "http", "limit": 9}),  # the scope node
            ("SetLimit", {"node_id": node, "cls": "db", "limit": 3}),
            ("Release", {"lease_id": lease_b}),  # not the owner
            ("Validate", {"lease_id": lease_b}),
            ("EnsureNode", {"name": "child", "parent_id": node}),
            ("CloseNode", {"node_id": node}),
            ("Consume", {"node_id": node, "resource": "http"}),  # the node has ended
            ("Heartbeat", {}),
        ]

    def normal(o: Outcome, node: int) -> Outcome:
        code, reason, detail = o
        drop = {"message", "node_id", "top_consumer", "expires_ms"}
        clean = {k: v for k, v in detail.items() if k not in drop}
        if isinstance(clean.get("denial"), dict):
            d = clean["denial"]
            clean["denial"] = {**d, "node_id": d["node_id"] == node, "top_consumer": None}
        return code, reason, clean

    def twin() -> int:
        body = {"name": f"twin-{time.monotonic_ns()}", "quotas": {"http": 3}}
        return int(raw.ok("CreateNode", body, token=tok)["node_id"])

    unary_node = twin()
    unary = [
        normal(unary_outcome(raw(m, b, token=tok)), unary_node)
        for m, b in script(unary_node, "r-unary")
    ]

    async def streamed() -> list[Outcome]:
        node = twin()
        out = []
        async with stream(daemon.addr, token=tok) as s:
            for i, (m, b) in enumerate(script(node, "r-stream")):
                await s.send([call(i, m, **b)])  # one at a time: the script has an order
                (entry,) = await s.wait([i])
                out.append(normal(outcome(entry), node))
        return out

    got = asyncio.run(streamed())
    assert [o[:2] for o in got] == [o[:2] for o in unary]
    assert got == unary
    assert [o[0] for o in got] == [
        "OK", "RESOURCE_EXHAUSTED", "OK", "OK", "ALREADY_EXISTS", "INVALID_ARGUMENT",
        "INVALID_ARGUMENT", "PERMISSION_DENIED", "NOT_FOUND", "PERMISSION_DENIED", "OK",
        "PERMISSION_DENIED", "OK", "OK", "OK", "FAILED_PRECONDITION", "OK",
    ]  # fmt: skip


@pytest.mark.slow
def test_sdk_raises_the_same_error_classes_either_way(daemon: Daemon) -> None:
    async def run(multiplex: bool) -> list[tuple[type[BaseException] | None, str]]:
        out: list[tuple[type[BaseException] | None, str]] = []
        async with Client(daemon.addr, A, multiplex=multiplex) as client:
            async with Client(daemon.addr, B, multiplex=multiplex) as other:
                foreign = await other.create_node("theirs")
                task = await client.create_node("mine", quotas={"http": 2})

                async def attempt(coro: Any) -> None:
                    try:
                        await coro
                        out.append((None, ""))
                    except GovernorClientError as exc:
                        out.append((type(exc), exc.code))

                await attempt(client.consume_at(task, "http", 2))
                await attempt(client.consume_at(task, "http"))  # Denied
                await attempt(client.consume_at(foreign, "http"))  # ScopeError
                await attempt(client.get_node(10_000))  # RequestError NOT_FOUND
                await attempt(client.set_quota(client.scope_id, "http", 1))  # ScopeError
                await attempt(client.end_node(task))
                await attempt(client.consume_at(task, "http"))  # NodeEnded
                await attempt(client.call("Consume", {"node_id": task}))  # RequestError
                assert bool(client._rpc._muxes) is multiplex  # the calls took the stream
                await client.call("CloseSession", {})
                await attempt(client.call("Heartbeat", {}))  # SessionLost (session_ended)
                client.session_id = 0  # closed already
            return out

    unary = asyncio.run(run(False))
    streamed = asyncio.run(run(True))
    assert streamed == unary
    assert [cls for cls, _ in streamed] == [
        None, Denied, ScopeError, RequestError, ScopeError, None, NodeEnded, RequestError,
        SessionLost,
    ]  # fmt: skip


# ---- credentials and scope -----------------------------------------------------------------


@pytest.mark.slow
def test_scope_and_credentials_over_the_stream(daemon: Daemon, raw: Raw) -> None:
    ta, tb = raw.session(A), raw.session(B)
    nb = raw.ok("CreateNode", {"name": "b-job", "quotas": {"http": 5}}, token=tb)["node_id"]
    raw.ok("Consume", {"node_id": nb, "resource": "http"}, token=tb)
    lease_b = raw.ok("Acquire", {"node_id": nb, "cls": "db"}, token=tb)["lease_id"]
    before = raw.ok("GetNode", {"node_id": nb}, token=tb)
    attempts = [
        ("Consume", {"node_id": nb, "resource": "http"}),
        ("GetNode", {"node_id": nb}),
        ("CreateNode", {"name": "x", "parent_id": nb}),
        ("EnsureNode", {"name": "x", "parent_id": nb}),
        ("CancelNode", {"node_id": nb}),
        ("CloseNode", {"node_id": nb}),
        ("SetQuota", {"node_id": nb, "resource": "http", "limit": 100}),
        ("SetLimit", {"node_id": nb, "cls": "db", "limit": 100}),
        ("SetDefaults", {"node_id": nb, "defaults": {}}),
        ("Release", {"lease_id": lease_b}),
    ]

    async def scenario() -> None:
        async with stream(daemon.addr, token=ta) as s:  # all at once, in one batch
            await s.send([call(i, m, **b) for i, (m, b) in enumerate(attempts)])
            got = await s.wait(list(range(len(attempts))))
            assert {e["code"] for e in got} == {"PERMISSION_DENIED"}
            assert got[-1]["error"]["reason"] == "not_owner"
            assert {e["error"]["reason"] for e in got[:-1]} == {"out_of_scope"}
        async with stream(daemon.addr, key=A) as s:  # a bare key
            await s.send(
                [
                    call(1, "Consume", node_id=nb, resource="http"),
                    call(2, "EnsureNode", name="x", parent_id=nb),
                    call(3, "GetNode", node_id=nb),
                    call(4, "Heartbeat"),
                ]
            )
            got = await s.wait([1, 2, 3, 4])
            assert [(e["code"], e["error"]["reason"]) for e in got] == [
                ("PERMISSION_DENIED", "out_of_scope"),
                ("PERMISSION_DENIED", "out_of_scope"),
                ("PERMISSION_DENIED", "needs_session"),
                ("PERMISSION_DENIED", "needs_session"),
            ]
        for creds, reason in (
            ({"token": "forged-token-0123456789"}, "bad_token"),
            ({"key": "not-a-key"}, "bad_key"),
            ({}, "no_credentials"),
        ):
            # refused when the stream opens, from its metadata, before it holds anything
            async with stream(daemon.addr, **creds) as s:
                code, detail = await s.ended()
                assert (code, detail["reason"]) == (grpc.StatusCode.UNAUTHENTICATED, reason)
        # a session that ends while its stream is open: later calls learn it, one by one
        short = raw.session(A, ttl_ms=5000)
        async with stream(daemon.addr, token=short) as s:
            await s.send([call(1, "Heartbeat")])
            assert "reply" in (await s.wait([1]))[0]
            raw.ok("CloseSession", {}, token=short)
            await s.send([call(2, "GetNode")])
            (entry,) = await s.wait([2])
            assert (entry["code"], entry["error"]["reason"]) == ("UNAUTHENTICATED", "session_ended")

    asyncio.run(scenario())
    after = raw.ok("GetNode", {"node_id": nb}, token=tb)
    assert after == before


# ---- malformed batches ---------------------------------------------------------------------


@pytest.mark.slow
def test_malformed_batches_fail_with_the_field_and_change_nothing(daemon: Daemon, raw: Raw) -> None:
    tok = raw.session(A)
    node = raw.ok("CreateNode", {"name": "m", "quotas": {"http": 100}}, token=tok)["node_id"]
    ok = call(1, "Consume", node_id=node, resource="http")

    async def scenario() -> None:
        # one bad call is refused alone; the others in its batch run
        async with stream(daemon.addr, token=tok) as s:
            await s.send(
                [
                    ok,
                    call(2, "Nope"),
                    call(3, "Acquire", node_id=node, cls="db"),
                    {**call(4, "Consume"), "body": {"v": 1, "node_id": node}},
                    {**call(5, "Consume", node_id=node, resource="http"), "x": 1},
                    {"id": 6, "method": "Consume", "body": b"\xc1 garbage"},
                    call(7, "Consume", node_id=str(node), resource="http"),
                    {"id": 8, "method": "Consume", "body": wire.pack({"node_id": node})},
                ]
            )
            got = {e["id"]: e for e in await s.wait(list(range(1, 9)))}
            assert "reply" in got[1]
            fields = {i: got[i]["error"].get("field") for i in range(2, 9)}
            assert fields == {
                2: "calls[1].method",
                3: "calls[2].method",
                4: "calls[3].body",
                5: "calls[4].x",
                6: "body",
                7: "node_id",
                8: "v",
            }
            assert {got[i]["code"] for i in range(2, 9)} == {"INVALID_ARGUMENT"}
            assert {got[i]["error"]["reason"] for i in range(2, 9)} == {"malformed"}
        # a batch that cannot be answered call by call fails the stream; none of it runs
        for batch, field in [
            (b"\xc1\xff garbage", "batch"),
            (wire.pack([ok]), "batch"),
            (wire.pack({"v": 2, "calls": [ok]}), "v"),
            (wire.pack({"v": 1, "calls": [ok], "more": True}), "more"),
            (wire.pack({"v": 1, "calls": ok}), "calls"),
            (wire.pack({"v": 1, "calls": [ok, {**ok, "id": "2"}]}), "calls[1].id"),
            (wire.pack({"v": 1, "calls": [ok, ok]}), "calls[1].id"),
        ]:
            async with stream(daemon.addr, token=tok) as s:
                await s.send(batch)
                code, detail = await s.ended()
                assert code is C.INVALID_ARGUMENT, (batch, code)
                assert (detail["reason"], detail["field"]) == ("malformed", field), batch
                assert not s.replies

    asyncio.run(scenario())
    assert raw.ok("GetNode", {"node_id": node}, token=tok)["used"] == {"http": 1}


# ---- resends and restarts ------------------------------------------------------------------


@pytest.mark.slow
def test_resend_of_a_request_id_on_other_streams_is_answered_once(daemon: Daemon, raw: Raw) -> None:
    """The same request on three streams and as a unary call at once: one charge, one
    answer (in flight, or from the durable memory)."""
    tok = raw.session(A)
    node = raw.ok("CreateNode", {"name": "r", "quotas": {"http": 1000}}, token=tok)["node_id"]

    async def scenario() -> None:
        streams = [Stream(daemon.addr, token=tok) for _ in range(3)]
        try:
            loop = asyncio.get_running_loop()
            for n in range(20):
                body = {"node_id": node, "resource": "http", "amount": 3, "request_id": f"r{n}"}
                unary = loop.run_in_executor(
                    None, functools.partial(raw, "Consume", body, token=tok)
                )
                await asyncio.gather(*(s.send([call(n, "Consume", **body)]) for s in streams))
                got = [outcome(e) for s in streams for e in await s.wait([n])]
                got.append(unary_outcome(await unary))
                assert got == [("OK", "", {"node_id": node, "resource": "http", "amount": 3})] * 4
        finally:
            for s in streams:
                await s.close()

    asyncio.run(scenario())
    assert raw.ok("GetNode", {"node_id": node}, token=tok)["used"] == {"http": 60}


@pytest.mark.slow
def test_streamed_calls_are_resent_across_a_governord_restart(daemon: Daemon) -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        async with Client(daemon.addr, A, ttl_ms=6000) as client:
            node = await client.create_node("restart", quotas={"http": 10**9})
            lease = await client.acquire_at(node, "db")
            acked = 0
            stop = asyncio.Event()

            async def load() -> None:
                nonlocal acked
                while not stop.is_set():
                    await client.consume_at(node, "http", 1)
                    acked += 1

            callers = [asyncio.create_task(load()) for _ in range(16)]
            for _ in range(2):
                target = acked + 200
                while acked < target:
                    await asyncio.sleep(0.01)
                await loop.run_in_executor(None, daemon.kill)  # calls in flight on the stream
                await loop.run_in_executor(None, daemon.start)
            target = acked + 200
            while acked < target:
                await asyncio.sleep(0.01)
            stop.set()
            await asyncio.gather(*callers)
            assert client._rpc._muxes, "consume should travel on Multiplex"
            assert client.lost is None
            info = await client.get_node(node)
            assert info["used"]["http"] == acked  # resent with the same request id: once each
            assert await client.validate(lease.lease_id) is True
            assert await client.release(lease) is True

    asyncio.run(scenario())
    assert daemon.starts == 3


@pytest.mark.slow
def test_a_raw_resend_after_restart_gets_the_first_answer(daemon: Daemon, raw: Raw) -> None:
    tok = raw.session(A, ttl_ms=20_000)
    node = raw.ok("CreateNode", {"name": "x", "quotas": {"http": 10}}, token=tok)["node_id"]
    batch = [call(1, "Consume", node_id=node, resource="http", amount=4, request_id="once")]

    async def send() -> Outcome:
        async with stream(daemon.addr, token=tok) as s:
            await s.send(batch)
            return outcome((await s.wait([1]))[0])

    first = asyncio.run(send())
    daemon.kill()
    daemon.start()
    assert (
        asyncio.run(send())
        == first
        == ("OK", "", {"node_id": node, "resource": "http", "amount": 4})
    )
    r = Raw(daemon.addr)
    try:
        assert r.ok("GetNode", {"node_id": node}, token=tok)["used"] == {"http": 4}
    finally:
        r.close()


@pytest.mark.slow
def test_drain_ends_streams_unavailable(sqlite_daemon: Daemon) -> None:
    raw = Raw(sqlite_daemon.addr)
    try:
        tok = raw.session(A)
    finally:
        raw.close()

    async def scenario() -> None:
        async with stream(sqlite_daemon.addr, token=tok) as s:
            await s.send([call(1, "Heartbeat")])
            await s.wait([1])
            started = time.monotonic()
            sqlite_daemon.signal(signal.SIGTERM)
            code, detail = await s.ended()
            assert (code, detail.get("reason")) == (C.UNAVAILABLE, "draining")
            assert time.monotonic() - started < 0.9  # not held for drain_s (1 s)

    asyncio.run(scenario())
    assert sqlite_daemon.proc is not None and sqlite_daemon.proc.wait(30) == 0


@pytest.mark.slow
def test_client_with_an_open_stream_stops_cleanly(sqlite_daemon: Daemon) -> None:
    async def scenario() -> None:
        async with Client(sqlite_daemon.addr, A) as client:
            node = await client.create_node("c", quotas={"http": 5})
            await asyncio.gather(*(client.consume_at(node, "http") for _ in range(5)))
            with pytest.raises(Denied):
                await client.consume_at(node, "http")
        with pytest.raises(AuthError):
            async with Client(sqlite_daemon.addr, "no-such-key"):
                pass

    asyncio.run(scenario())


def test_a_stream_broken_by_the_transport_is_resent_not_raised() -> None:
    """A write into a dying connection ends the call INTERNAL ("Internal error from Core"),
    not UNAVAILABLE; without governord's detail that is a broken stream: resend."""
    from governor.client._mux import CallFailed, _Link

    class FakeCall:
        def __init__(self, code: grpc.StatusCode, trailing: tuple[Any, ...]) -> None:
            self.error = aio.AioRpcError(code, aio.Metadata(), aio.Metadata(*trailing), "boom")
            self.gate = asyncio.Event()

        async def write(self, data: bytes) -> None:
            self.gate.set()

        async def read(self) -> bytes:
            await self.gate.wait()
            raise self.error

        def done(self) -> bool:
            return self.gate.is_set()

        def cancel(self) -> bool:
            return True

    async def fail(code: grpc.StatusCode, *trailing: Any) -> CallFailed:
        link = _Link(FakeCall(code, trailing))
        with pytest.raises(CallFailed) as failed:
            await link.submit(1, "Consume", b"")
        assert link.broken and failed.value.stream
        await link.close()
        return failed.value

    async def scenario() -> None:
        for code in (C.INTERNAL, C.UNKNOWN, C.CANCELLED, C.UNAVAILABLE):
            assert (await fail(code)).code is C.UNAVAILABLE, code
        assert (await fail(C.UNIMPLEMENTED)).code is C.UNIMPLEMENTED  # an older governord
        detail = wire.pack({"reason": "malformed", "message": "v: bad", "field": "v"})
        refused = await fail(C.INVALID_ARGUMENT, (wire.ERROR_MD, detail))
        assert (refused.code, refused.detail["field"]) == (C.INVALID_ARGUMENT, "v")

    asyncio.run(scenario())


def test_sdk_falls_back_to_unary_calls_on_a_governord_without_multiplex() -> None:
    from governor.client._rpc import Dial, Rpc

    async def get_node(request: bytes, context: aio.ServicerContext[bytes, bytes]) -> bytes:
        return wire.pack({"node_id": 1, "asked": wire.unpack(request)})

    async def scenario() -> None:
        server = aio.server()
        rpcs = {"GetNode": grpc.unary_unary_rpc_method_handler(get_node)}
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(wire.SERVICE, rpcs),))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        rpc = Rpc(Dial(f"127.0.0.1:{port}", "key"))
        rpc.token = "token"
        try:
            reply = await rpc.call("GetNode", {"node_id": 1}, give_up_at=time.monotonic() + 10)
            assert reply == {"node_id": 1, "asked": {"v": 1, "node_id": 1}}
            assert rpc.multiplex is False
        finally:
            await rpc.close()
            await server.stop(None)

    asyncio.run(scenario())
