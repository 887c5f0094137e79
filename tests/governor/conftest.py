"""Fixtures the end-to-end modules share: a real governord per store, and a raw channel."""

from tests.governor._daemon import daemon, raw, sqlite_daemon

__all__ = ["daemon", "raw", "sqlite_daemon"]
