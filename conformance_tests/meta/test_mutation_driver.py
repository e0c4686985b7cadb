"""The mutation driver's test command (tools/mutation/verdict.py): mutmut 2.5 counts a mutant killed only on
exit 1, so every failing pytest exit must become 1, a mutant that breaks the module's import included."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import datetime as dt
from pathlib import Path

import pytest

pytestmark = pytest.mark.meta
REPO = Path(__file__).resolve().parents[2]

CASES = {
    "passing": ("def test_ok():\n    assert True\n", 0, 0),
    "failing": ("def test_bad():\n    assert False\n", 1, 1),
    "a module that no longer imports": ("import not_a_module_anywhere\n\ndef test_ok():\n    pass\n", 2, 1),
    "no tests": ("x = 1\n", 5, 1),
}


def _exit(tmp_path: Path, module: str, source: str) -> int:
    (tmp_path / "test_case.py").write_text(source)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", module, "-q", "-p", "no:cacheprovider", "test_case.py"]
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True).returncode


@pytest.mark.parametrize("case", CASES)
def test_every_failing_exit_is_a_kill(tmp_path, case):
    source, pytest_exit, verdict_exit = CASES[case]
    assert _exit(tmp_path, "pytest", source) == pytest_exit, "pytest's own exit code changed"
    assert _exit(tmp_path, "tools.mutation.verdict", source) == verdict_exit


def _driver():
    spec = importlib.util.spec_from_file_location("rlconform_mutation_run", REPO / "tools" / "mutation" / "run.py")
    run = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(run)
    return run


def test_the_driver_runs_the_tests_through_the_verdict():
    run = _driver()
    cfg = {"pytest_args": ["-x"], "modules": {"reference_impl/_clip.py": ["test_ppo_losses.py"]}}
    cmd = run.runner(cfg, "reference_impl/_clip.py", REPO)
    assert " -m tools.mutation.verdict -x conformance_tests/test_ppo_losses.py" in cmd


@pytest.mark.parametrize("until, expected", [
    ("23:30", dt.datetime(2026, 11, 27, 23, 30, tzinfo=dt.timezone.utc)),  # later today
    ("01:05", dt.datetime(2026, 11, 28, 1, 5, tzinfo=dt.timezone.utc)),  # past today: tomorrow's
    ("22:50", dt.datetime(2026, 11, 28, 22, 50, tzinfo=dt.timezone.utc)),  # now exactly: a day on, not 0 s
])
def test_until_is_the_next_occurrence(until, expected):
    now = dt.datetime(2026, 11, 27, 22, 50, tzinfo=dt.timezone.utc)
    assert _driver().parse_until(until, now) == expected


@pytest.mark.parametrize("bad", ["25:00", "noon", "1:2:3", "12:60"])
def test_a_bad_until_is_a_usage_error(tmp_path, bad):
    proc = subprocess.run([sys.executable, str(REPO / "tools" / "mutation" / "run.py"), "--until", bad,
                           "--modules", "reference_impl/_clip.py", "--workdir", str(tmp_path / "work")],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "--until wants a UTC time HH:MM" in proc.stderr
    assert not (tmp_path / "work").exists(), "a usage error must not have started a snapshot"
