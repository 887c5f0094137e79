"""A governord-shaped process for crash tests: concurrent consumes through the Authority.

Prints ``node T N`` when thread T's node N is durable and ``ack T`` after each acknowledged
consume of 1 unit on it (only after the reply, which waited for the commit). The parent kills it
(SIGKILL) or breaks its database, then checks the record against the acknowledgements.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import threading

from governor.authority import Authority
from governor.engine import ROOT_ID, Consumed
from governor.store import EventLog, PostgresBackend, SqliteBackend


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--store", choices=["sqlite", "postgres"], required=True)
    p.add_argument("--target", required=True)
    p.add_argument("--schema", default="governor")
    p.add_argument("--app-name", default="governord-workload")
    p.add_argument("--threads", type=int, default=8)
    p.add_argument("--busy-timeout-ms", type=int, default=5_000)
    p.add_argument("--snapshot-every", type=int, default=400)
    args = p.parse_args()
    backend: SqliteBackend | PostgresBackend
    if args.store == "sqlite":
        backend = SqliteBackend(args.target, busy_timeout_ms=args.busy_timeout_ms)
    else:
        backend = PostgresBackend(args.target, schema=args.schema, application_name=args.app_name)
    authority = Authority(EventLog(backend), snapshot_every=args.snapshot_every)
    out = threading.Lock()

    def say(line: str) -> None:
        with out:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()

    def worker(t: int) -> None:
        token = hashlib.sha256(f"{t}".encode()).hexdigest()
        sid, _ = authority.call(lambda e: e.open_session(ROOT_ID, 3_600_000, token))
        created = authority.call(lambda e: e.create_node(None, ROOT_ID, f"w{t}"))
        node = created.node_id  # type: ignore[union-attr]
        say(f"node {t} {node}")
        while True:
            result = authority.call(lambda e: e.consume(sid, node, "http", 1))
            assert isinstance(result, Consumed)
            say(f"ack {t}")

    threads = [threading.Thread(target=worker, args=(t,), daemon=True) for t in range(args.threads)]
    for t in threads:
        t.start()
    say("ready")
    for t in threads:
        t.join()


if __name__ == "__main__":
    main()
