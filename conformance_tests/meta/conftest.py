"""Fixtures of the meta-tests: warm children for their audits and scripts, a TextWorld game, the site switch."""
from __future__ import annotations

import importlib.util
import itertools
import os
import shutil
import sys
from pathlib import Path

import pytest
from rlconform import launch

from conformance_tests.meta.run_once import once_per_run
from reference_impl.ccapo.textworld.games import GameSpec, generate

DOCS_MODULES = ("mkdocs", "material", "pymdownx", "mathjax")
# The audited libraries, imported once by the forkserver for the finding pages' repros.
LIBRARIES = ("sb3_contrib", "torchrl", "trl", "verl")
# The meta-test modules whose factories their audits build (``--impl MODULE:factory``), imported once by the
# forkserver too: a child imports a big test module in about half a second (it is only the impl's module
# there, never collected, so nothing needs pytest's assertion rewriting).
FACTORY_MODULES = tuple(f"conformance_tests.meta.test_{m}" for m in ("verdict", "harness", "device", "messages",
                                                                       "registry"))
_SITE_SKIPPED = pytest.StashKey[str]()


def _site_missing(path: Path) -> str | None:
    """What the site tests lack on this machine (None: they run). RLCONFORM_SITE_TESTS=1 runs them
    whatever is missing, so that CI fails loudly instead of passing without them."""
    if path.name != "test_site.py" or os.environ.get("RLCONFORM_SITE_TESTS") == "1":
        return None
    if any(importlib.util.find_spec(m) is None for m in DOCS_MODULES):
        return "the docs extra (pip install -e '.[docs]')"
    if not (shutil.which("chromium") or shutil.which("chromium-browser")):
        return "a browser (Debian's chromium package)"
    return None


def pytest_ignore_collect(collection_path, config):
    """The site tests need the docs extra and Chromium: collected when both are here, or always with
    RLCONFORM_SITE_TESTS=1 (CI)."""
    missing = _site_missing(collection_path)
    if missing:
        config.stash[_SITE_SKIPPED] = missing
        return True
    return None


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    missing = config.stash.get(_SITE_SKIPPED, None)
    if missing:
        terminalreporter.write_line(f"rlconform: docs site tests not collected: they need {missing}; "
                                    "RLCONFORM_SITE_TESTS=1 runs them anyway")


@pytest.fixture(scope="session", autouse=True)
def _warm_children():
    """The meta-tests run about 150 short audits and many short scripts; their children fork from the
    standard library's forkserver, started by the first of them in each worker."""
    with launch.warm((*LIBRARIES, *FACTORY_MODULES)):
        yield


@pytest.fixture(scope="session")
def tiny_game(tmp_path_factory):
    """One tiny tw-cooking game (recipe 1, take 1, one room), generated once per run (tw-make takes seconds)."""
    pytest.importorskip("textworld")

    return once_per_run(tmp_path_factory, "tw-game", lambda d: generate(GameSpec(seed=0), d / "games"))


@pytest.fixture(scope="session")
def run_python(tmp_path_factory):
    """``run_python(code) -> CompletedProcess``: the code as a script of its own (own module, own imports),
    forked from the warm forkserver. The finding pages' repros use it. Its temporary directory is the run's own
    (a library's default log folder, such as SB3-<time> of sb3's learn(), would otherwise stay in /tmp)."""
    scripts, numbers = tmp_path_factory.mktemp("scripts"), itertools.count()
    env = {**os.environ, "TMPDIR": str(scripts)}

    def run_code(code: str, timeout: float = 300):
        script = scripts / f"script_{next(numbers)}.py"
        script.write_text(code, encoding="utf-8")
        return launch.run([sys.executable, "-m", script.stem], cwd=scripts, env=env, timeout=timeout, tmp=scripts)

    return run_code
