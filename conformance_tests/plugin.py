"""The rlconform pytest plugin (registered through the ``pytest11`` entry point).

Being installed must cost other projects nothing: this module imports neither torch nor hypothesis
and only adds options. The suite's machinery (hypothesis profiles, one torch thread, the recording
proxy, pre-flight, the report) is switched on by :func:`activate`, which runs only when the
conformance tests are collected (their ``conftest.py`` calls it) or an implementation is named on
the command line.

Options are namespaced (``--rlconform-impl``, ``--rlconform-device``, ...). The short forms of the
README (``--impl``, ``--device``, ``--profile``, ``--clauses``, ``--families``, ``--expectations``)
are added after the project's own conftests have registered theirs, and only where the name is
still free, so a project with its own ``--device`` keeps it.
"""
from __future__ import annotations

import os
import sys

import pytest

from conformance_tests.options import OPTIONS, dest


def _add_callers_import_path() -> None:
    """``rlconform audit`` runs this pytest in a temporary directory, perhaps forked from a server that started
    before the caller's PYTHONPATH was known: it passes the caller's import path (its working directory and
    PYTHONPATH, absolute) in RLCONFORM_IMPORT_PATH, so an ``--impl`` module the caller can import, the child can
    import too. Added per session, after start-up (as ``python -m`` adds its directory): a module imported by a
    forkserver ran its top level there, and a directory on PYTHONPATH is searched while the interpreter starts,
    where a harmless ``types.py`` in it would shadow the standard library's."""
    for entry in reversed([e for e in os.environ.get("RLCONFORM_IMPORT_PATH", "").split(os.pathsep) if e]):
        if entry not in sys.path:
            sys.path.insert(1, entry)


def pytest_addoption(parser):
    _add_callers_import_path()  # the first hook of every session (xdist workers' too), before the pre-flight
    group = parser.getgroup("rlconform", "rlconform conformance suite")
    for name, _, kw in OPTIONS:
        group.addoption(f"--rlconform-{name}", dest=dest(name), **kw)


@pytest.hookimpl(hookwrapper=True)
def pytest_load_initial_conftests(early_config, parser, args):
    """Add the short option forms once the project's conftests have declared their own options."""
    yield
    taken = {n for opt in parser._anonymous.options for n in opt.names()}  # no public listing exists
    taken |= {n for group in parser._groups for opt in group.options for n in opt.names()}
    group = parser.getgroup("rlconform")
    for name, short, kw in OPTIONS:
        if short and f"--{name}" not in taken:
            group.addoption(f"--{name}", dest=dest(name), **{**kw, "help": f"short for --rlconform-{name}"})


def pytest_configure(config):
    config.addinivalue_line("markers", "clause(*ids): the spec clause(s) this test checks")
    config.addinivalue_line("markers", "meta: tests of the suite itself (not run by audits)")
    config.addinivalue_line("markers", "long: takes many seconds (torchrun, a site build, a browser): run first")
    if config.getoption(dest("impl"), None):
        activate(config)


def activate(config) -> None:
    """Switch the suite's machinery on for this session (idempotent)."""
    if config.pluginmanager.has_plugin("rlconform-run"):
        return
    # the plugin's one late import: the runtime brings torch and hypothesis, which a project that merely
    # has rlconform installed must never pay for
    from conformance_tests.runtime import RlconformRun

    run = RlconformRun(config)
    config.pluginmanager.register(run, "rlconform-run")
    config.add_cleanup(run.restore)
