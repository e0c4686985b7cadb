"""Fixtures of the conformance tests, and the switch that turns the suite's machinery on.

This file is loaded only when pytest collects the conformance tests, so the plugin stays inert in
every other project of the environment.
"""
from __future__ import annotations

import importlib.util
import itertools
import os
import subprocess
import sys

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
def run_python(tmp_path_factory):
    """``run_python(code) -> CompletedProcess``: the code as a script of its own (own module, own imports),
    forked from a warm server that imported torch and the audited libraries once per worker, started on
    first use; a plain ``python`` when the server cannot start. The finding pages' repros use it."""
    from rlconform.forkserver import ForkServer, ForkServerError

    scripts, server, numbers = tmp_path_factory.mktemp("scripts"), {}, itertools.count()

    def run(code: str, timeout: float = 300) -> subprocess.CompletedProcess:
        script = scripts / f"script_{next(numbers)}.py"
        script.write_text(code, encoding="utf-8")
        args = [sys.executable, "-m", script.stem]
        if "it" not in server:
            try:
                server["it"] = ForkServer(["torch", "numpy", "sb3_contrib", "torchrl", "trl", "verl"])
            except ForkServerError:
                server["it"] = None
        with open(script.with_suffix(".out"), "w+") as out, open(script.with_suffix(".err"), "w+") as err:
            launch = server["it"].popen if server["it"] is not None else subprocess.Popen
            proc = launch(args, cwd=scripts, stdin=subprocess.DEVNULL, stdout=out, stderr=err)
            try:
                returncode = proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                raise
            out.seek(0), err.seek(0)
            return subprocess.CompletedProcess(args, returncode, out.read(), err.read())

    yield run
    if server.get("it") is not None:
        server["it"].close()


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
