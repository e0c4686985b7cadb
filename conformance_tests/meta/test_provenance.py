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


# ------------------------------------------------------------------ the site's rule for stamped pages
def _page(docs: Path, rel: str, text: str = "# A page\n\nFigures.\n") -> None:
    (docs / rel).parent.mkdir(parents=True, exist_ok=True)
    (docs / rel).write_text(text, encoding="utf-8")


def _json(path: Path, data: dict) -> None:
    import json

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data), encoding="utf-8")


def test_a_stamped_page_without_a_clean_stamp_stops_the_site_build(tmp_path):
    site = pytest.importorskip("tools.site.provenance")
    docs = tmp_path / "docs"
    clean, dirty = "0123456789abcdef0123456789abcdef01234567", "0123456789abcdef0123456789abcdef01234567+dirty"
    _page(docs, "results/ppo/results.md")
    with pytest.raises(site.ProvenanceError,
                       match=r"results/ppo/results.md: no provenance.*python -m tools\.experiments\.ppo_curves"):
        site.provenance_markdown(docs, "results/ppo/results.md", "# A page\n")
    _json(docs / "results/ppo/provenance.json", {"commit": dirty, "modified": ["reference_impl/ppo/losses.py"]})
    with pytest.raises(site.ProvenanceError, match=r"uncommitted code changes: reference_impl/ppo/losses.py"):
        site.provenance_markdown(docs, "results/ppo/results.md", "# A page\n")
    _json(docs / "results/ppo/provenance.json", {"commit": clean, "date": "d", "command": "c", "regenerate": "r"})
    md = site.provenance_markdown(docs, "results/ppo/results.md", "# A page\n")
    # the regenerate command is the one of the stamp's commit (scripts move; an old page keeps its old command)
    assert clean in md and "Regenerate from scratch (at commit `0123456`): `r`" in md
    # an audit's checklist takes the stamp of the report beside it; tree_commit names the tree that ran
    _page(docs, "performance/raw/audit_x_checklist.md")
    _json(docs / "performance/raw/audit_x.json", {"run_info": {"rlconform_commit": dirty, "tree_commit": clean[:7]}})
    assert site.page_stamp(docs, "performance/raw/audit_x_checklist.md", "")[0]["commit"] == clean[:7]
    # a finding page is reproduced by the matrix run above it
    _page(docs, "audits/findings/lib-bug.md")
    _json(docs / "audits/matrix.json", {"stamp": {"commit": dirty}})
    with pytest.raises(site.ProvenanceError, match=r"audits/findings/lib-bug.md: its stamp \(../matrix.json\)"):
        site.provenance_markdown(docs, "audits/findings/lib-bug.md", "")
    # a page's own block counts, and is checked like the others
    inline = '# P\n\n!!! info "Provenance"\n    Generated now from commit `' + dirty + '` on a machine.\n'
    with pytest.raises(site.ProvenanceError, match="inline"):
        site.provenance_markdown(docs, "mutation/index.md", inline)


def test_every_published_stamped_page_has_a_clean_stamp():
    site = pytest.importorskip("tools.site.provenance")
    docs = Path(__file__).resolve().parents[2] / "docs"
    pages = [p for p in docs.rglob("*.md") if site.stamped_page(str(p.relative_to(docs)))]
    assert len(pages) > 20
    for p in pages:
        site.provenance_markdown(docs, str(p.relative_to(docs)), p.read_text(encoding="utf-8"))
