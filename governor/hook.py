"""`governord hook`: a PreToolUse hook for agent CLIs (Claude Code, Codex), seed 000.

Each tool call the agent is about to make is one `tool_calls` unit charged to its run's node
in governord: the run is the node `<source>:<session_id>` under the key's tenant (created on
first use with the run's caps and time budget), and a subagent's calls go to a child node
`agent:<agent_id>` under it, whose creation charges one `subagents` unit. The hook keeps no
state between calls: it finds or creates the nodes by name every time. The charge's request
id is derived from the call (session, tool_use_id; or the whole payload when there is no
tool_use_id), so a retried hook never charges twice. A session or agent id goes into the
node name as it is when it is short and plain, else cleaned with a hash suffix, so two ids
never share a node. Only a PreToolUse payload is charged: any other event (PostToolUse comes
after the fact) is refused, nothing charged.

Exit status, as agent CLIs read it: 0 lets the tool run; 2 blocks it and the one line on
stderr is shown to the model. A spent budget blocks (naming it); so does a governord that
does not answer: the hook fails closed, and says so, because an agent that cannot be counted
cannot be capped.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sys
import time
from dataclasses import dataclass
from typing import IO, Any

from governor.client._errors import (
    AuthError,
    Denied,
    GovernorClientError,
    NodeEnded,
    Unavailable,
)
from governor.client._rpc import Dial, Rpc

__all__ = ["HookLimits", "run_hook", "request_id_for", "EXIT_ALLOW", "EXIT_BLOCK"]

EXIT_ALLOW = 0
EXIT_BLOCK = 2  # agent CLIs block the tool and show stderr to the model
PAYLOAD_BYTES_MAX = 4 << 20  # a tool_input with a whole file in it is fine; more is not a hook
ID_CHARS_MAX = 64  # of a session or agent id, as it goes into a node name
_ID_CHARS = "-_."  # kept as they are, besides letters and digits
HOOK_EVENT = "PreToolUse"  # the one event the hook charges; any other is refused


@dataclass(frozen=True)
class HookLimits:
    tool_calls: int = 500
    subagents: int = 20
    minutes: float | None = None  # the run's time budget from its first call; None: none
    source: str = "claude"
    timeout_s: float = 5.0  # past this, governord "does not answer": fail closed


def request_id_for(payload: dict[str, Any], what: str) -> str:
    """The charge's request id: the same call, retried, gets the same id."""
    session = str(payload.get("session_id", ""))
    use = payload.get("tool_use_id")
    if use:
        basis = f"{session}\x1f{use}"
    else:
        basis = json.dumps(payload, sort_keys=True, default=str)
    return f"hook-{what}-" + hashlib.sha256(basis.encode()).hexdigest()[:32]


def _ident(value: Any, field: str) -> str:
    """An id as it goes into a node name, one name per id: an id of at most ID_CHARS_MAX
    characters from ``[A-Za-z0-9._-]`` (letters of any script too) stays as it is; any other
    is cleaned, cut and suffixed with ``~`` and 16 hex digits of its SHA-256, and ``~`` is
    never in an id kept as it is. So ``run a`` and ``run_a`` are two runs, not one."""
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"the hook payload has no {field}")
    if len(value) <= ID_CHARS_MAX and all(c.isalnum() or c in _ID_CHARS for c in value):
        return value
    safe = "".join(c if c.isalnum() or c in _ID_CHARS else "_" for c in value)
    digest = hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return f"{safe[: ID_CHARS_MAX - 17]}~{digest}"


def read_payload(stream: IO[str]) -> dict[str, Any]:
    text = stream.read(PAYLOAD_BYTES_MAX + 1)
    if len(text) > PAYLOAD_BYTES_MAX:
        raise ValueError(f"the hook payload is larger than {PAYLOAD_BYTES_MAX} bytes")
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"the hook payload is not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ValueError("the hook payload is not a JSON object")
    return data


def _check_event(payload: dict[str, Any]) -> None:
    """Only a PreToolUse payload is charged and allowed. PostToolUse (and any other event)
    comes after the fact: charging it would count a call twice, and its "allow" means
    nothing. A payload that names no event is read as PreToolUse (agent CLIs that send
    only the call)."""
    event = payload.get("hook_event_name", HOOK_EVENT)
    if event != HOOK_EVENT:
        raise ValueError(
            f"governord hook handles {HOOK_EVENT} only and this payload is {str(event)[:64]!r}: "
            f"nothing was charged; register the hook under {HOOK_EVENT}"
        )


async def _charge(payload: dict[str, Any], limits: HookLimits, dial: Dial) -> str | None:
    """Charge the call; None when it may run, else the one-line reason it may not."""
    run = f"{limits.source}:{_ident(payload.get('session_id'), 'session_id')}"
    agent = payload.get("agent_id")
    rpc = Rpc(dial, multiplex=False)
    give_up = time.monotonic() + limits.timeout_s
    try:

        async def call(method: str, body: dict[str, Any]) -> dict[str, Any]:
            return await rpc.call(
                method,
                body,
                auth="key",
                give_up_at=give_up,
                timeout_s=max(0.1, give_up - time.monotonic()),
            )

        body: dict[str, Any] = {
            "name": run,
            "quotas": {"tool_calls": limits.tool_calls, "subagents": limits.subagents},
            "request_id": f"hook-run-{hashlib.sha256(run.encode()).hexdigest()[:32]}",
        }
        if limits.minutes is not None:
            # An instant (epoch ms, as the API reads every deadline), from this call: the
            # first call makes the run's node, so its deadline counts from the run's start
            # (later calls find the node and leave its deadline as it is).
            body["deadline_ms"] = int(time.time() * 1000) + int(limits.minutes * 60_000)
        try:
            node = int((await call("EnsureNode", body))["node_id"])
        except GovernorClientError as exc:
            if exc.code != "ALREADY_EXISTS":
                raise
            # The run's node was made (this request id) and is active no more: its deadline
            # passed. A node made afresh would start the budget over.
            raise NodeEnded(str(exc), exc.code, exc.detail) from exc
        if agent:
            name = f"agent:{_ident(agent, 'agent_id')}"
            child = await call(
                "EnsureNode",
                {
                    "parent_id": node,
                    "name": name,
                    "request_id": request_id_for({"session_id": run, "tool_use_id": name}, "agent"),
                },
            )
            if child.get("created"):
                await call(
                    "Consume",
                    {
                        "node_id": node,
                        "resource": "subagents",
                        "amount": 1,
                        "request_id": request_id_for(
                            {"session_id": run, "tool_use_id": name}, "subagent"
                        ),
                    },
                )
            node = int(child["node_id"])
        await call(
            "Consume",
            {
                "node_id": node,
                "resource": "tool_calls",
                "amount": 1,
                "request_id": request_id_for(payload, "call"),
            },
        )
        return None
    except NodeEnded:
        return (
            f'Governor blocked this tool: the time budget of "{run}" is spent '
            "(the run has ended). Do not retry; stop and tell the user the budget is exhausted."
        )
    except Denied as exc:
        d = exc.detail.get("denial") or {}
        return (
            f"Governor blocked this tool: the {d.get('resource') or 'tool_calls'} budget of "
            f'"{run}" is spent ({d.get("used")} of {d.get("limit")} used). Do not retry; stop '
            "and tell the user the budget is exhausted."
        )
    except (Unavailable, OSError) as exc:
        return (
            f"Governor blocked this tool: governord at {dial.addr} did not answer within "
            f"{limits.timeout_s:g}s ({type(exc).__name__}), and the hook fails closed."
        )
    except AuthError:
        return f"Governor blocked this tool: governord at {dial.addr} refused the API key."
    except GovernorClientError as exc:
        return f"Governor blocked this tool: governord refused the charge ({exc})."
    finally:
        await rpc.close()


def run_hook(
    limits: HookLimits,
    *,
    stdin: IO[str] | None = None,
    addr: str | None = None,
    api_key: str | None = None,
) -> int:
    """Read one PreToolUse payload, charge it, and return the exit status (the reason, if
    any, is printed on stderr as one line)."""
    try:
        payload = read_payload(stdin or sys.stdin)
        _check_event(payload)
        dial = Dial.from_env(addr, api_key)
        reason = asyncio.run(_charge(payload, limits, dial))
    except (ValueError, AuthError) as exc:
        reason = f"Governor blocked this tool: {' '.join(str(exc).split())} (hook fails closed)."
    if reason is None:
        return EXIT_ALLOW
    print(reason, file=sys.stderr, flush=True)
    return EXIT_BLOCK
