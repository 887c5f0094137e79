"""How both daemons and every command answer an operator: a mistake is one line, exit 2.

`OneLineParser` refuses a flag in one line naming it; `one_line` folds multi-line messages
(YAML and database errors carry newlines); `probe_bind` refuses a listen address this host
cannot serve, with the OS's reason, before grpc tries (grpc says only "Failed to bind" and
logs a line of its own).
"""

from __future__ import annotations

import argparse
import socket
from typing import NoReturn

from ratemesh.checks import split_address
from ratemesh.errors import ConfigError

__all__ = ["EXIT_USAGE", "OneLineParser", "one_line", "probe_bind"]

EXIT_USAGE = 2  # the operator's mistake, as argparse answers a bad flag


def one_line(text: object) -> str:
    """`text` on one line, whatever the message underneath."""
    return " ".join(str(text).split())


class OneLineParser(argparse.ArgumentParser):
    """An argparse parser whose refusal is one line naming the flag, not usage plus error
    (its subparsers inherit the class). `--help` still prints the full usage."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: {one_line(message)} (see {self.prog} --help)\n")


def probe_bind(listen: str, field: str = "listen", error: type[ConfigError] = ConfigError) -> None:
    """Raise `error(field, ...)` if no address `listen` resolves to can be bound.

    Binds as grpc does (SO_REUSEADDR, no SO_REUSEPORT) and passes if any resolved address
    binds, as grpc does; port 0 (any free port) cannot be in use."""
    parts = split_address(listen)
    if parts is None or parts[1] == 0:
        return  # not host:port (its check names that), or any free port
    try:
        infos = socket.getaddrinfo(
            parts[0],
            parts[1],
            type=socket.SOCK_STREAM,
            flags=socket.AI_PASSIVE,
        )
    except socket.gaierror as exc:
        raise error(field, f"cannot serve on {listen}: {exc.strerror}") from exc
    reasons = ["no address"]
    for family, kind, proto, _, address in infos:
        with socket.socket(family, kind, proto) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(address)
                return
            except OSError as exc:
                reasons.insert(-1, exc.strerror or str(exc))
    raise error(field, f"cannot serve on {listen}: {reasons[0]}")
