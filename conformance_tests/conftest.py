"""Fixtures of the conformance tests, and the switch that turns the suite's machinery on.

This file is loaded only when pytest collects the conformance tests, so the plugin stays inert in
every other project of the environment.
"""
from __future__ import annotations

import importlib.util
import os

import pytest

from conformance_tests.plugin import activate

DOCS_MODULES = ("mkdocs", "material", "pymdownx", "mathjax")
_SITE_SKIPPED = pytest.StashKey[bool]()


def pytest_configure(config):
    activate(config)


def pytest_ignore_collect(collection_path, config):
    """The site tests need the docs extra: collected when it is installed, or always with
    RLCONFORM_SITE_TESTS=1 (CI), where a missing toolchain then fails loudly."""
    if collection_path.name == "test_site.py" and os.environ.get("RLCONFORM_SITE_TESTS") != "1":
        if any(importlib.util.find_spec(m) is None for m in DOCS_MODULES):
            config.stash[_SITE_SKIPPED] = True
            return True
    return None


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if config.stash.get(_SITE_SKIPPED, False):
        terminalreporter.write_line("rlconform: docs site tests not collected (pip install -e '.[docs]' to run them)")


@pytest.fixture(scope="session", autouse=True)
def _warm_audit_children():
    """The meta-tests run about 150 short audits; their children fork from one warm server per worker
    (started on the first audit, so a run without meta-tests never starts one)."""
    from rlconform.audit import warm_children

    with warm_children():
        yield


@pytest.fixture(scope="session")
def impl():
    """The implementation under test (built once per session; the pre-flight already built it once)."""
    from conformance_tests import harness
    from conformance_tests.impl import load_impl

    obj = load_impl(harness.session_impl())
    harness.set_capabilities(getattr(obj, "capabilities", None))
    return obj


@pytest.fixture(scope="session")
def device():
    import torch

    from conformance_tests import harness

    return torch.device(harness.session_device())


def _family_fixture(name):
    @pytest.fixture(name=name, scope="session")
    def fixture(impl):
        from conformance_tests import harness

        return harness.FamilyProxy(name, getattr(impl, name, None))

    fixture.__doc__ = f"The {name} operations of the implementation under test, behind the recording proxy."
    return fixture


sac = _family_fixture("sac")
ppo = _family_fixture("ppo")
isreshape = _family_fixture("isreshape")
ccapo = _family_fixture("ccapo")
