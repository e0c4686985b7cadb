"""Meta-test of the installed product: the wheel, installed outside the checkout, audits, runs its
suite with --pyargs and checks the matrix pins, and carries no meta-tests. CI installs with -e, so nothing
else would notice a command that leans on the checkout."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = [pytest.mark.meta, pytest.mark.long]

REPO = Path(__file__).resolve().parents[2]
WHEEL_SOURCES = ("pyproject.toml", "setup.py", "README.md", "spec", "tools/rlconform", "conformance_tests", "reference_impl")


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The wheel built from this tree, unpacked into its own directory (the environment's dependencies serve)."""
    if not (REPO / "pyproject.toml").exists():
        pytest.fail("this meta-test builds the wheel from a source checkout")
    work = tmp_path_factory.mktemp("wheel")
    # built from a copy of what the wheel is made of: setuptools reuses a checkout's build/ directory, where a
    # module deleted since the last build would still be found and shipped
    src = work / "src"
    src.mkdir()
    for name in WHEEL_SOURCES:
        (shutil.copytree if (REPO / name).is_dir() else shutil.copy2)(
            REPO / name, src / name, **({"ignore": shutil.ignore_patterns("__pycache__")} if (REPO / name).is_dir() else {}))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(work / "dist"), str(src)], check=True, capture_output=True)
    (wheel,) = (work / "dist").glob("rlconform-*.whl")
    site = work / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
                   check=True, capture_output=True)
    outside = work / "elsewhere"
    outside.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site), "PYTHONDONTWRITEBYTECODE": "1"}
    return wheel, site, outside, env


def _run(installed, *argv, timeout=600):
    _, _, cwd, env = installed
    return subprocess.run([sys.executable, *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def test_the_wheel_ships_the_suite_and_its_data_not_its_meta_tests(installed):
    wheel = installed[0]
    names = zipfile.ZipFile(wheel).namelist()
    assert "conformance_tests/adapters/pins.yaml" in names and "rlconform/spec/sac.yaml" in names
    assert "conformance_tests/test_sac_temperature.py" in names or any(n.startswith("conformance_tests/test_sac") for n in names)
    assert not [n for n in names if n.startswith("conformance_tests/meta/") or "forkserver" in n]
    assert not [n for n in names if "experiments" in n or n.startswith(("rlconform/study", "tools/"))]


def test_the_installed_package_is_the_one_that_runs(installed):
    got = _run(installed, "-c", "import rlconform, conformance_tests, reference_impl; "
                                "print(rlconform.__file__, conformance_tests.__file__, reference_impl.__file__)")
    assert got.returncode == 0 and all(str(installed[1]) in p for p in got.stdout.split()), got.stdout + got.stderr


def test_the_installed_audit_runs_outside_the_checkout(installed):
    got = _run(installed, "-m", "rlconform.cli", "audit", "--clause", "SAC-TD-1", "--clause", "PPO-GAE-1", "--out", "o")
    assert got.returncode == 0, got.stdout[-2000:] + got.stderr[-2000:]
    report = json.loads((installed[2] / "o" / "report.json").read_text())
    assert {c["id"]: c["status"] for c in report["clauses"]} == {"SAC-TD-1": "pass", "PPO-GAE-1": "pass"}


def test_the_installed_suite_runs_with_pyargs(installed):
    got = _run(installed, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--pyargs", "conformance_tests",
               "-k", "temperature_update or gae_matches", "-x")
    assert got.returncode == 0 and " passed" in got.stdout, got.stdout[-2000:] + got.stderr[-2000:]


def test_the_installed_pins_are_found(installed):
    got = _run(installed, "-c", "from rlconform import matrix; print(sorted(matrix.load_pins()))")
    assert got.returncode == 0 and "torchrl" in got.stdout, got.stdout + got.stderr
