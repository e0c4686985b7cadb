"""Benchmarks, from a checkout: ``python -m pytest tools/benchmarks --benchmark-only`` (pytest-benchmark)."""
