"""Meta-tests of provenance stamps: a stamp's ``+dirty`` means the code differed from its commit, so the
pages and data a stamped run writes (under ``docs/``, scripts excepted) do not make it dirty."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
from rlconform.provenance import generated_output

from conformance_tests.preflight import git_commit

pytestmark = pytest.mark.meta


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


@pytest.fixture
def checkout(tmp_path):
    """A git checkout holding an importable module, a docs page, its data and a docs script."""
    repo = tmp_path / "proj"
    (repo / "docs" / "results").mkdir(parents=True)
    (repo / "pkg.py").write_text("X = 1\n")
    for name in ("results.md", "curves.jsonl", "plot.py"):
        (repo / "docs" / "results" / name).write_text("original\n")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "init")
    spec = importlib.util.spec_from_file_location("stamped_pkg", repo / "pkg.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    sys.modules["stamped_pkg"] = mod
    yield repo, mod
    sys.modules.pop("stamped_pkg", None)


def test_a_stamp_is_dirty_when_code_changed_not_when_outputs_did(checkout):
    repo, mod = checkout
    head = _git(repo, "rev-parse", "HEAD").strip()
    assert git_commit(mod, ignore=generated_output) == head
    for output in ("results.md", "curves.jsonl"):  # what the stamped run itself writes
        (repo / "docs" / "results" / output).write_text("regenerated\n")
    assert git_commit(mod, ignore=generated_output) == head
    assert git_commit(mod) == head + "+dirty", "without ignore, any change is dirty (an implementation's commit)"
    (repo / "docs" / "results" / "plot.py").write_text("changed\n")  # a script beside the page is code
    assert git_commit(mod, ignore=generated_output) == head + "+dirty"
    _git(repo, "checkout", "--", "docs/results/plot.py")
    (repo / "pkg.py").write_text("X = 2\n")
    assert git_commit(mod, ignore=generated_output) == head + "+dirty"
