"""Meta-tests of the docs-site switch: without a browser the site tests are left out with the reason, and
RLCONFORM_SITE_TESTS=1 collects them anyway (CI, where a missing toolchain must fail loudly)."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from rlconform import launch

pytestmark = pytest.mark.meta

REPO = Path(__file__).resolve().parents[2]


def _collect(tmp_path, **env):
    bindir = tmp_path / "bin"  # a PATH with this interpreter and no chromium
    bindir.mkdir(exist_ok=True)
    if not (bindir / "python").exists():
        (bindir / "python").symlink_to(sys.executable)
    clean = {k: v for k, v in os.environ.items() if k not in ("RLCONFORM_SITE_TESTS", "PYTEST_XDIST_WORKER")}
    # the folder, as a user collects it (the switch acts while pytest walks it), less every module but
    # test_site.py: importing the other meta-tests (and the libraries they audit) would cost seconds
    others = ["--ignore-glob=*/meta/test_[!s]*.py", "--ignore-glob=*/meta/test_s[!i]*.py",
              "--ignore-glob=*/meta/test_site_*.py"]
    return launch.run([sys.executable, "-m", "pytest", "conformance_tests/meta", *others, "--collect-only",
                       "-q", "-p", "no:cacheprovider"], cwd=REPO, timeout=120, tmp=tmp_path,
                      env={**clean, "PATH": str(bindir), **env})


def test_site_tests_are_left_out_with_the_reason_when_no_browser_is_installed(tmp_path):
    pytest.importorskip("mkdocs")
    proc = _collect(tmp_path)
    assert "test_site.py::" not in proc.stdout, proc.stdout[-2000:]
    assert "docs site tests not collected: they need a browser (Debian's chromium package)" in proc.stdout
    forced = _collect(tmp_path, RLCONFORM_SITE_TESTS="1")
    assert "test_site.py::test_math_is_typeset_in_a_browser" in forced.stdout, forced.stdout[-2000:]
