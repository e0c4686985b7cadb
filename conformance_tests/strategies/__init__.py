"""Hypothesis strategies, named as nouns: ``logits()``, ``legal_masks()``, ``group_rewards()``...

One namespace for the whole suite; each family's strategies live in their own submodule and are
re-exported here, so tests write ``from conformance_tests import strategies as st_``.
"""
from conformance_tests.strategies.core import *  # noqa: F401,F403
from conformance_tests.strategies.core import __all__ as _core_all

__all__ = list(_core_all)
