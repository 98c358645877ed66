"""The benchmarks: each writes docs/bench/<name>.json and its section of docs/BENCHMARKS.md.

Run one with `python -m load.bench.<name>` on a quiet machine (see docs/BENCHMARKS.md)."""
