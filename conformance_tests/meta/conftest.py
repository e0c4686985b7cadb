"""Fixtures of the meta-tests: warm children for their audits and scripts, a TextWorld game, the site switch."""
from __future__ import annotations

import importlib.util
import itertools
import os
import sys
from pathlib import Path

import pytest
from rlconform import launch

from conformance_tests.meta.run_once import once_per_run
from reference_impl.ccapo.textworld.games import GameSpec, generate

DOCS_MODULES = ("mkdocs", "material", "pymdownx", "mathjax")
# The audited libraries, imported once by the forkserver for the finding pages' repros.
LIBRARIES = ("sb3_contrib", "torchrl", "trl", "verl")
_SITE_SKIPPED = pytest.StashKey[bool]()


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
def _warm_children():
    """The meta-tests run about 150 short audits and many short scripts; their children fork from the
    standard library's forkserver, started by the first of them in each worker."""
    with launch.warm(LIBRARIES):
        yield


@pytest.fixture(scope="session")
def tiny_game(tmp_path_factory):
    """One tiny tw-cooking game (recipe 1, take 1, one room), generated once per run (tw-make takes seconds)."""
    pytest.importorskip("textworld")

    return once_per_run(tmp_path_factory, "tw-game", lambda d: generate(GameSpec(seed=0), d / "games"))


@pytest.fixture(scope="session")
def run_python(tmp_path_factory):
    """``run_python(code) -> CompletedProcess``: the code as a script of its own (own module, own imports),
    forked from the warm forkserver. The finding pages' repros use it."""
    scripts, numbers = tmp_path_factory.mktemp("scripts"), itertools.count()

    def run_code(code: str, timeout: float = 300):
        script = scripts / f"script_{next(numbers)}.py"
        script.write_text(code, encoding="utf-8")
        return launch.run([sys.executable, "-m", script.stem], cwd=scripts, timeout=timeout, tmp=scripts)

    return run_code
