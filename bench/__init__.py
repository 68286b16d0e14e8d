"""Benchmarks of the pipeline's hot paths, run with ``python -m litstream.bench`` (see bench/README.md)."""
