"""The contract pages: each family's Protocol (``conformance_tests/contract/``) rendered as the operations an
implementation may provide, with their signatures and docstrings."""
from __future__ import annotations

import inspect
import re
import sys
import textwrap

from rlconform.spec import default_spec

from conformance_tests import contract
from tools.site.introspect import signature, summary
from tools.site.markup import clause_link, docstring_markdown


def contract_families() -> list[str]:
    return [f for f in contract.FAMILIES if contract.available(f)]


def contract_page(family: str) -> str:
    proto = contract.protocol(family)
    mod = sys.modules[proto.__module__]
    out = [f"# {family} contract", "",
           f"The operations an implementation's `impl.{family}` namespace may provide, rendered from "
           f"`{proto.__module__}.{proto.__name__}`. Each is a plain function (no `self`); an operation you "
           "leave out makes its clauses *not applicable*, never failed.", ""]
    if mod.__doc__:
        out += [_doc_block(mod.__doc__), ""]
    names = contract.op_names(family)
    out += ["| operation | summary |", "|---|---|"]
    out += [f"| [`{n}`](#{n}) | {_summary(getattr(proto, n).__doc__)} |" for n in names]
    out.append("")
    for n in names:
        fn = getattr(proto, n)
        out += [f"## `{n}` {{ #{n} }}", "", "```python", f"def {signature(fn, n)}", "```", "",
                _doc_block(fn.__doc__ or ""), ""]
        out += _outputs_table(f"{family}.{n}")
    return "\n".join(out)


def _outputs_table(op: str) -> list[str]:
    """The op's documented result dict (``OUTPUTS``): each key, the clause that fixes it, whether it is required."""
    documented = contract.outputs(op)
    if not documented:
        return []
    spec, page = default_spec(), f"contract/{op.split('.')[0]}.md"
    rows = [f"| `{key}` | {clause_link(spec, o.clause, page)} | "
            f"{'yes' if o.required else 'no'} | {docstring_markdown(o.meaning, table=True)} |"
            for key, o in documented.items()]
    return [f"Result dict (`OUTPUTS[\"{op.split('.', 1)[1]}\"]`):", "", "| key | clause | required | holds |",
            "|---|---|---|---|", *rows, ""]


def _doc_block(doc: str) -> str:
    """A docstring as Markdown paragraphs (:func:`docstring_markdown`: ``code`` becomes `code`, ``:math:``
    roles inline math; *emphasis* is kept)."""
    out = []
    for p in re.split(r"\n\s*\n", inspect.cleandoc(doc)):
        lines = [ln for ln in p.splitlines() if ln.strip()]
        if not lines:
            continue
        if all(ln[:1].isspace() for ln in lines):  # an indented (reST literal) block
            out.append("```python\n" + textwrap.dedent(p.strip("\n")) + "\n```")
        else:
            out.append(docstring_markdown(re.sub(r"::$", ":", p.rstrip()), emphasis=True))
    return "\n\n".join(out)


# Where a summary may be cut: a space outside ``code``, :math:`roles` and `code`.
_UNCUT = re.compile(r"``.*?``|:[a-z]+:`[^`]*`|`[^`]*`")


def _summary(doc: str | None, limit: int = 150) -> str:
    """The docstring's first paragraph, cut at a word boundary outside code and math."""
    para = summary(doc)
    if len(para) > limit:
        spans = [m.span() for m in _UNCUT.finditer(para)]
        cuts = [i for i, ch in enumerate(para[:limit + 1]) if ch == " " and not any(a < i < b for a, b in spans)]
        para = para[:cuts[-1]] + " …" if cuts else para
    return docstring_markdown(para, emphasis=True, table=True)
