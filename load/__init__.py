"""The benchmarks (load/bench/): measured apart from the product, never shipped in its wheel."""
