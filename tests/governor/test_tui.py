"""`governord ui` driven by textual's pilot against a real governord: the tree shows the
caller's nodes with used/cap, and a cap edited or a task cancelled on the screen is what
the engine then reports."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from governor.client import Client
from governor.tui import GovernorUI, describe, parse_edit
from tests.governor._daemon import KEYS, Daemon, running


def test_parse_edit_and_describe() -> None:
    assert parse_edit("http=500") == ("quota", "http", 500)
    assert parse_edit(" limit db = 4 ") == ("limit", "db", 4)
    assert parse_edit("http=none") == ("quota", "http", None)
    for bad in ("http", "=3", "http=-1", "http=lots"):
        with pytest.raises(ValueError):
            parse_edit(bad)
    line = describe(
        {
            "name": "crawl",
            "state": "active",
            "quotas": {"http": 10},
            "used": {"http": 3},
            "limits": {"db": 2},
            "held": {"db": 1},
            "waiting": {"db": 4},
            "credit_outstanding": {"tokens": 100},
        }
    )
    assert line == "crawl [active]  http 3/10  db held 1/2  db waiting 4  tokens credit out 100"


@pytest.fixture
def governord(tmp_path: Path) -> Iterator[Daemon]:
    yield from running("sqlite", tmp_path)


@pytest.mark.slow
def test_the_screen_edits_a_cap_and_cancels_a_task(governord: Daemon) -> None:
    async def scenario() -> None:
        async with Client(governord.addr, KEYS["KEY_A"]) as sdk:
            crawl = await sdk.create_node("crawl", quotas={"http": 10})
            await sdk.consume_at(crawl, "http", 3)
            page = await sdk.create_node("page", parent_id=crawl)
            app = GovernorUI(governord.addr, KEYS["KEY_A"], refresh_s=0.2)
            async with app.run_test() as pilot:
                for _ in range(100):
                    if crawl in app.nodes and page in app.nodes:
                        break
                    await pilot.pause(0.05)
                label = str(app.nodes[crawl].label)
                assert "crawl [active]" in label and "http 3/10" in label
                tree = app.query_one("#tree")
                tree.focus()
                await pilot.press("down")  # the scope's first child: crawl
                assert app._selected() == crawl
                await pilot.press("e")
                await pilot.press(*"http=99", "enter")
                await pilot.pause(0.2)
                assert (await sdk.get_node(crawl))["quotas"] == {"http": 99}
                await pilot.press("down")  # page, under crawl
                assert app._selected() == page
                await pilot.press("c")
                await pilot.pause(0.2)
                assert (await sdk.get_node(page))["state"] == "cancelled"
                assert (await sdk.get_node(crawl))["state"] == "active"
                await pilot.press("e")
                await pilot.press(*"http=lots", "enter")  # a mistake changes nothing
                await pilot.pause(0.1)
                assert "not changed" in str(app.query_one("#status").render())
                assert (await sdk.get_node(crawl))["quotas"] == {"http": 99}

    asyncio.run(scenario())
