"""Meta-tests of the documentation site: it builds strictly, every clause has its anchor, the
errata page is complete, and a real browser typesets every formula offline.

Also, as a reader meets the site: headings, TOC and search previews are plain text (no raw TeX or
Markdown); every citation names and links its source document (no seed file hashes); spec pages follow
the document's section order; Chinese renders from the shipped subset font on a machine with no CJK
font (Chromium restricted to DejaVu through fontconfig); display math fits a 390 px phone by scrolling;
results and audit pages carry a provenance stamp; the home page links every generated page.

The browser checks need Debian's ``chromium`` and ``fonts-noto-cjk`` (the font the build subsets) and
the docs extra (``pip install -e '.[docs]'``); without them these tests fail with a message saying what
to install, they never skip.
"""
from __future__ import annotations

import contextlib
import functools
import html as html_lib
import http.server
import importlib.util
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from rlconform.audit import clause_report
from rlconform.spec import default_spec

from conformance_tests import contract
from conformance_tests.meta.run_once import once_per_run

pytestmark = [pytest.mark.meta, pytest.mark.long]

# RLCONFORM_SITE_SHOTS=DIR: the browser tests also save what they probed as PNGs there, for a person to
# look at (a second Chromium launch per probe, so off by default).
SHOTS = os.environ.get("RLCONFORM_SITE_SHOTS")
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars")
# Virtual time (it stands still while fetches are pending) that Chromium lets a page run before dumping
# or shooting it: this much for each page it loads, so one launch probing many pages waits for all.
VIRTUAL_MS_PER_PAGE = 15000


def _synthetic_report(path: Path) -> Path:
    """A report in which every clause passed: enough to render the results page without a suite run."""
    import json

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

    def build(tmp: Path) -> Path:
        out = tmp / "site"
        cmd = [sys.executable, "-m", "tools.site", "build", "--site-dir", str(out),
               "--report", str(_synthetic_report(tmp / "report.json"))]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, cwd=REPO)  # tools/ is the checkout's
        assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
        return out
    return once_per_run(tmp_path_factory, "site", build)  # one build for all workers


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


def _chrome(tmp_path, *args: str, pages: int = 1, env: dict | None = None) -> subprocess.CompletedProcess:
    """One headless Chromium launch with ``args``, given virtual time for ``pages`` pages to settle."""
    cmd = [_chromium(), *CHROMIUM_FLAGS, f"--virtual-time-budget={VIRTUAL_MS_PER_PAGE * pages}",
           f"--user-data-dir={tmp_path / 'profile'}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60 + 30 * pages,
                          env=dict(os.environ, **(env or {})))


@pytest.fixture(scope="module")
def spec_pages_on_a_phone(site, served, tmp_path_factory) -> dict[str, dict]:
    """Every family's spec page, typeset at phone width (390 px) in ONE Chromium launch (seconds each): its
    rendered DOM after MathJax ran, and :data:`PHONE_CHECK`'s findings. Typesetting does not depend on the
    width, so the math test reads the same pages."""
    check = f"async (w, d) => Object.assign(await ({PHONE_CHECK})(w, d), {{dom: d.documentElement.outerHTML}})"
    return _probe(site, served, tmp_path_factory.mktemp("phone"), [f"spec/{fam}/" for fam in default_spec().families],
                  check, width=390, shot=("spec/isreshape/", "rlconform-site-isreshape-390.png"))


def test_math_is_typeset_in_a_browser(served, spec_pages_on_a_phone, tmp_path):
    """Every display formula of every family page becomes MathJax output, with no TeX error."""
    spec = default_spec()
    doms = spec_pages_on_a_phone
    for fam, f in spec.families.items():
        dom = doms[f"spec/{fam}/"]["dom"]
        n_formulas = sum(1 for c in f.clauses if c.formula)
        typeset = dom.count("<mjx-container")
        assert typeset >= n_formulas, (
            f"spec/{fam}: {typeset} typeset formulas for {n_formulas} clause formulas (MathJax did not run?)")
        errors = re.findall(r'data-mjx-error="([^"]*)"', dom)
        assert not errors, f"spec/{fam}: MathJax reports TeX errors {errors[:5]}"
        # MathJax shows an undefined macro in red rather than failing; its assistive MathML names it.
        undefined = re.findall(r'<mtext mathcolor="red">([^<]*)', dom)
        assert not undefined, f"spec/{fam}: formulas use undefined TeX macros {sorted(set(undefined))}"
    if SHOTS:
        png = Path(SHOTS) / "rlconform-site-sac.png"
        shot = _chrome(tmp_path, "--window-size=1200,1600", f"--screenshot={png}", f"{served}/spec/sac/")
        assert png.is_file(), f"chromium wrote no screenshot:\n{shot.stderr[-2000:]}"


# ------------------------------------------------------------------------------ reading the HTML
REPO = Path(__file__).resolve().parents[2]
SEED_FILE = re.compile(r"\d{3}_[0-9a-f]{16}\.txt")
VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


def _visible_text(page_html: str, *, skip_math: bool = True) -> list[str]:
    """Text nodes a reader sees as text: outside code, scripts, styles and (optionally) arithmatex
    elements, whose TeX MathJax replaces. Includes <title> and the navigation/TOC."""
    from html.parser import HTMLParser

    class P(HTMLParser):
        def __init__(self):
            super().__init__(convert_charrefs=True)
            self.stack: list[tuple[str, bool]] = []
            self.out: list[str] = []

        def handle_starttag(self, tag, attrs):
            if tag in VOID:
                return
            classes = (dict(attrs).get("class") or "").split()
            hidden = tag in ("code", "pre", "script", "style", "svg") or (skip_math and "arithmatex" in classes)
            self.stack.append((tag, hidden))

        def handle_endtag(self, tag):
            for i in range(len(self.stack) - 1, -1, -1):
                if self.stack[i][0] == tag:
                    del self.stack[i:]
                    break

        def handle_data(self, data):
            if data.strip() and not any(h for _, h in self.stack):
                self.out.append(data)

    p = P()
    p.feed(page_html)
    return p.out


def _pages(site: Path) -> list[Path]:
    """The built pages (not the browser tests' probe pages, which other workers may be writing)."""
    return sorted(p for p in site.rglob("*.html")
                  if "assets" not in p.relative_to(site).parts and not p.name.startswith("_probe_"))


# Formula source a reader must never meet as text: a reST role, a TeX control word, a TeX sub- or superscript
# group. A formula is typeset (arithmatex, MathJax) or written out in Unicode (headings, TOC, search). A Python
# escape such as "\ufffd" in quoted source (the mutation page) is not a control word.
RAW_TEX = re.compile(r":math:|\\(?!u[0-9A-Fa-f]{4}(?![0-9A-Za-z]))[A-Za-z]{2,}|[_^]\{")


@pytest.mark.parametrize("text, formula", [
    ("\\frac{a}{b}", True), ("\\alpha", True), ("\\underline{x}", True), ("x_{t}", True), (":math:`x`", True),
    ('specials = ("\\x00", "\\ufffd", "\\n")', False),  # Python escapes in quoted source (the mutation page)
    ("\\ufffdx", True),  # not an escape: a control word that happens to start with u
])
def test_formula_source_is_told_from_a_python_escape(text, formula):
    assert bool(RAW_TEX.search(text)) is formula


def _is_python_signature(code: str) -> bool:
    """``name(a: T, *, k=1) -> R``: a signature the spec pages show as code, Python rather than prose."""
    import ast

    if not re.match(r"[A-Za-z_]\w*\(", code.strip()):
        return False
    try:
        ast.parse(f"def {code.strip()}: pass")
    except SyntaxError:
        return False
    return True


def _reader_text(page_html: str) -> list[str]:
    """Text nodes a reader reads, inline ``<code>`` included (one string per code element, Python signatures
    left out), outside ``<pre>`` blocks, scripts, styles, SVG and arithmatex elements (MathJax typesets
    those). Includes <title> and the navigation/TOC."""
    from html.parser import HTMLParser

    class P(HTMLParser):
        def __init__(self):
            super().__init__(convert_charrefs=True)
            self.stack: list[tuple[str, bool]] = []
            self.out: list[str] = []
            self.code: list[str] | None = None

        def handle_starttag(self, tag, attrs):
            if tag in VOID:
                return
            classes = (dict(attrs).get("class") or "").split()
            hidden = tag in ("pre", "script", "style", "svg") or "arithmatex" in classes
            self.stack.append((tag, hidden))
            if tag == "code" and self.code is None and not any(h for _, h in self.stack):
                self.code = []

        def handle_endtag(self, tag):
            for i in range(len(self.stack) - 1, -1, -1):
                if self.stack[i][0] == tag:
                    del self.stack[i:]
                    break
            if self.code is not None and not any(t == "code" for t, _ in self.stack):
                code, self.code = "".join(self.code), None
                if code.strip() and not _is_python_signature(code):
                    self.out.append(code)

        def handle_data(self, data):
            if any(h for _, h in self.stack):
                return
            if self.code is not None:
                self.code.append(data)
            elif data.strip():
                self.out.append(data)

    p = P()
    p.feed(page_html)
    return p.out


def test_visible_text_has_no_raw_tex_or_markdown(site):
    """No ``\\(``, ``$$`` or ``**`` survives into text a reader sees (headings, TOC, titles, bodies); and on
    every page no formula source either, inline code included (not ``<pre>`` blocks, not Python signatures):
    no ``:math:`` role, no TeX control word (``\\mathrm``), no TeX group (``_{``, ``^{``)."""
    bad, tex = {}, {}
    for page in _pages(site):
        rel, src = str(page.relative_to(site)), page.read_text(encoding="utf-8")
        for t in _visible_text(src):
            hits = [m for m in ("\\(", "$$", "**") if m in t]
            if hits:
                bad.setdefault(rel, []).append((hits, t.strip()[:80]))
        for t in _reader_text(src):
            tex.setdefault(rel, []).extend(" ".join(t[max(0, m.start() - 40):m.end() + 30].split())
                                          for m in RAW_TEX.finditer(t))
    assert not bad, f"raw markup in rendered text: {dict(list(bad.items())[:6])}"
    tex = dict(sorted(((k, v) for k, v in tex.items() if v), key=lambda kv: -len(kv[1])))
    assert not tex, (f"formula source shown as text: {sum(map(len, tex.values()))} hits on {len(tex)} pages: "
                     + "; ".join(f"{k} ({len(v)}): {v[:2]}" for k, v in list(tex.items())[:8]))


def test_headings_and_toc_are_plain_text(site):
    """Headings hold no math markup (TOC entries are made from them), on every family page."""
    for fam in default_spec().families:
        page = _html(site, f"spec/{fam}")
        heads = re.findall(r"<h[1-6][^>]*>(.*?)</h[1-6]>", page, flags=re.S)
        assert heads
        mathy = [h for h in heads if "arithmatex" in h or "<strong>" in h]
        assert not mathy, f"spec/{fam}: headings with math or emphasis markup: {mathy[:3]}"


def _documents() -> dict[str, dict]:
    import yaml

    raw = yaml.safe_load((REPO / "docs" / "assets" / "documents.yaml").read_text(encoding="utf-8"))
    return {d["seed"]: d for d in raw["documents"]}


def test_documents_page_lists_every_seed(site):
    spec = default_spec()
    docs = _documents()
    cited = {c.source["seed"] for c in spec.clauses.values()} | {f.document["seed"] for f in spec.families.values()}
    assert cited <= set(docs), f"seeds cited by the spec but missing from documents.yaml: {cited - set(docs)}"
    page = _html(site, "spec/documents")
    text = " ".join(_visible_text(page))
    for seed, d in docs.items():
        assert f'id="doc-{seed[:3]}"' in page, f"no anchor for {seed}"
        for field in ("version", "role"):
            assert str(d[field]) in text, f"{seed}: {field} {d[field]!r} is not shown"
        assert str(d.get("date") or "undated") in text
        # every heading of the document has its anchor, in the document's own order
        pos = [page.find(f'id="doc-{seed[:3]}-s{i}"') for i in range(len(d["sections"]))]
        assert -1 not in pos and pos == sorted(pos), f"{seed}: section anchors missing or out of order"
    roles = {d["role"] for d in docs.values()}
    assert {"normative", "superseded"} <= roles


def test_citations_name_and_link_their_document(site):
    """Outside the Documents page no seed file hash is visible, and every clause's Source links to the
    Documents page's anchor of that very section."""
    shown = {}
    for page in _pages(site):
        rel = str(page.relative_to(site))
        if rel.startswith("spec/documents/"):
            continue
        hits = SEED_FILE.findall(" ".join(_visible_text(page.read_text(encoding="utf-8"), skip_math=False)))
        if hits:
            shown[rel] = sorted(set(hits))
    assert not shown, f"seed file names shown to readers: {shown}"
    spec, docs = default_spec(), _documents()
    for fam, f in spec.families.items():
        page = _html(site, f"spec/{fam}")
        for c in f.clauses:
            i = docs[c.source["seed"]]["sections"].index(c.source["section"])
            start = page.index(f'id="{c.id}"')
            block = page[start:page.find("<h3", start + 10) if page.find("<h3", start + 10) > 0 else None]
            want = f'href="../documents/#doc-{c.source["seed"][:3]}-s{i}"'
            assert want in block, f"{c.id}: its Source does not link {want}"
    errata = " ".join(_visible_text(_html(site, "spec/errata")))
    assert not re.search(r"\b\d{3} §", errata), "the errata page still cites a bare document number"
    for c in spec.clauses.values():
        if c.errata:
            assert docs[c.source["seed"]]["short"] in errata, f"errata of {c.id} does not name its document"


def test_spec_pages_follow_the_documents_section_order(site):
    spec, docs = default_spec(), _documents()
    for fam, f in spec.families.items():
        page = _html(site, f"spec/{fam}")
        main = f.document["seed"]
        order = []
        for c in f.clauses:  # each clause's position on the page, with its section's index in the document
            if c.source["seed"] == main:
                order.append((page.index(f'id="{c.id}"'), docs[main]["sections"].index(c.source["section"])))
        sections_in_page_order = [s for _, s in sorted(order)]
        assert sections_in_page_order == sorted(sections_in_page_order), \
            f"spec/{fam}: clauses are not in the document's section order"


def test_conventions_page_lists_each_convention(site):
    spec = default_spec()
    convs = getattr(spec, "conventions", {}) or {}
    page = _html(site, "spec/conventions")
    for cid, cv in convs.items():
        assert f'id="{cid}"' in page, f"convention {cid} has no anchor"
        for c in cv.clauses:
            fam_page = _html(site, f"spec/{spec.clauses[c].family}")
            start = fam_page.index(f'id="{c}"')
            assert f"conventions/#{cid}" in fam_page[start:start + 20000], f"{c} does not link convention {cid}"


def test_search_index_is_plain_text_and_segments_chinese(site):
    index = json.loads((site / "search" / "search_index.json").read_text(encoding="utf-8"))
    raw = [d["location"] for d in index["docs"] if re.search(r"\\\(|\\\[|\$\$", d["title"] + d["text"])]
    assert not raw, f"search previews with raw TeX: {raw[:5]}"
    # Nor any formula source in an entry's title or text (code included): math is written out in Unicode.
    tex = {d["location"]: [" ".join(t[max(0, m.start() - 40):m.end() + 30].split()) for m in ms]
           for d in index["docs"] for t in [d["title"] + " | " + d["text"]] if (ms := list(RAW_TEX.finditer(t)))}
    assert not tex, (f"formula source in {len(tex)} of {len(index['docs'])} search entries: "
                     + "; ".join(f"{k}: {v[:2]}" for k, v in list(tex.items())[:6]))
    assert "\\u200b" in index["config"]["separator"] or "\u200b" in index["config"]["separator"], \
        "the search separator does not split at U+200B, so jieba's segments are not separate tokens"
    han = [d for d in index["docs"] if re.search(r"[\u4e00-\u9fff]{2}", d["text"])]
    assert han, "no Chinese text in the index"
    assert any("\u200b" in d["text"] for d in han), "Chinese text was not segmented (is jieba installed?)"
    # The theme's search splits indexed text at the separator and matches a Chinese query against the
    # resulting terms: a word of a seed heading must come out as a term of the page citing it.
    sep = re.compile(index["config"]["separator"])
    terms_by_page: dict[str, set[str]] = {}
    for d in index["docs"]:
        terms_by_page.setdefault(d["location"].split("#")[0], set()).update(sep.split(d["title"] + " " + d["text"]))
    assert "奖励" in terms_by_page.get("spec/sac/", set()), "the Chinese word 奖励 (reward) is not a search term of spec/sac"


def test_cjk_font_covers_every_character_on_the_site(site):
    """The shipped font has a glyph for every CJK character in the built pages (read with fontTools)."""
    from fontTools.ttLib import TTFont

    fonts = list((site / "assets" / "fonts").glob("rlconform-cjk.woff*"))
    assert len(fonts) == 1, f"expected one subset font, found {fonts}"
    cmap = TTFont(str(fonts[0])).getBestCmap()
    cjk = re.compile(r"[\u3000-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uff00-\uffef]")
    used = set()
    for page in _pages(site):
        used.update(cjk.findall(page.read_text(encoding="utf-8")))
    assert len(used) > 100, f"only {len(used)} CJK characters found: the seed titles are missing?"
    missing = sorted(ch for ch in used if ord(ch) not in cmap)
    assert not missing, f"the subset font lacks {''.join(missing[:40])}"
    assert fonts[0].stat().st_size < 2_000_000, "the font is not a subset"
    css = (site / "assets" / "fonts" / "cjk.css").read_text(encoding="utf-8")
    assert fonts[0].name in css and "@font-face" in css
    assert 'href="../../assets/fonts/cjk.css"' in _html(site, "spec/sac")


def test_results_and_audit_pages_carry_provenance(site):
    pages = [p for p in _pages(site) if str(p.relative_to(site)).startswith(("results/", "audits/", "performance/",
                                                                             "mutation/"))
             and "/_" not in str(p.relative_to(site))]  # audits/_research: working notes, not generated
    assert pages
    for page in pages:
        raw = page.read_text(encoding="utf-8")
        text = " ".join(_visible_text(raw))
        assert "Provenance" in text, f"{page.relative_to(site)} has no provenance block"
        if "stamp lies beside this page" not in text:
            assert re.search(r"from commit <code>[0-9a-f]{7,}", raw), f"{page.relative_to(site)}: stamp without a commit"
        else:
            assert "Regenerate it with" in text or "not recorded" in text
    # raw data linked from a results page ships with the site
    for page in pages:
        for href in re.findall(r'href="([^"#]+\.jsonl)"', page.read_text(encoding="utf-8")):
            assert (page.parent / href).resolve().is_file(), f"{page.relative_to(site)} links missing {href}"
    assert re.search(r"from commit <code>[0-9a-f]{7,}", _html(site, "conformance/reference")), "reference page: no commit"
    stamped = [p for p in pages if "stamp lies beside this page" not in p.read_text(encoding="utf-8")]
    for fam in ("ppo", "isreshape", "ccapo"):  # the results this suite generates are stamped, not just flagged
        assert any(str(p.relative_to(site)).startswith(f"results/{fam}/results/") for p in stamped), f"results/{fam} unstamped"


def test_every_published_page_is_reachable_from_the_home_page(site):
    """Following links (the navigation's included) from the home page reaches every built page: a page
    nobody can find is either linked or left out of the site."""
    from urllib.parse import urldefrag, urljoin

    pages = {p for p in _pages(site) if p.name != "404.html"}
    seen, todo = {site / "index.html"}, [site / "index.html"]
    while todo:
        page = todo.pop()
        url = "file://" + str(page)
        for href in re.findall(r'href="([^"]+)"', page.read_text(encoding="utf-8")):
            target = urldefrag(urljoin(url, html_lib.unescape(href)))[0]
            if not target.startswith("file://"):
                continue
            path = Path(target[len("file://"):])
            path = path / "index.html" if path.is_dir() else path
            if path in pages and path not in seen:
                seen.add(path)
                todo.append(path)
    orphans = sorted(str(p.relative_to(site)) for p in pages - seen)
    assert not orphans, f"{len(orphans)} built page(s) no link reaches: {orphans[:10]}"


def test_home_page_links_every_generated_page(site):
    home = _html(site, "")
    spec = default_spec()
    want = ["spec/documents/", "spec/conventions/", "spec/traceability/", "spec/errata/", "figures/",
            "conformance/reference/"] + [f"spec/{f}/" for f in spec.families]
    docs = REPO / "docs"

    def url(md: Path) -> str:  # MkDocs' directory URL of a source page
        rel = md.relative_to(docs).with_suffix("")
        return (str(rel.parent) if rel.name == "index" else str(rel)) + "/"

    pages = [*docs.glob("results/**/results.md"), *docs.glob("audits/matrix.md"), *docs.glob("audits/findings/*.md"),
             *docs.glob("performance/**/*.md"), *docs.glob("mutation/**/*.md")]
    # pages of the source tree that this build rendered (others may be adding pages while it runs)
    want += [url(p) for p in pages if not p.name.startswith("_") and (site / url(p) / "index.html").is_file()]
    missing = [w for w in want if f'href="{w}"' not in home]
    assert not missing, f"the home page does not link {missing}"


# ------------------------------------------------------------------------------ browser probes
# Chromium sees only DejaVu: the page's Chinese must come from the shipped font, and a missing glyph
# shows as a box, exactly as on a reader's machine without CJK fonts.
FONTS_CONF = """<?xml version="1.0"?>
<!DOCTYPE fontconfig SYSTEM "fonts.dtd">
<fontconfig><dir>/usr/share/fonts/truetype/dejavu</dir><cachedir>{cache}</cachedir></fontconfig>
"""

# One frame per target, all of the same width. Each frame's check runs once the frame has loaded and
# MathJax (asynchronous) has typeset it and its fonts are ready; the results, in the order of the
# targets, replace "pending" only when every frame is done. Listeners are attached before a frame's
# src is set, so no load event is missed.
PROBE = """<!doctype html><meta charset="utf-8"><body style="margin:0">
<pre id="out">pending</pre>
<script>
const check = {check};
const probe = target => new Promise(resolve => {{
  const f = document.createElement("iframe");
  f.style.cssText = "display:block;width:{width}px;height:900px;border:0";
  f.addEventListener("load", async () => {{
    const w = f.contentWindow, d = f.contentDocument;
    try {{
      if (w.MathJax && w.MathJax.startup) await w.MathJax.startup.promise;
      await d.fonts.ready;
      resolve(await check(w, d));
    }} catch (e) {{ resolve({{error: String(e)}}); }}
  }});
  f.src = target;
  document.body.insertBefore(f, document.getElementById("out"));
}});
Promise.all({targets}.map(probe)).then(results => {{
  document.getElementById("out").textContent = JSON.stringify(results);
}});
</script>"""

# For each CJK character of the page's headings, TOC and nav: its bitmap with the page's own font stack
# and with the system fonts alone. Under the DejaVu-only fontconfig the system renders every CJK
# character as the same box; a character drawn from the shipped font is inked and unlike that box.
TOFU_CHECK = """async (w, d) => {
  const chars = [...new Set([...[...d.querySelectorAll("h1, h2, h3, .md-nav__link, title, td")]
      .map(e => e.textContent).join("")].filter(c => /[\\u3000-\\u30ff\\u3400-\\u9fff\\uff00-\\uffef]/.test(c)))];
  const family = w.getComputedStyle(d.querySelector("h1")).fontFamily;
  await d.fonts.load('32px "rlconform CJK"', chars.join(""));
  const cv = d.createElement("canvas"); cv.width = 40; cv.height = 40;
  const ctx = cv.getContext("2d", {willReadFrequently: true});
  const draw = (ch, fam) => { ctx.clearRect(0, 0, 40, 40); ctx.font = "32px " + fam; ctx.fillStyle = "#000";
    ctx.fillText(ch, 2, 32); const px = ctx.getImageData(0, 0, 40, 40).data; let s = "", ink = 0;
    for (let i = 3; i < px.length; i += 4) { s += px[i] > 127 ? "1" : "0"; ink += px[i] > 127; } return [s, ink]; };
  const tofu = draw("\\u9fa5", "sans-serif")[0];
  const system = chars.map(c => draw(c, "sans-serif")[0]);
  const shipped = chars.map(c => draw(c, family));
  return {family, n: chars.length,
    systemBoxes: system.filter(b => b === tofu).length,
    boxes: chars.filter((c, i) => shipped[i][0] === tofu),
    blank: chars.filter((c, i) => shipped[i][1] === 0),
    distinct: new Set(shipped.map(b => b[0])).size,
    loaded: d.fonts.check('32px "rlconform CJK"', chars.join(""))};
}"""

# At phone width every display formula stays inside the viewport; one wider than its box scrolls.
PHONE_CHECK = """async (w, d) => {
  const vw = d.documentElement.clientWidth, out = [];
  // phones draw scrollbars only during a scroll: a box that scrolls shows edge shadows instead
  const shadowed = cs => cs.backgroundAttachment.includes("local") && cs.backgroundImage.includes("gradient");
  let wide = 0;
  for (const m of d.querySelectorAll('mjx-container[display="true"]')) {
    const r = m.getBoundingClientRect(), box = m.parentElement, what = box.textContent.slice(0, 40);
    const over = [m, box].filter(e => e.scrollWidth > e.clientWidth + 1);
    if (over.length) {
      wide += 1;
      const scroller = over.find(e => ["auto", "scroll"].includes(w.getComputedStyle(e).overflowX));
      if (!scroller) out.push("cut: " + what);
      else if (!shadowed(w.getComputedStyle(scroller))) out.push("scrolls with no sign that it does: " + what);
    }
    if (r.right > vw + 1 || r.left < -1) out.push("outside the viewport: " + what);
  }
  // what sticks out of the viewport furthest, when the page scrolls sideways
  let widest = null, right = vw;
  for (const e of d.querySelectorAll("article *")) {
    const r = e.getBoundingClientRect();
    if (r.right > right + 1) { right = r.right; widest = `<${e.tagName.toLowerCase()}> ${e.textContent.slice(0, 60)}`; }
  }
  return {vw, pageWidth: d.documentElement.scrollWidth, formulas: d.querySelectorAll('mjx-container[display="true"]').length,
          wide, problems: out, widest};
}"""


_PROBE_IDS = itertools.count()


@contextlib.contextmanager
def _probe_page(site: Path, targets: list[str], check: str, width: int):
    """The name of a probe page written into the served site for the ``with`` block. Named by this
    process and probe: other xdist workers may be probing the same site directory at the same time."""
    page = site / f"_probe_{os.getpid()}_{next(_PROBE_IDS)}.html"
    page.write_text(PROBE.format(targets=json.dumps(targets), width=width, check=check), encoding="utf-8")
    try:
        yield page.name
    finally:
        page.unlink()


def _probe(site: Path, served: str, tmp_path: Path, targets: list[str], check: str, *, width: int = 1200,
           env: dict | None = None, shot: tuple[str, Path] | None = None) -> dict[str, dict]:
    """Load every one of ``targets`` in an iframe of ``width`` px and run ``check`` in each, all in one
    Chromium launch; return each target's JSON result. ``shot=(target, name)`` also saves a screenshot of
    that target's probe as $RLCONFORM_SITE_SHOTS/name when that is set (a second launch: Chromium cannot
    both dump and shoot)."""
    window = f"--window-size={width + 40},1000"
    with _probe_page(site, targets, check, width) as name:
        proc = _chrome(tmp_path, window, "--dump-dom", f"{served}/{name}", pages=len(targets), env=env)
    if shot is not None and SHOTS:
        with _probe_page(site, [shot[0]], check, width) as name:
            _chrome(tmp_path, window, f"--screenshot={Path(SHOTS) / shot[1]}", f"{served}/{name}", env=env)
    m = re.search(r'<pre id="out">(.*?)</pre>', proc.stdout, flags=re.S)
    assert m, f"the probe page did not render:\n{proc.stderr[-2000:]}"
    if m.group(1) == "pending":
        results = [{"error": "pending (the probe did not finish within its virtual time)"}] * len(targets)
    else:
        results = json.loads(html_lib.unescape(m.group(1)))
    for target, result in zip(targets, results, strict=True):
        assert "error" not in result, f"probe of {target} failed: {result}"
    return dict(zip(targets, results))


@pytest.fixture(scope="module")
def no_cjk_env(tmp_path_factory) -> dict:
    if not Path("/usr/share/fonts/truetype/dejavu").is_dir():
        pytest.fail("fonts-dejavu-core is not installed (the no-CJK browser check renders with DejaVu only)")
    d = tmp_path_factory.mktemp("fontconfig")
    (d / "fonts.conf").write_text(FONTS_CONF.format(cache=d / "cache"), encoding="utf-8")
    return {"FONTCONFIG_FILE": str(d / "fonts.conf")}


def test_chinese_renders_from_the_shipped_font_without_cjk_fonts(site, served, tmp_path, no_cjk_env):
    results = _probe(site, served, tmp_path, ["spec/documents/", "spec/ccapo/", "./"], TOFU_CHECK, env=no_cjk_env,
                     shot=("spec/documents/", "rlconform-site-cjk.png"))
    for target, r in results.items():
        assert r["n"] > 10, f"{target}: only {r['n']} CJK characters in the headings: {r}"
        # the control: without the shipped font this machine draws every one of them as the same box
        assert r["systemBoxes"] == r["n"], f"{target}: the browser found a CJK font besides ours ({r})"
        assert "rlconform CJK" in r["family"] and r["loaded"], f"{target}: the page does not use the font: {r}"
        assert not r["boxes"] and not r["blank"], f"{target}: missing glyphs {r['boxes'][:20]} {r['blank'][:20]}"
        assert r["distinct"] == r["n"], f"{target}: two different characters render the same: {r}"


# At phone width: each plot on a page keeps at least its drawn size (a 2000 px figure shrunk to a 390 px
# column has 2 px labels), and one wider than the column scrolls in its own box that says so (phones
# draw scrollbars only during a scroll).
FIGURE_CHECK = """async (w, d) => {
  const vw = d.documentElement.clientWidth, out = [];
  const imgs = [...d.querySelectorAll('article img')];
  await Promise.all(imgs.map(i => i.complete ? null : new Promise(r => { i.onload = i.onerror = r; })));
  for (const img of imgs) {
    const name = img.getAttribute("src"), shown = img.getBoundingClientRect().width, box = img.parentElement;
    if (!img.naturalWidth) { out.push("not loaded: " + name); continue; }
    if (shown < img.naturalWidth - 1) out.push(`${name}: shown ${Math.round(shown)} px wide, drawn ${img.naturalWidth} px`);
    if (box.scrollWidth > box.clientWidth + 1) {
      if (!["auto", "scroll"].includes(w.getComputedStyle(box).overflowX)) out.push(`${name}: cut at the column`);
      else if (!/scroll/.test(w.getComputedStyle(box, "::before").content)) out.push(`${name}: scrolls with no sign that it does`);
    }
  }
  return {vw, pageWidth: d.documentElement.scrollWidth, images: imgs.length, problems: out};
}"""


def _figure_pages() -> list[str]:
    """Every docs page that shows a PNG plot, as its site URL."""
    docs = REPO / "docs"
    out = []
    for md in sorted(docs.rglob("*.md")):
        if re.search(r"!\[[^\]]*\]\([^)]+\.png\)", md.read_text(encoding="utf-8")):
            rel = md.relative_to(docs).with_suffix("")
            out.append((str(rel.parent) if rel.name in ("index", "README") else str(rel)) + "/")
    return out


def test_plots_keep_a_readable_size_on_a_phone(site, served, tmp_path):
    targets = _figure_pages()
    assert len(targets) >= 8, targets  # the results pages with plots
    results = _probe(site, served, tmp_path, targets, FIGURE_CHECK, width=390,
                     shot=("results/sac/results/", "rlconform-site-sac-results-390.png"))
    for target, r in results.items():
        assert r["images"] >= 1, f"{target}: no plot found on the page"
        assert not r["problems"], f"{target} at 390 px: {r['problems'][:5]}"
        assert r["pageWidth"] <= r["vw"] + 1, f"{target}: the page scrolls sideways at 390 px ({r})"


def test_display_math_fits_a_phone(spec_pages_on_a_phone):
    families = default_spec().families
    results = spec_pages_on_a_phone
    for fam, f in families.items():
        r = results[f"spec/{fam}/"]
        assert r["vw"] <= 390 and r["formulas"] >= sum(1 for c in f.clauses if c.formula), r
        assert not r["problems"], f"spec/{fam} at 390 px: {r['problems'][:5]}"
        assert r["pageWidth"] <= r["vw"] + 1, (
            f"spec/{fam}: the page scrolls sideways at 390 px ({r['pageWidth']} px wide): {r['widest']}")
