"""Benchmarks run by ``rlconform bench`` (pytest-benchmark; ``pytest tools/benchmarks --benchmark-only``)."""
