"""Benchmarks of governord's real code; each returns one JSON-able dict (see governor.cli)."""
