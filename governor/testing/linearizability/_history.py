"""The history format: operations with a client, a call, an interval and an outcome.

An operation is invoked at ``invoke_ns`` and completed at ``complete_ns`` (monotonic ns of
the recording clock). Its outcome is one of:

* ``ok`` with a ``result`` (the reply's fields the model reads);
* ``fail`` with an ``error`` (a definite failure: denied, refused; it did not take effect);
* ``unknown`` (timeout, connection lost, leader changed mid-call): it may or may not have
  taken effect, at any time after ``invoke_ns``; ``complete_ns`` is when the client gave up.

The tree the calls act on (parents, caps, limits, bursts) is part of the history: the model
needs it and a history is meant to be checked long after the daemon is gone.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

__all__ = [
    "CALLS",
    "FORMAT",
    "HISTORY_OPS_MAX",
    "History",
    "HistoryError",
    "HistoryFull",
    "Op",
    "Outcome",
    "Tree",
    "TreeNode",
]

FORMAT = "ratemesh-linearizability/1"
HISTORY_OPS_MAX = 200_000  # operations one history holds (a recorder refuses more)

Outcome = Literal["ok", "fail", "unknown"]
OUTCOMES: tuple[Outcome, ...] = ("ok", "fail", "unknown")

# call -> (argument fields, result fields of an ``ok``), each field an int or str
CALLS: dict[str, tuple[dict[str, type], dict[str, type]]] = {
    "acquire": ({"node_id": int, "cls": str}, {"lease_id": int}),
    "release": ({"lease_id": int}, {"released": bool}),
    "consume": ({"node_id": int, "resource": str, "amount": int}, {}),
    "reserve_credit": (
        {"node_id": int, "resource": str, "units": int},
        {"block_id": int, "units": int, "ttl_ms": int},
    ),
    "return_credit": ({"block_id": int, "unused": int}, {"returned": bool}),
    "validate": ({"lease_id": int}, {"live": bool}),
}


class HistoryError(ValueError):
    """A history that cannot be read as it is; ``field`` names the part at fault."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class HistoryFull(RuntimeError):
    """The history holds ``max_ops`` operations; the call was not made (nothing unrecorded
    ever reaches governord, so the history stays checkable)."""


@dataclass(frozen=True, slots=True)
class TreeNode:
    """One node as the model needs it. ``bursts`` are the rated resources' bursts B;
    ``used``/``held`` are the counters when recording began (whole subtree, as GetNode)."""

    id: int
    parent: int | None
    quotas: Mapping[str, int] = field(default_factory=dict)
    limits: Mapping[str, int] = field(default_factory=dict)
    bursts: Mapping[str, int] = field(default_factory=dict)
    used: Mapping[str, int] = field(default_factory=dict)
    held: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Tree:
    nodes: Mapping[int, TreeNode]

    def chain(self, node_id: int) -> list[TreeNode]:
        """The node and its ancestors, leaf first; an unknown node is a chain of nothing
        (the model then knows no cap or limit for it)."""
        out: list[TreeNode] = []
        cur: int | None = node_id
        while cur is not None and cur in self.nodes and len(out) <= len(self.nodes):
            node = self.nodes[cur]
            out.append(node)
            cur = node.parent
        return out

    def to_json(self) -> list[dict[str, Any]]:
        return [
            {
                "id": n.id,
                "parent": n.parent,
                **{k: dict(getattr(n, k)) for k in ("quotas", "limits", "bursts", "used", "held")},
            }
            for _, n in sorted(self.nodes.items())
        ]

    @classmethod
    def from_json(cls, raw: object, where: str = "tree") -> Tree:
        if not isinstance(raw, list):
            raise HistoryError(where, "must be a list of nodes")
        nodes: dict[int, TreeNode] = {}
        for i, item in enumerate(raw):
            at = f"{where}[{i}]"
            if not isinstance(item, dict):
                raise HistoryError(at, "must be a map")
            unknown = set(item) - {"id", "parent", "quotas", "limits", "bursts", "used", "held"}
            if unknown:
                raise HistoryError(f"{at}.{sorted(unknown)[0]}", "unknown key")
            nid = _int(f"{at}.id", item.get("id"))
            parent = item.get("parent")
            if parent is not None:
                parent = _int(f"{at}.parent", parent)
            caps = {k: _caps(f"{at}.{k}", item.get(k, {})) for k in ("quotas", "limits")}
            more = {k: _caps(f"{at}.{k}", item.get(k, {})) for k in ("bursts", "used", "held")}
            if nid in nodes:
                raise HistoryError(f"{at}.id", f"node {nid} appears twice")
            nodes[nid] = TreeNode(nid, parent, caps["quotas"], caps["limits"], **more)
        for n in nodes.values():
            if n.parent is not None and n.parent not in nodes:
                raise HistoryError(where, f"node {n.id}'s parent {n.parent} is not in the tree")
        return cls(nodes)


@dataclass(frozen=True, slots=True)
class Op:
    """One operation. ``id`` is its index in the history (stable across save and load)."""

    id: int
    client: str
    call: str
    args: Mapping[str, Any]
    invoke_ns: int
    complete_ns: int | None
    outcome: Outcome
    result: Mapping[str, Any] = field(default_factory=dict)
    error: str = ""

    def arg(self, name: str) -> Any:
        return self.args[name]

    def describe(self) -> str:
        """One line a person reads: ``#12 c3 acquire(node_id=4, cls=db) -> ok lease_id=9``."""
        args = ", ".join(f"{k}={v}" for k, v in self.args.items())
        if self.outcome == "ok":
            res = " ".join(f"{k}={v}" for k, v in self.result.items()) or "ok"
            tail = f"ok {res}" if self.result else "ok"
        elif self.outcome == "fail":
            tail = f"fail {self.error}"
        else:
            tail = "unknown"
        end = "?" if self.complete_ns is None else str(self.complete_ns)
        return f"#{self.id} {self.client} {self.call}({args}) -> {tail}  [{self.invoke_ns}, {end}]"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "client": self.client,
            "call": self.call,
            "args": dict(self.args),
            "invoke_ns": self.invoke_ns,
            "complete_ns": self.complete_ns,
            "outcome": self.outcome,
        }
        if self.outcome == "ok":
            out["result"] = dict(self.result)
        if self.outcome == "fail":
            out["error"] = self.error
        return out


def _int(where: str, value: object) -> int:
    if type(value) is not int:
        raise HistoryError(where, f"must be an int, got {type(value).__name__}")
    return value


def _caps(where: str, value: object) -> dict[str, int]:
    if not isinstance(value, dict):
        raise HistoryError(where, "must be a map of name to int")
    out: dict[str, int] = {}
    for k, v in value.items():
        if not isinstance(k, str) or not k:
            raise HistoryError(where, f"{k!r} is not a name")
        out[k] = _int(f"{where}.{k}", v)
        if out[k] < 0:
            raise HistoryError(f"{where}.{k}", "must be >= 0")
    return out


def _fields(where: str, raw: object, spec: dict[str, type], *, partial: bool) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise HistoryError(where, "must be a map")
    out: dict[str, Any] = {}
    for name in raw:
        if name not in spec:
            raise HistoryError(f"{where}.{name}", "unknown key")
    for name, kind in spec.items():
        if name not in raw:
            if partial:
                continue
            raise HistoryError(f"{where}.{name}", "missing")
        value = raw[name]
        if type(value) is not kind:
            raise HistoryError(f"{where}.{name}", f"must be {kind.__name__}")
        out[name] = value
    return out


def parse_op(i: int, raw: object) -> Op:
    """One operation from its JSON map, checked field by field."""
    at = f"ops[{i}]"
    if not isinstance(raw, dict):
        raise HistoryError(at, "must be a map")
    known = {"client", "call", "args", "invoke_ns", "complete_ns", "outcome", "result", "error"}
    for key in raw:
        if key not in known:
            raise HistoryError(f"{at}.{key}", "unknown key")
    call = raw.get("call")
    if call not in CALLS:
        raise HistoryError(f"{at}.call", f"must be one of {sorted(CALLS)}, got {call!r}")
    arg_spec, result_spec = CALLS[call]
    client = raw.get("client")
    if not isinstance(client, str) or not client:
        raise HistoryError(f"{at}.client", "must be a non-empty string")
    outcome = raw.get("outcome")
    if outcome not in OUTCOMES:
        raise HistoryError(f"{at}.outcome", f"must be one of {list(OUTCOMES)}")
    invoke = _int(f"{at}.invoke_ns", raw.get("invoke_ns"))
    complete = raw.get("complete_ns")
    if complete is not None:
        complete = _int(f"{at}.complete_ns", complete)
        if complete < invoke:
            raise HistoryError(f"{at}.complete_ns", "is before invoke_ns")
    elif outcome != "unknown":
        raise HistoryError(f"{at}.complete_ns", "only an unknown outcome may lack it")
    args = _fields(f"{at}.args", raw.get("args"), arg_spec, partial=False)
    result: dict[str, Any] = {}
    error = ""
    if outcome == "ok":
        result = _fields(f"{at}.result", raw.get("result", {}), result_spec, partial=False)
    elif "result" in raw:
        raise HistoryError(f"{at}.result", f"only an ok outcome has one, this is {outcome}")
    if outcome == "fail":
        error = raw.get("error", "")
        if not isinstance(error, str) or not error:
            raise HistoryError(f"{at}.error", "a fail outcome names its error")
    elif "error" in raw:
        raise HistoryError(f"{at}.error", f"only a fail outcome has one, this is {outcome}")
    return Op(i, client, call, args, invoke, complete, outcome, result, error)


class History:
    """Operations as they are recorded: ``invoke`` then ``complete`` (or ``unknown``).

    Thread and task safe (one lock); bounded by ``max_ops``. ``model`` holds the model's
    options (``lease_expiry``: leases may end by session expiry, see ``_model``)."""

    def __init__(
        self,
        tree: Tree,
        *,
        max_ops: int = HISTORY_OPS_MAX,
        lease_expiry: bool = False,
        meta: Mapping[str, Any] | None = None,
    ) -> None:
        self.tree = tree
        self.max_ops = max_ops
        self.lease_expiry = lease_expiry
        self.meta: dict[str, Any] = dict(meta or {})
        self._lock = threading.Lock()
        self._ops: list[Op] = []

    # ---- recording ---------------------------------------------------------------------

    def invoke(self, client: str, call: str, args: Mapping[str, Any], now_ns: int) -> int:
        """Start an operation (outcome ``unknown`` until completed); returns its id."""
        if call not in CALLS:
            raise HistoryError("call", f"must be one of {sorted(CALLS)}, got {call!r}")
        with self._lock:
            if len(self._ops) >= self.max_ops:
                raise HistoryFull(f"the history holds its max_ops={self.max_ops} operations")
            op = Op(len(self._ops), client, call, dict(args), now_ns, None, "unknown")
            self._ops.append(op)
            return op.id

    def complete(
        self,
        op_id: int,
        outcome: Outcome,
        now_ns: int,
        *,
        result: Mapping[str, Any] | None = None,
        error: str = "",
    ) -> None:
        with self._lock:
            op = self._ops[op_id]
            if op.complete_ns is not None:
                raise HistoryError(f"ops[{op_id}]", "is already complete")
            self._ops[op_id] = Op(
                op.id,
                op.client,
                op.call,
                op.args,
                op.invoke_ns,
                max(now_ns, op.invoke_ns),
                outcome,
                dict(result or {}) if outcome == "ok" else {},
                error if outcome == "fail" else "",
            )

    def add(self, op: Op) -> None:
        """Append a finished operation (hand-written histories and the engine driver)."""
        with self._lock:
            if len(self._ops) >= self.max_ops:
                raise HistoryFull(f"the history holds its max_ops={self.max_ops} operations")
            self._ops.append(parse_op(len(self._ops), op.to_json()))

    @property
    def ops(self) -> list[Op]:
        with self._lock:
            return list(self._ops)

    def __len__(self) -> int:
        with self._lock:
            return len(self._ops)

    # ---- JSON ----------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "model": {"lease_expiry": self.lease_expiry},
            "meta": self.meta,
            "tree": self.tree.to_json(),
            "ops": [op.to_json() for op in self.ops],
        }

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=1, sort_keys=True) + "\n")

    @classmethod
    def from_json(cls, raw: object, *, max_ops: int = HISTORY_OPS_MAX) -> History:
        if not isinstance(raw, dict):
            raise HistoryError("history", "must be a map")
        for key in raw:
            if key not in ("format", "model", "meta", "tree", "ops"):
                raise HistoryError(key, "unknown key")
        if raw.get("format") != FORMAT:
            raise HistoryError("format", f"must be {FORMAT!r}, got {raw.get('format')!r}")
        model = raw.get("model", {})
        if not isinstance(model, dict) or set(model) - {"lease_expiry"}:
            raise HistoryError("model", "must be a map with at most lease_expiry")
        expiry = model.get("lease_expiry", False)
        if type(expiry) is not bool:
            raise HistoryError("model.lease_expiry", "must be a bool")
        meta = raw.get("meta", {})
        if not isinstance(meta, dict):
            raise HistoryError("meta", "must be a map")
        ops = raw.get("ops")
        if not isinstance(ops, list):
            raise HistoryError("ops", "must be a list")
        if len(ops) > max_ops:
            raise HistoryError("ops", f"holds {len(ops)} operations, more than {max_ops}")
        history = cls(Tree.from_json(raw.get("tree")), max_ops=max_ops, lease_expiry=expiry)
        history.meta = dict(meta)
        history._ops = [parse_op(i, op) for i, op in enumerate(ops)]
        return history

    @classmethod
    def load(cls, path: str | Path, *, max_ops: int = HISTORY_OPS_MAX) -> History:
        try:
            raw = json.loads(Path(path).read_text())
        except (OSError, UnicodeDecodeError) as exc:
            raise HistoryError(str(path), f"cannot be read: {exc}") from exc
        except json.JSONDecodeError as exc:
            raise HistoryError(str(path), f"is not JSON: {exc}") from exc
        return cls.from_json(raw, max_ops=max_ops)
