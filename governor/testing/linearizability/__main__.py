"""``python -m governor.testing.linearizability history.json [--max-states N] [--whole]``:
check a saved history; prints the verdict and, for a violation, its explanation.
Exits 0 (linearizable), 1 (a violation), 2 (unknown: the search bound was reached), or
64 with one line for a history that cannot be read."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

from ._check import check
from ._history import History, HistoryError
from ._wgl import SEARCH_STATES_MAX

EXIT = {"ok": 0, "violation": 1, "unknown": 2}
USAGE_EXIT = 64  # a history or an argument that cannot be used (kept apart from 2: unknown)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: {message}", file=sys.stderr)
        sys.exit(USAGE_EXIT)


def main(argv: list[str] | None = None) -> int:
    parser = _Parser(prog="python -m governor.testing.linearizability")
    parser.add_argument("history", help="a history saved with History.save (JSON)")
    parser.add_argument("--max-states", type=int, default=SEARCH_STATES_MAX)
    parser.add_argument("--whole", action="store_true", help="search without partitioning")
    args = parser.parse_args(argv)
    if args.max_states < 1:
        print("--max-states: must be >= 1", file=sys.stderr)
        return USAGE_EXIT
    try:
        history = History.load(args.history)
    except HistoryError as exc:
        print(f"{args.history}: {exc}", file=sys.stderr)
        return USAGE_EXIT
    result = check(history, max_states=args.max_states, partition=not args.whole)
    print(result.explain())
    return EXIT[result.verdict]


if __name__ == "__main__":
    sys.exit(main())
