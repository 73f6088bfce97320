"""Benchmarks: one command each; results go to docs/performance.md."""
