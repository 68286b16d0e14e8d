"""Benchmarks of the pipeline's hot paths, run with ``python -m bench`` (see bench/README.md)."""
