"""Meta-tests of the documentation site: it builds strictly, every clause has its anchor, the
errata page is complete, and a real browser typesets every formula offline.

The browser check needs Debian's ``chromium`` and the docs extra (``pip install -e '.[docs]'``);
without them these tests fail with a message saying what to install, they never skip.
"""
from __future__ import annotations

import functools
import http.server
import importlib.util
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from rlconform.spec import default_spec

pytestmark = pytest.mark.meta

SCREENSHOT = Path("/tmp/rlconform-site-sac.png")
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
                  "--virtual-time-budget=15000")


def _synthetic_report(path: Path) -> Path:
    """A report in which every clause passed: enough to render the results page without a suite run."""
    import json

    from rlconform.audit import clause_report

    spec = default_spec()
    payload = {"impl": "reference_impl:make", "impl_name": "rlconform-reference", "impl_version": "test",
               "profile": "ci", "device": "cpu",
               "tests": {f"t::{c}": {"clauses": [c], "outcome": "pass"} for c in spec.clauses}}
    path.write_text(json.dumps(clause_report(payload, spec)), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    missing = [m for m in ("mkdocs", "material", "pymdownx", "mathjax") if importlib.util.find_spec(m) is None]
    if missing:
        pytest.fail(f"the docs toolchain is not installed (missing {missing}): pip install -e '.[docs]'")
    tmp = tmp_path_factory.mktemp("site")
    out = tmp / "site"
    cmd = [sys.executable, "-m", "rlconform.site", "build", "--site-dir", str(out),
           "--report", str(_synthetic_report(tmp / "report.json"))]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return out


def _html(site: Path, page: str) -> str:
    return (site / page / "index.html").read_text(encoding="utf-8")


def test_every_clause_is_anchored_on_its_family_page(site):
    spec = default_spec()
    for fam, f in spec.families.items():
        html = _html(site, f"spec/{fam}")
        ids = set(re.findall(r'\sid="([^"]+)"', html))
        missing = [c.id for c in f.clauses if c.id not in ids]
        assert not missing, f"spec/{fam}.md has no anchor for {missing}"


def test_errata_page_lists_every_clause_with_errata(site):
    spec = default_spec()
    html = _html(site, "spec/errata")
    with_errata = [c for c in spec.clauses.values() if c.errata]
    assert with_errata, "the spec records no errata at all"
    missing = [c.id for c in with_errata if f'href="../{c.family}/#{c.id}"' not in html]
    assert not missing, f"the errata page does not list {missing}"


def test_generated_sections_exist(site):
    from conformance_tests import contract

    spec = default_spec()
    for fam in contract.FAMILIES:
        if contract.available(fam):
            html = _html(site, f"contract/{fam}")
            missing = [op for op in contract.op_names(fam) if f'id="{op}"' not in html]
            assert not missing, f"contract/{fam}.md lacks operations {missing}"
    defaults = _html(site, "spec/defaults")
    gates = _html(site, "spec/gates")
    for c in spec.clauses.values():
        page = defaults if c.kind == "default" else gates if c.kind == "gate" else None
        if page is not None:
            assert f"#{c.id}" in page, f"{c.id} ({c.kind}) is missing from its page"
    assert (site / "assets/mathjax/tex-chtml.js").is_file()
    assert list((site / "figures").glob("*.png")), "no figure was drawn"


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def served(site):
    """The built site on a loopback port (fonts and scripts load as they would from a server)."""
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(site)))
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def _chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if not exe:
        pytest.fail("chromium is not installed: apt-get update && apt-get install -y chromium "
                    "(the site's math check needs a real browser)")
    return exe


def _chrome(tmp_path, *args: str) -> subprocess.CompletedProcess:
    exe = _chromium()
    cmd = [exe, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=90)


def test_math_is_typeset_in_a_browser(served, tmp_path):
    """Every display formula of every family page becomes MathJax output, with no TeX error."""
    spec = default_spec()
    for fam, f in spec.families.items():
        dom = _chrome(tmp_path, "--dump-dom", f"{served}/spec/{fam}/").stdout
        n_formulas = sum(1 for c in f.clauses if c.formula)
        typeset = dom.count("<mjx-container")
        assert typeset >= n_formulas, (
            f"spec/{fam}: {typeset} typeset formulas for {n_formulas} clause formulas (MathJax did not run?)")
        errors = re.findall(r'data-mjx-error="([^"]*)"', dom)
        assert not errors, f"spec/{fam}: MathJax reports TeX errors {errors[:5]}"
        # MathJax shows an undefined macro in red rather than failing; its assistive MathML names it.
        undefined = re.findall(r'<mtext mathcolor="red">([^<]*)', dom)
        assert not undefined, f"spec/{fam}: formulas use undefined TeX macros {sorted(set(undefined))}"
    shot = _chrome(tmp_path, "--window-size=1200,1600", f"--screenshot={SCREENSHOT}", f"{served}/spec/sac/")
    assert SCREENSHOT.is_file(), f"chromium wrote no screenshot:\n{shot.stderr[-2000:]}"
