"""Benchmarks: `python -m bench` measures them and writes docs/BENCHMARKS.md."""
