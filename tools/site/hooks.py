"""The MkDocs hooks named in ``mkdocs.yml`` (``hooks:``), and nothing else: ``on_config`` fills the navigation,
``on_files`` adds the generated pages, figures, MathJax and the CJK font's CSS, ``on_page_markdown`` fills the
markers of hand-written pages and stamps their provenance, ``on_post_build`` cleans the search index and cuts
the CJK font subset. MkDocs loads this file by its path, so the checkout it lies in is put on ``sys.path``
first (``mkdocs build`` run as a script has only its own directory there)."""
from __future__ import annotations

import logging
import sys
from pathlib import Path

_CHECKOUT = str(Path(__file__).resolve().parents[2])
if _CHECKOUT not in sys.path:
    sys.path.insert(0, _CHECKOUT)

from tools.site.documents import DOCUMENTS_PAGE, link_seed_files  # noqa: E402
from tools.site.fonts import CJK_DIR, cjk_css, cjk_source, write_cjk_font  # noqa: E402
from tools.site.markers import fill_markers  # noqa: E402
from tools.site.markup import plain_headings  # noqa: E402
from tools.site.mathjax import mathjax_dir, mathjax_files  # noqa: E402
from tools.site.nav import fill_nav, record_pages  # noqa: E402
from tools.site.pages import generated_pages  # noqa: E402
from tools.site.provenance import (  # noqa: E402
    ProvenanceError,
    insert_after_title,
    provenance_markdown,
    stamped_page,
)
from tools.site.search import clean_search_index  # noqa: E402


def on_config(config, **kwargs):
    """Fill the nav sections left empty in mkdocs.yml from what exists at build time."""
    cjk_source()  # fail before the build, not after it, when no CJK font can be subset
    quiet_jieba()
    config["nav"] = fill_nav(config["nav"], Path(config["docs_dir"]))
    return config


def quiet_jieba() -> None:
    """The search plugin's Chinese segmenter logs its dictionary loading at DEBUG to stderr; the build log
    shows warnings only. (jieba sets its own level when imported, so it is imported here first.)"""
    try:
        import jieba  # optional: the docs extra
    except ImportError:
        return
    jieba.setLogLevel(logging.WARNING)


def on_files(files, config, **kwargs):
    from mkdocs.structure.files import File

    pages, replaced = generated_pages(Path(config["docs_dir"]))
    for uri in replaced:
        f = files.get_file_from_path(uri)
        if f is not None:
            files.remove(f)
    for uri, content in pages.items():
        old = files.get_file_from_path(uri)
        if old is not None:  # a committed copy of a generated page would be written twice: ours wins
            files.remove(old)
        files.append(File.generated(config, uri, content=content))
    for uri, path in mathjax_files(mathjax_dir()):
        files.append(File.generated(config, uri, abs_src_path=str(path)))
    files.append(File.generated(config, f"{CJK_DIR}/cjk.css", content=cjk_css()))
    record_pages({f.src_uri for f in files})
    return files


def on_page_markdown(markdown, page, config, files, **kwargs):
    src = page.file.src_uri
    markdown = plain_headings(fill_markers(markdown))
    if src != DOCUMENTS_PAGE:
        markdown = link_seed_files(markdown, src)
    if stamped_page(src):
        try:
            block = provenance_markdown(Path(config["docs_dir"]), src, markdown)
        except ProvenanceError as e:  # a published figure must trace to a clean commit
            from mkdocs.exceptions import PluginError

            raise PluginError(str(e)) from None
        if block:
            markdown = insert_after_title(markdown, block)
    return markdown


def on_post_build(config, **kwargs):
    """After every page is written: the search previews made plain, then the CJK font subset to them."""
    site_dir = Path(config["site_dir"])
    clean_search_index(site_dir)
    write_cjk_font(site_dir)
