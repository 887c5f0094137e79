"""governord as the mesh's policy coordinator: the `ratemesh.coordinator.v1.Coordinator` service
the nodes speak (Put, Remove, List, Watch, History; shapes in ``ratemesh.coordinator``).

Every write is one engine step (``put_policy``/``remove_policy``: a ``PolicyPut`` or
``PolicyRemoved`` event) and replies only after the log has committed it; a read (List, Watch,
History) waits for the commit of everything it shows, so no node ever learns a generation
that a governord crash could take back and give to other values. A caller names itself with an
API key from ``coordinator.keys``: a ``worker`` key may List, Watch and read History; a
``coordinator`` key may also Put and Remove. ``docs/policies.md`` has the rules.

A watch's ``declared`` generations (those the node loads from its own file) are what that node
has, never a precondition on writers: a put is decided by governord's record alone, so a
``worker`` key cannot veto one. A put that gives a declared generation other values is said
out loud instead (governord's stderr and the reply's ``disagreements``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from grpc import aio

from governor import wire
from governor.authority import Authority
from governor.config import CoordinatorKey
from governor.engine import Engine, Event, PolicyPutResult
from governor.engine import _events as ev
from ratemesh import coordinator as cw
from ratemesh.checks import check_int, check_keys, check_str
from ratemesh.errors import MessageError, RatemeshError
from ratemesh.policy import TenantRatePolicy, descriptor_tenant, scope_name, split_tenant
from ratemesh.policyfile import POLICIES_PER_FILE_MAX

from ._commit import CommitWaits
from ._metrics import Metrics
from ._status import Fail, error_fail, sha256_hex

__all__ = ["CoordinatorService", "DECLARED_MAX", "PINS_MAX", "WARNED_MAX", "WATCHERS_MAX"]

WATCHERS_MAX = 4096  # open Watch streams; one per node is the expected load
WARNED_MAX = 1024  # distinct disagreement lines remembered, so each is said once
# Generations one watch may declare: a node declares what its policies file holds, so a whole
# file (POLICIES_PER_FILE_MAX) is the most a node sends; more is refused, naming the bound.
DECLARED_MAX = POLICIES_PER_FILE_MAX
# Declared generations kept across all open watches, to name disagreeing nodes when a put
# lands: only those above what governord holds for their key (the rest are checked against the
# record when the watch opens, and not kept). Past the bound a declaration is not kept: a put
# is then not reported against it, and nothing else changes.
PINS_MAX = 16_384
_WRITES = ("Put", "Remove")


class CoordinatorService:
    def __init__(
        self,
        authority: Authority,
        commits: CommitWaits,
        keys: tuple[CoordinatorKey, ...],
        metrics: Metrics,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.authority = authority
        self.commits = commits
        self.metrics = metrics
        self._keys = {k.key_sha256: k for k in keys}
        self._loop = loop
        self._changed = asyncio.Event()
        self._stopping = asyncio.Event()
        self.watchers = 0
        # What open watches declare they load from their own files, above what governord
        # holds: (tenant, metric, generation) -> watch id -> (member id, the policy's values).
        # Advisory only (a put that gives one other values is reported, never refused).
        # Bounded: PINS_MAX entries in all (``_pinned`` counts them).
        self._pins: dict[tuple[str, str, int], dict[int, tuple[str, tuple[object, ...]]]] = {}
        self._pinned = 0
        self._next_watch = 0
        self.warn: Callable[[str], None] = lambda line: None
        self._warned: dict[str, None] = {}  # lines said already, oldest first
        authority.event_listeners.append(self._on_event)

    # ---- plumbing --------------------------------------------------------------------------

    def _on_event(self, event: Event) -> None:
        """Under the lock: a policy changed, wake the watches (they wait for its commit)."""
        if isinstance(event, (ev.PolicyPut, ev.PolicyRemoved)):
            self._loop.call_soon_threadsafe(self._wake)

    def _wake(self) -> None:
        old, self._changed = self._changed, asyncio.Event()
        old.set()

    def stop(self) -> None:
        """Draining: open watches end (the nodes poll, then watch the next governord)."""
        self._stopping.set()
        self._wake()

    def handler(self) -> grpc.GenericRpcHandler:
        unary: dict[str, Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]] = {
            "Put": self._put,
            "Remove": self._remove,
            "List": self._list,
            "History": self._history,
        }
        rpcs: dict[str, grpc.RpcMethodHandler] = {
            name: grpc.unary_unary_rpc_method_handler(self._unary(name, fn))
            for name, fn in unary.items()
        }
        rpcs["Watch"] = grpc.unary_stream_rpc_method_handler(self._watch)
        return grpc.method_handlers_generic_handler(cw.COORDINATOR_SERVICE, rpcs)

    def _count(self, name: str, code: grpc.StatusCode) -> None:
        self.metrics.calls.labels(f"coordinator.{name}", code.name).inc()

    def _unary(
        self, name: str, fn: Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]
    ) -> Callable[[bytes, aio.ServicerContext[bytes, bytes]], Awaitable[bytes]]:
        async def call(request: bytes, context: aio.ServicerContext[bytes, bytes]) -> bytes:
            code = grpc.StatusCode.OK
            try:
                self._authorize(name, context)
                reply = await fn(_body(name.lower(), request))
            except Fail as f:
                code = f.code
                await context.abort(
                    f.code, f.detail["message"], ((wire.ERROR_MD, wire.pack(f.detail)),)
                )
                raise  # unreachable: abort raises
            finally:
                self._count(name, code)
            return cw.pack(reply)

        return call

    def _authorize(self, method: str, context: aio.ServicerContext[bytes, bytes]) -> None:
        md = dict(context.invocation_metadata() or ())
        key = md.get(cw.API_KEY_MD)
        if key is None:
            raise Fail(
                grpc.StatusCode.UNAUTHENTICATED,
                "no_credentials",
                f"coordinator {method} needs an API key ({cw.API_KEY_MD} metadata)",
            )
        if not isinstance(key, str):
            raise Fail(grpc.StatusCode.UNAUTHENTICATED, "credentials", "the key must be text")
        found = self._keys.get(sha256_hex(key))
        if found is None:
            raise Fail(grpc.StatusCode.UNAUTHENTICATED, "bad_key", "unknown coordinator API key")
        if method in _WRITES and found.scope != "coordinator":
            raise Fail(
                grpc.StatusCode.PERMISSION_DENIED,
                "scope",
                f"the key {found.name!r} has scope {found.scope}: it may List, Watch and read "
                f"History; {method} needs a key of scope coordinator",
            )

    async def _step(self, fn: Callable[[Engine], Any]) -> Any:
        result, error, seq, wrote = self.authority.step(fn)
        await self.commits.reply_ready(seq, wrote)
        if error is not None:
            raise error_fail(error)
        return result

    async def _committed_read(self, fn: Callable[[Engine], Any]) -> Any:
        """A read of what is committed: taken under the lock, returned once the log holds
        everything up to that moment (memory may run ahead of the record; a reply never)."""
        result, seq = self.authority.read(lambda e: (fn(e), e.last_seq))
        await self.commits.wait(seq)
        await self.commits.confirm()
        return result

    # ---- the calls -------------------------------------------------------------------------

    async def _put(self, b: dict[str, Any]) -> dict[str, Any]:
        _known("put", b, ("policy", "expect_generation"))
        raw = b.get("policy")
        if not isinstance(raw, dict):
            raise _malformed("policy", "must be a mapping")
        explicit = "generation" in raw
        policy = _decode(
            lambda: TenantRatePolicy.from_dict(
                raw if explicit else {**raw, "generation": 1}, where="policy", error=MessageError
            )
        )
        expect = _expect(b)

        def put(e: Engine) -> tuple[PolicyPutResult, int]:
            out = e.put_policy(policy, allocate=not explicit, expect_generation=expect)
            return out, e.state.policies.revision

        result, revision = await self._step(put)
        reply: dict[str, Any] = {
            "policy": result.policy.to_dict(),
            "revision": revision,
            "created": result.created,
        }
        lines = self._pinned_disagreements(result.policy) if result.created else []
        if lines:
            reply["disagreements"] = lines
        return reply

    def _pinned_disagreements(self, policy: TenantRatePolicy) -> list[str]:
        """The watching nodes that load ``policy``'s generation from their own files with
        other values: they will refuse it. Said on stderr once per line, and returned."""
        scope = (policy.tenant_id, policy.metric, policy.generation)
        out = []
        pins = self._pins.get(scope, {}).values()
        for member, values in sorted(pins, key=lambda pin: pin[0]):  # values need not order
            if values == policy.values():
                continue
            line = (
                f"node {member or '(unnamed)'} loads {scope_name(policy.tenant_id, policy.metric)} "
                f"generation {policy.generation} from its own file with other values and refuses "
                "governord's; let governord import that file (coordinator.policies_file), or "
                "push the change again as a later generation"
            )
            if line not in out:
                out.append(line)
                self._say(line)
        return out

    def _say(self, line: str) -> None:
        if line not in self._warned:  # a node that reconnects says it once
            self._warned[line] = None
            while len(self._warned) > WARNED_MAX:
                del self._warned[next(iter(self._warned))]
            self.warn(line)

    def _pin(
        self, member: str, above: list[TenantRatePolicy]
    ) -> tuple[int, list[tuple[str, str, int]]]:
        """Keep the declared generations above governord's record (``_above``: a put may
        still land on one of those), as far as PINS_MAX allows; returns the watch's id and
        what it pinned (to unpin when it ends)."""
        self._next_watch += 1
        wid = self._next_watch
        pinned = []
        for p in above:
            if self._pinned >= PINS_MAX:
                self._say(
                    f"governord keeps {PINS_MAX} declared generations (PINS_MAX); puts are "
                    "not checked against the rest of the watches' declarations"
                )
                break
            scope = (p.tenant_id, p.metric, p.generation)
            held = self._pins.setdefault(scope, {})
            if wid not in held:
                self._pinned += 1
                pinned.append(scope)
            held[wid] = (member, p.values())
        return wid, pinned

    def _open_watch(
        self, member: str, declared: tuple[TenantRatePolicy, ...]
    ) -> tuple[int, list[tuple[str, str, int]]]:
        """Check what a watch declares against the record (disagreements said on stderr)
        and pin what lies above it; returns the watch's id and its pins."""
        above, lines = self.authority.read(
            lambda e: (self._above(e, declared), self._disagreements(e, member, declared))
        )
        for line in lines:
            self._say(line)
        return self._pin(member, above)

    def _unpin(self, wid: int, pinned: list[tuple[str, str, int]]) -> None:
        for scope in pinned:
            held = self._pins.get(scope)
            if held is not None and held.pop(wid, None) is not None:
                self._pinned -= 1
                if not held:
                    del self._pins[scope]

    @staticmethod
    def _above(e: Engine, declared: tuple[TenantRatePolicy, ...]) -> list[TenantRatePolicy]:
        """Under the lock: the declared generations above the record's last of their key."""
        out = []
        for p in declared:
            key = e.state.policies.keys.get((p.tenant_id, p.metric))
            if key is None or p.generation > key.last.generation:
                out.append(p)
        return out

    def _disagreements(
        self, e: Engine, member: str, declared: tuple[TenantRatePolicy, ...]
    ) -> list[str]:
        """Under the lock: the declared generations governord holds with other values."""
        out = []
        for p in declared:
            key = e.state.policies.keys.get((p.tenant_id, p.metric))
            record = None if key is None else key.find(p.generation)
            if record is not None and record.policy != p:
                out.append(
                    f"node {member or '(unnamed)'} loads {scope_name(p.tenant_id, p.metric)} "
                    f"generation {p.generation} from its file with other values than "
                    "governord's; it refuses governord's"
                )
        return out

    async def _remove(self, b: dict[str, Any]) -> dict[str, Any]:
        _known("remove", b, ("tenant_id", "metric", "expect_generation", "descriptor"))
        tenant_id, metric = _scope(b)
        expect = _expect(b)

        def remove(e: Engine) -> tuple[int, int]:
            gen = e.remove_policy(tenant_id, metric, expect_generation=expect)
            return gen, e.state.policies.revision

        generation, revision = await self._step(remove)
        return {
            "removed": cw.Tombstone(tenant_id, metric, generation).to_wire(),
            "revision": revision,
        }

    async def _list(self, b: dict[str, Any]) -> dict[str, Any]:
        _known("list", b, ())
        snap: cw.PolicySnapshot = await self._committed_read(_snapshot)
        return snap.to_wire()

    async def _history(self, b: dict[str, Any]) -> dict[str, Any]:
        _known("history", b, ("tenant_id", "metric"))
        tenant_id = _decode(lambda: check_str("tenant_id", b.get("tenant_id"), error=MessageError))
        metric = b.get("metric")
        only = None if metric is None else _decode(lambda: cw.decode_metric("metric", metric))

        def history(e: Engine) -> list[dict[str, Any]]:
            out = []
            for (t, m), key in sorted(e.state.policies.keys.items()):
                if split_tenant(t)[0] != tenant_id or (only is not None and m != only):
                    continue
                for r in key.history:
                    entry = cw.HistoryEntry(t, m, r.generation, r.at_ms, r.policy)
                    out.append(entry.to_wire())
            return out

        return {"history": await self._committed_read(history)}

    async def _watch(
        self, request: bytes, context: aio.ServicerContext[bytes, bytes]
    ) -> AsyncIterator[bytes]:
        code = grpc.StatusCode.OK
        try:
            self._authorize("Watch", context)
            if self.watchers >= WATCHERS_MAX:
                raise Fail(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    "busy",
                    f"governord serves {WATCHERS_MAX} watches (WATCHERS_MAX); poll List",
                )
            after, member, declared = _watch_request(request)
            del request  # a long-lived stream keeps only what it pinned, not what it was sent
            self.watchers += 1
            wid, pinned = self._open_watch(member, declared)
            del declared
            try:
                async for snap in self._snapshots(after):
                    yield cw.pack(snap.to_wire())
            finally:
                self._unpin(wid, pinned)
                self.watchers -= 1
        except Fail as f:
            code = f.code
            await context.abort(
                f.code, f.detail["message"], ((wire.ERROR_MD, wire.pack(f.detail)),)
            )
        finally:
            self._count("Watch", code)

    async def _snapshots(self, after: int) -> AsyncIterator[cw.PolicySnapshot]:
        """The current snapshot at once (the watcher knows its stream is open, and catches up
        whatever its revision), then one whenever the revision moves past the last sent."""
        first = True
        while not self._stopping.is_set():
            changed = self._changed
            snap: cw.PolicySnapshot = await self._committed_read(_snapshot)
            if first or snap.revision != after:
                first = False
                after = snap.revision
                yield snap
                continue
            waits = (
                asyncio.ensure_future(changed.wait()),
                asyncio.ensure_future(self._stopping.wait()),
            )
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits:
                    w.cancel()


def _snapshot(e: Engine) -> cw.PolicySnapshot:
    book = e.state.policies
    removed = tuple(cw.Tombstone(t, m, g) for t, m, g in book.tombstones())
    return cw.PolicySnapshot(book.revision, tuple(book.current()), removed)


def _malformed(field: str, message: str) -> Fail:
    return Fail(grpc.StatusCode.INVALID_ARGUMENT, "malformed", f"{field}: {message}", field=field)


def _decode(fn: Callable[[], Any]) -> Any:
    """Run a check of a caller's value; its complaint becomes INVALID_ARGUMENT naming the field."""
    try:
        return fn()
    except RatemeshError as exc:
        raise _malformed(exc.field, exc.problem) from exc


def _body(what: str, raw: bytes) -> dict[str, Any]:
    obj = _decode(lambda: cw.unpack(raw, what))
    if not isinstance(obj, dict):
        raise _malformed(what, "the request must be a mapping")
    return obj


def _known(what: str, body: dict[str, Any], allowed: tuple[str, ...]) -> None:
    _decode(lambda: check_keys(what, body, allowed, error=MessageError))


def _expect(b: dict[str, Any]) -> int | None:
    value = b.get("expect_generation")
    if value is None:
        return None
    return int(_decode(lambda: check_int("expect_generation", value, error=MessageError)))


def _watch_request(raw: bytes) -> tuple[int, str, tuple[TenantRatePolicy, ...]]:
    """A Watch request checked: (after_revision, member_id, declared generations)."""
    b = _body("watch", raw)
    _known("watch", b, ("after_revision", "declared", "member_id"))
    after = _decode(
        lambda: check_int("after_revision", b.get("after_revision", 0), error=MessageError)
    )
    member = b.get("member_id", "")
    if member:
        member = _decode(lambda: check_str("member_id", member, error=MessageError))
    return int(after), str(member), _declared(b.get("declared", []))


def _declared(raw: Any) -> tuple[TenantRatePolicy, ...]:
    if not isinstance(raw, list):
        raise _malformed("declared", "must be a list of policies")
    if len(raw) > DECLARED_MAX:
        raise _malformed(
            "declared",
            f"{len(raw)} policies; a watch declares at most {DECLARED_MAX} (DECLARED_MAX, "
            "a whole policies file)",
        )
    out = []
    for i, p in enumerate(raw):
        try:
            out.append(TenantRatePolicy.from_dict(p, where=f"declared[{i}]", error=MessageError))
        except RatemeshError as exc:
            raise _malformed(exc.field, exc.problem) from exc
    return tuple(out)


def _scope(b: dict[str, Any]) -> tuple[str, str]:
    """(tenant part, metric) a call names; an optional `descriptor` ({key: value}) is folded
    into the tenant part as a policy's is (ratemesh.policy.descriptor_tenant)."""
    tenant_id = _decode(lambda: check_str("tenant_id", b.get("tenant_id"), error=MessageError))
    metric = _decode(lambda: cw.decode_metric("metric", b.get("metric")))
    if b.get("descriptor") is not None:
        tenant_id = _decode(lambda: descriptor_tenant(tenant_id, b["descriptor"]))
    return str(tenant_id), metric
