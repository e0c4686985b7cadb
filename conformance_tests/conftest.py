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
from pathlib import Path

import pytest

from conformance_tests.plugin import activate

DOCS_MODULES = ("mkdocs", "material", "pymdownx", "mathjax")
_SITE_SKIPPED = pytest.StashKey[bool]()


def pytest_configure(config):
    activate(config)


@pytest.hookimpl(tryfirst=True)  # before -k/-m/--deselect: ``items`` is everything collected
def pytest_collection_modifyitems(session, config, items):
    """The longest tests first (``long``, then the other meta-tests). They start processes (audits,
    torchrun, a browser) and take seconds each, while a clause test takes milliseconds: under
    pytest-xdist the short tests then fill in behind the long ones and the workers finish together,
    instead of one running a long test at the end while the others wait.

    A session that collected the whole suite also hands its clause marks to the audits' collection
    cache (:func:`rlconform.audit.suite_collection`), which would otherwise collect it all again."""
    items.sort(key=lambda it: (it.get_closest_marker("long") is None, it.get_closest_marker("meta") is None))
    if session.testsfailed == 0 and _whole_suite(config):
        from rlconform.audit import seed_suite_collection
        from rlconform.coverage import clause_marks

        seed_suite_collection(*clause_marks(items))


def _whole_suite(config) -> bool:
    """Whether this session collects all of the suite: its arguments name the package (a directory or
    ``--pyargs``), nothing narrower, and nothing is ignored."""
    root = Path(__file__).resolve().parent
    if config.getoption("ignore", None) or config.getoption("ignore_glob", None) or not config.args:
        return False
    for arg in config.args:
        spec = importlib.util.find_spec(arg) if config.getoption("pyargs", False) and "/" not in arg else None
        path = Path(spec.origin).parent if spec is not None and spec.origin else Path(arg.split("::")[0])
        if path.resolve() != root:
            return False
    return True


def _site_ignored(path: Path, config) -> bool:
    if path.name == "test_site.py" and os.environ.get("RLCONFORM_SITE_TESTS") != "1":
        return any(importlib.util.find_spec(m) is None for m in DOCS_MODULES)
    return False


def pytest_ignore_collect(collection_path, config):
    """The site tests need the docs extra: collected when it is installed, or always with
    RLCONFORM_SITE_TESTS=1 (CI), where a missing toolchain then fails loudly."""
    if _site_ignored(collection_path, config):
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
def tiny_game(tmp_path_factory):
    """One tiny tw-cooking game (recipe 1, take 1, one room), generated once per run (tw-make takes seconds)."""
    pytest.importorskip("textworld")
    from conformance_tests.run_once import once_per_run
    from reference_impl.ccapo.textworld.games import GameSpec, generate

    return once_per_run(tmp_path_factory, "tw-game", lambda d: generate(GameSpec(seed=0), d / "games"))


@pytest.fixture(scope="session")
def run_python(tmp_path_factory):
    """``run_python(code) -> CompletedProcess``: the code as a script of its own (own module, own imports),
    forked from a warm server that imported torch and the audited libraries once per worker, started on
    first use; a plain ``python`` when the server cannot start. The finding pages' repros use it."""
    from conformance_tests.warm_run import run, warm_server

    scripts, server, numbers = tmp_path_factory.mktemp("scripts"), {}, itertools.count()

    def run_code(code: str, timeout: float = 300) -> subprocess.CompletedProcess:
        script = scripts / f"script_{next(numbers)}.py"
        script.write_text(code, encoding="utf-8")
        if "it" not in server:
            server["it"] = warm_server(["torch", "numpy", "sb3_contrib", "torchrl", "trl", "verl"])
        return run(server["it"], [sys.executable, "-m", script.stem], cwd=scripts, timeout=timeout)

    yield run_code
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
