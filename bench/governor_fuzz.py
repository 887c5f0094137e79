"""The long randomized invariant run of governord's engine (the CI run is 40 seeds).

    python bench/governor_fuzz.py --long          # 500 seeds x 1,500 operations
    python bench/governor_fuzz.py --seeds 0:100

Prints one JSON object: seeds, ops, failures (each with its seed and message), seconds.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from governor.testing import Violation
from governor.testing.fuzz import run_seed


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--long", action="store_true", help="500 seeds")
    p.add_argument("--seeds", default="0:40", help="start:stop")
    p.add_argument("--ops", type=int, default=1500)
    p.add_argument("--json", action="store_true", help="JSON on stdout (the default)")
    args = p.parse_args()
    start, stop = (0, 500) if args.long else (int(x) for x in args.seeds.split(":"))
    failures = []
    t0 = time.perf_counter()
    for seed in range(start, stop):
        try:
            run_seed(seed, args.ops)
        except Violation as exc:
            failures.append({"seed": seed, "error": str(exc)})
            print(f"FAIL {exc}", file=sys.stderr, flush=True)
    result = {
        "seeds": stop - start,
        "first_seed": start,
        "ops": args.ops,
        "failures": failures,
        "seconds": round(time.perf_counter() - t0, 1),
    }
    print(json.dumps(result, sort_keys=True))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
