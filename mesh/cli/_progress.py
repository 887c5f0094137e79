"""Progress of long commands (`mesh sim run`, `mesh sim sweep`, `mesh bench ...`) on stderr,
drawn by rich: a bar where the work has a known size, elapsed time beside the requested
duration where it is timed. Shown only when stderr is a terminal and the command was not
asked for `--json`: a log, a pipe or a CI run gets no control codes, and stdout (the JSON)
is never touched."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

__all__ = ["Advance", "enabled", "progress", "shows_progress", "timed"]

Handler = Callable[[argparse.Namespace], int]

# done, total, what is running now: the hook the simulator calls (sim.runner, sim.sweep)
Advance = Callable[[int, int, str], None]


def enabled(args: argparse.Namespace) -> bool:
    """Whether to draw: stderr is a terminal, and neither --json nor --table was asked."""
    quiet = getattr(args, "json", False) or getattr(args, "table", False)
    return not quiet and sys.stderr.isatty()


@contextmanager
def progress(args: argparse.Namespace, title: str) -> Iterator[Advance | None]:
    """A bar for work counted in steps; None (draw nothing) when not `enabled`."""
    if not enabled(args):
        yield None
        return
    bar = Progress(
        TextColumn(f"{title} [bold]{{task.description}}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        transient=True,
        redirect_stdout=False,  # the JSON goes to stdout as it is, never through the bar
    )
    task = bar.add_task("", total=None)

    def advance(done: int, total: int, what: str) -> None:
        bar.update(task, completed=done, total=total, description=what)

    with bar:
        yield advance


@contextmanager
def timed(args: argparse.Namespace, title: str, seconds: float | None = None) -> Iterator[None]:
    """A spinner with the elapsed time (beside the requested `seconds`, if the run is timed)
    for work that reports no steps: a benchmark's measured runs."""
    if not enabled(args):
        yield
        return
    about = f" (measures for {seconds:g} s, plus set-up)" if seconds else ""
    bar = Progress(
        SpinnerColumn(),
        TextColumn(f"{title}{about}"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
        redirect_stdout=False,
    )
    bar.add_task("", total=None)
    with bar:
        yield


def shows_progress(
    title: str, seconds: Callable[[argparse.Namespace], float | None] | None = None
) -> Callable[[Handler], Handler]:
    """A command handler drawn with `timed` while it runs; `seconds` reads the measured
    duration from its flags."""

    def wrap(handler: Handler) -> Handler:
        def run(args: argparse.Namespace) -> int:
            try:
                s = seconds(args) if seconds is not None else None
            except (TypeError, ValueError):
                s = None
            with timed(args, title, s if isinstance(s, int | float) and s > 0 else None):
                return handler(args)

        run.__doc__, run.__name__ = handler.__doc__, handler.__name__
        return run

    return wrap
