"""Adapters that expose third-party libraries through the rlconform contract, for audits.

Each adapter module has a factory ``make()`` (``--impl conformance_tests.adapters.NAME:make``). An
adapter maps contract operations onto the library's own API and leaves out every operation the
library does not provide, so those clauses are reported *not applicable*; it never re-implements
the suite's math. The library is imported lazily, inside ``make()``, so the suite runs without it.
"""
