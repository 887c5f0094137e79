"""`governord ui`: a terminal screen over the caller's subtree (seed 000), with textual.

It shows every node under the API key's scope, live (refreshed every second): used/cap per
quota, leases held/limit per class, acquires waiting in the fair queue and credit blocks
outstanding. `e` edits the selected node's cap (`http=500` sets a quota, `limit db=4` a
concurrency limit, `=none` removes it); `c` cancels the selected task; `q` quits. Every
change is an ordinary SDK call under the caller's key, so governord's scope rules apply: a
tenant's key sees and edits only its own subtree.
"""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.css.query import NoMatches
from textual.widgets import Footer, Header, Input, Static, Tree
from textual.widgets.tree import TreeNode

from governor.client import Client, GovernorClientError

__all__ = ["GovernorUI", "NODES_SHOWN_MAX", "describe", "parse_edit"]

NODES_SHOWN_MAX = 500  # nodes fetched per refresh: a screen, not a dump
REFRESH_S = 1.0


def describe(info: dict[str, Any]) -> str:
    """One node's line: name, state, used/cap, held/limit, waiting, credit out."""
    parts = [f"{info['name']} [{info['state']}]"]
    quotas, used = info.get("quotas") or {}, info.get("used") or {}
    for r in sorted(set(quotas) | set(used)):
        cap = quotas.get(r)
        parts.append(f"{r} {used.get(r, 0)}/{'-' if cap is None else cap}")
    limits, held = info.get("limits") or {}, info.get("held") or {}
    for c in sorted(set(limits) | set(held)):
        lim = limits.get(c)
        parts.append(f"{c} held {held.get(c, 0)}/{'-' if lim is None else lim}")
    for c, n in sorted((info.get("waiting") or {}).items()):
        parts.append(f"{c} waiting {n}")
    for r, n in sorted((info.get("credit_outstanding") or {}).items()):
        parts.append(f"{r} credit out {n}")
    return "  ".join(parts)


def parse_edit(text: str) -> tuple[str, str, int | None]:
    """`http=500` -> ("quota", "http", 500); `limit db=4` -> ("limit", "db", 4); a value
    of `none` removes the cap. ValueError names what is wrong."""
    kind = "quota"
    body = text.strip()
    if body.startswith("limit "):
        kind, body = "limit", body[len("limit ") :].strip()
    name, eq, value = body.partition("=")
    name, value = name.strip(), value.strip()
    if not eq or not name:
        raise ValueError("write resource=N (a quota) or limit class=N (a concurrency limit)")
    if value.lower() == "none":
        return kind, name, None
    if not value.isdigit():
        raise ValueError(f"{value!r} is not a whole number (or none)")
    return kind, name, int(value)


class GovernorUI(App[None]):
    TITLE = "governord"
    BINDINGS = [
        Binding("e", "edit", "Edit cap"),
        Binding("c", "cancel_task", "Cancel task"),
        Binding("r", "refresh", "Refresh"),
        Binding("q", "quit", "Quit"),
    ]
    CSS = "#edit { display: none; } #edit.open { display: block; }"

    def __init__(
        self, addr: str | None = None, api_key: str | None = None, refresh_s: float = REFRESH_S
    ) -> None:
        super().__init__()
        self.addr, self.api_key, self.refresh_s = addr, api_key, refresh_s
        self.client: Client | None = None
        self.nodes: dict[int, TreeNode[int]] = {}
        self.infos: dict[int, dict[str, Any]] = {}
        self.refreshes = 0
        self.notice = ""
        self.counts = ""

    def compose(self) -> ComposeResult:
        yield Header()
        yield Tree("connecting...", id="tree")
        yield Input(placeholder="http=500 | limit db=4 | http=none", id="edit")
        yield Static("", id="status")
        yield Footer()

    async def on_mount(self) -> None:
        try:
            self.client = await Client(self.addr, self.api_key).connect()
        except GovernorClientError as exc:
            self._say(f"cannot reach governord: {exc}")
            return
        await self.action_refresh()
        self.set_interval(self.refresh_s, self.action_refresh)

    async def on_unmount(self) -> None:
        if self.client is not None:
            await self.client.close()

    def _say(self, text: str, *, notice: bool = True) -> None:
        """The status line: the last action's outcome stays in front of the counts."""
        if notice:
            self.notice = text
            text = f"{text}  |  {self.counts}" if self.counts else text
        else:
            self.counts = text
            text = f"{self.notice}  |  {text}" if self.notice else text
        self.query_one("#status", Static).update(Text(text))

    async def action_refresh(self) -> None:
        if self.client is None:
            return
        try:
            tree = self.query_one("#tree", Tree)
        except NoMatches:  # the screen is going away (a refresh timer fired at exit)
            return
        try:
            infos = await self._walk(self.client)
        except GovernorClientError as exc:
            self._say(f"governord: {exc}")
            return
        root_id = self.client.scope_id
        if not self.nodes:
            tree.root.data = root_id
            self.nodes[root_id] = tree.root
            tree.root.expand()
        for nid, info in infos.items():  # parents come before children (breadth first)
            node = self.nodes.get(nid)
            if node is None:
                parent = self.nodes.get(info.get("parent_id") or -1, tree.root)
                node = self.nodes[nid] = parent.add(Text(describe(info)), data=nid, expand=True)
            else:
                node.set_label(Text(describe(info)))  # Text: no markup
        for nid in [n for n in self.nodes if n not in infos and n != root_id]:
            self.nodes.pop(nid).remove()
        self.infos = infos
        self.refreshes += 1
        self._say(f"{len(infos)} node(s) under {self.client.tenant or 'the scope'}", notice=False)

    async def _walk(self, client: Client) -> dict[int, dict[str, Any]]:
        out: dict[int, dict[str, Any]] = {}
        todo = [client.scope_id]
        while todo and len(out) < NODES_SHOWN_MAX:
            nid = todo.pop(0)
            info = await client.get_node(nid)
            out[nid] = info
            todo.extend(int(c) for c in info.get("children") or [])
        return out

    def _selected(self) -> int | None:
        node = self.query_one("#tree", Tree).cursor_node
        return None if node is None else node.data

    def action_edit(self) -> None:
        edit = self.query_one("#edit", Input)
        edit.add_class("open")
        edit.value = ""
        edit.focus()

    async def on_input_submitted(self, event: Input.Submitted) -> None:
        edit = self.query_one("#edit", Input)
        edit.remove_class("open")
        self.query_one("#tree", Tree).focus()
        nid = self._selected()
        if nid is None or self.client is None:
            return
        try:
            kind, name, limit = parse_edit(event.value)
            if kind == "quota":
                await self.client.set_quota(nid, name, limit)
            else:
                await self.client.set_limit(nid, name, limit)
        except (ValueError, GovernorClientError) as exc:
            self._say(f"not changed: {exc}")
            return
        self._say(f"node {nid}: {kind} {name} = {limit}")
        await self.action_refresh()

    async def action_cancel_task(self) -> None:
        nid = self._selected()
        if nid is None or self.client is None or nid == self.client.scope_id:
            self._say("select a task under the scope to cancel it")
            return
        try:
            await self.client.end_node(nid, cancel=True)
        except GovernorClientError as exc:
            self._say(f"not cancelled: {exc}")
            return
        self._say(f"node {nid} cancelled")
        await self.action_refresh()
