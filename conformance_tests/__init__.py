"""rlconform's conformance suite: the pytest plugin, the contract, strategies, tests and mutants."""
from conformance_tests.errors import NotApplicable

__all__ = ["NotApplicable"]
