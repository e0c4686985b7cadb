"""Markdown and plain text for the generated pages: escaping prose, relative links, clause ids as links,
and TeX written out as Unicode for the places MathJax does not reach (headings, TOC, search previews)."""
from __future__ import annotations

import html
import os
import re
from typing import Any, Callable

_CLAUSE_RE = re.compile(r"(?<![A-Za-z0-9-])((?:SAC|PPO|ISR|CCAPO)(?:-[A-Z0-9]+)+-\d+)(?![A-Za-z0-9-])")


_CODE_SPAN = re.compile(r"(`+)(.+?)\1")


def _outside_code(s: str, fn: Callable[[str], str]) -> str:
    """Apply ``fn`` to the parts of ``s`` that are not `code spans` (those Markdown escapes itself)."""
    out, pos = [], 0
    for m in _CODE_SPAN.finditer(s):
        out += [fn(s[pos:m.start()]), m.group(0)]
        pos = m.end()
    return "".join(out + [fn(s[pos:])])


def text(s: Any, *, emphasis: bool = False) -> str:
    """Prose as Markdown: whitespace folded, HTML escaped (and ``*`` unless ``emphasis``), `code` kept."""
    s = " ".join(str(s).split())
    def esc(t: str) -> str:
        t = html.escape(t, quote=False).replace("[", r"\[").replace("]", r"\]")  # "[B] (x)" is no link
        return t if emphasis else t.replace("*", r"\*")

    return _outside_code(s, esc)


def cell(s: Any, **kw) -> str:
    """Like :func:`text`, safe inside a table cell."""
    return _outside_code(text(s, **kw), lambda t: t.replace("|", "&#124;"))


def rel(from_page: str, to_page: str) -> str:
    """Relative link from one docs-relative page path to another (MkDocs resolves .md links)."""
    return os.path.relpath(to_page, os.path.dirname(from_page) or ".").replace(os.sep, "/")


def clause_link(spec, cid: str, from_page: str) -> str:
    if cid not in spec.clauses:
        return f"`{cid}`"
    return f"[{cid}]({rel(from_page, f'spec/{spec.clauses[cid].family}.md')}#{cid})"


def linkify(markdown: str, spec, from_page: str) -> str:
    """Turn every known clause id in ``markdown`` (outside code spans) into a link to its anchor."""
    def link(m: re.Match) -> str:
        return clause_link(spec, m.group(1), from_page) if m.group(1) in spec.clauses else m.group(0)

    return _outside_code(markdown, lambda t: _CLAUSE_RE.sub(link, t))


_FENCED = re.compile(r"(^(?:```|~~~).*?^(?:```|~~~)[^\n]*$)", flags=re.M | re.S)


def outside_fences(markdown: str, fn: Callable[[str], str]) -> str:
    """Apply ``fn`` to the parts of a Markdown document outside fenced code blocks."""
    parts = _FENCED.split(markdown)
    return "".join(p if i % 2 else fn(p) for i, p in enumerate(parts))


def linkify_document(markdown: str, spec, from_page: str) -> str:
    """:func:`linkify` for a whole Markdown document: fenced code blocks are left alone."""
    return outside_fences(markdown, lambda p: linkify(p, spec, from_page))


def fmt_value(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(fmt_value(x) for x in v) + "]"
    return str(v)


def indent(block: str, n: int = 4) -> str:
    pad = " " * n
    return "\n".join(pad + ln if ln.strip() else "" for ln in block.splitlines())


# ------------------------------------------------------------------------------- plain text
# TeX control words a reader can read as one character (headings, TOC entries and search previews
# are plain text: MathJax typesets only page bodies).
_TEX_WORDS = {
    "alpha": "α", "beta": "β", "gamma": "γ", "delta": "δ", "epsilon": "ε", "varepsilon": "ε", "zeta": "ζ",
    "eta": "η", "theta": "θ", "kappa": "κ", "lambda": "λ", "mu": "μ", "nu": "ν", "xi": "ξ", "pi": "π",
    "rho": "ρ", "sigma": "σ", "tau": "τ", "phi": "φ", "varphi": "φ", "chi": "χ", "psi": "ψ", "omega": "ω",
    "Gamma": "Γ", "Delta": "Δ", "Theta": "Θ", "Lambda": "Λ", "Pi": "Π", "Sigma": "Σ", "Phi": "Φ", "Psi": "Ψ",
    "Omega": "Ω", "nabla": "∇", "partial": "∂", "sum": "Σ", "prod": "∏", "infty": "∞", "cdot": "·",
    "times": "×", "le": "≤", "leq": "≤", "ge": "≥", "geq": "≥", "ne": "≠", "neq": "≠", "approx": "≈",
    "to": "→", "rightarrow": "→", "leftarrow": "←", "Rightarrow": "⇒", "mapsto": "↦", "in": "∈",
    "notin": "∉", "subseteq": "⊆", "cup": "∪", "cap": "∩", "sim": "~", "mid": "|", "pm": "±", "ll": "≪",
    "gg": "≫", "sqrt": "√", "propto": "∝", "equiv": "≡", "ldots": "…", "cdots": "⋯", "dots": "…",
    "lbrace": "{", "rbrace": "}", "{": "{", "}": "}", "%": "%", "_": "_", "&": "&", "|": "‖",
}
_TEX_SPACE = {",", ";", ":", "!", " ", "quad", "qquad"}
_TEX_DROP = {"left", "right", "big", "Big", "bigg", "Bigg", "bigl", "bigr", "Bigl", "Bigr", "displaystyle",
             "limits", "nolimits"}
_TEX_ARG = re.compile(r"\\(?:text|mathrm|operatorname|mathcal|mathbf|mathbb|mathit|boldsymbol|bm|mathsf|"
                      r"hat|bar|tilde|overline|widehat|vec)\s*\{([^{}]*)\}")
_TEX_FRAC = re.compile(r"\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}")


def tex_to_text(tex: str) -> str:
    """A TeX formula as readable Unicode text (``\\frac{a}{b}`` → ``(a)/(b)``, ``\\alpha`` → ``α``)."""
    s = tex
    for _ in range(4):  # nested \frac and \mathrm{..} unwrap from the inside out
        s = _TEX_ARG.sub(r"\1", s)
        s = _TEX_FRAC.sub(lambda m: f"({m.group(1)})/({m.group(2)})", s)

    def word(m: re.Match) -> str:
        w = m.group(1)
        if w in _TEX_SPACE:
            return " "
        if w in _TEX_DROP:
            return ""
        if w in ("log", "exp", "min", "max", "sin", "cos", "tanh", "sech", "arg", "clamp", "sg", "lim"):
            return w + " "
        return _TEX_WORDS.get(w, w)

    s = re.sub(r"\\([A-Za-z]+|.)", word, s)
    s = re.sub(r"([_^])\{([^{}]*)\}", r"\1\2", s)
    s = s.replace("{", "").replace("}", "").replace("~", " ")
    return " ".join(s.split())


_MATH_SPAN = re.compile(r"\$\$(.+?)\$\$|\$(.+?)\$|\\\((.+?)\\\)|\\\[(.+?)\\\]", re.S)


def math_to_text(s: str) -> str:
    """Every math span (``$..$``, ``$$..$$``, ``\\(..\\)``, ``\\[..\\]``) in ``s`` written out by :func:`tex_to_text`."""
    return _MATH_SPAN.sub(lambda m: tex_to_text(next(g for g in m.groups() if g is not None)), s)


def plain(s: Any) -> str:
    """Markdown/TeX source as plain text: math written out, emphasis markers and HTML tags dropped."""
    s = re.sub(r"</?[A-Za-z][^>]*>", "", str(s))
    s = math_to_text(s)
    s = re.sub(r"(\*\*|__)(.+?)\1", r"\2", s).replace("**", "")
    return " ".join(s.split())


def _plain_fragment(t: str) -> str:
    return re.sub(r"(\*\*|__)(.+?)\1", r"\2", math_to_text(t))


def plain_headings(markdown: str) -> str:
    """Headings (and so the TOC) as plain text on every page: math written out, no emphasis markers."""
    def fix(block: str) -> str:
        return re.sub(r"^(#{1,6}[ \t]+)(.+)$", lambda m: m.group(1) + _outside_code(m.group(2), _plain_fragment),
                      block, flags=re.M)

    return outside_fences(markdown, fix)
