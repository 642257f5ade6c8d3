"""Benchmarks: placement quality on public traces and latency at scale (not shipped, not in CI)."""
