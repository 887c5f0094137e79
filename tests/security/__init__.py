"""Attacks on every listener, against real processes: each way in is refused or bounded and
the victim keeps its rate (docs/security.md)."""
