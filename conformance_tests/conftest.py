"""Fixtures of the conformance tests, and the switch that turns the suite's machinery on.

This file is loaded only when pytest collects the conformance tests, so the plugin stays inert in
every other project of the environment.
"""
from __future__ import annotations

import pytest
import torch

from conformance_tests import harness
from conformance_tests.impl import load_impl
from conformance_tests.plugin import activate


def pytest_configure(config):
    activate(config)


@pytest.hookimpl(tryfirst=True)  # before -k/-m/--deselect: ``items`` is everything collected
def pytest_collection_modifyitems(session, config, items):
    """The longest tests first (``long``, then the other meta-tests). They start processes (audits,
    torchrun, a browser) and take seconds each, while a clause test takes milliseconds: under
    pytest-xdist the short tests then fill in behind the long ones and the workers finish together,
    instead of one running a long test at the end while the others wait."""
    items.sort(key=lambda it: (it.get_closest_marker("long") is None, it.get_closest_marker("meta") is None))


@pytest.fixture(scope="session")
def impl():
    """The implementation under test (built once per session; the pre-flight already built it once)."""
    obj = load_impl(harness.session_impl())
    harness.set_capabilities(getattr(obj, "capabilities", None))
    return obj


@pytest.fixture(scope="session")
def device():
    return torch.device(harness.session_device())


def _family_fixture(name):
    @pytest.fixture(name=name, scope="session")
    def fixture(impl):
        return harness.FamilyProxy(name, getattr(impl, name, None))

    fixture.__doc__ = f"The {name} operations of the implementation under test, behind the recording proxy."
    return fixture


sac = _family_fixture("sac")
ppo = _family_fixture("ppo")
isreshape = _family_fixture("isreshape")
ccapo = _family_fixture("ccapo")
