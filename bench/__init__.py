"""Benchmarks of the real code; each prints one JSON object."""
