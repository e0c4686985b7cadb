"""Markdown and plain text for the generated pages: escaping prose, relative links, clause ids as links,
and TeX written out as Unicode for the places MathJax does not reach (headings, TOC, search previews)."""
from __future__ import annotations

import html
import os
import re
from typing import Any, Callable

_CLAUSE_RE = re.compile(r"(?<![A-Za-z0-9-])((?:SAC|PPO|ISR|CCAPO)(?:-[A-Z0-9]+)+-\d+)(?![A-Za-z0-9-])")


_CODE_SPAN = re.compile(r"(`+)(.+?)\1")
# A code span, or inline math as pymdownx.arithmatex (generic, smart dollar) finds it: ``$$..$$``, ``$..$`` with
# no space inside either dollar, ``\(..\)``. Markdown hands math to arithmatex before its own escapes and
# emphasis, so what is between the delimiters must reach it as written (no HTML or Markdown escaping).
_SPAN = re.compile(r"(?P<code>(?P<ticks>`+).+?(?P=ticks))"
                   r"|(?P<math>\$\$.+?\$\$|(?<!\\)\$(?!\s)(?:\\.|[^\\$])+?(?<!\s)\$|\\\((?:\\[^)]|[^\\])+?\\\))")


def _outside_code(s: str, fn: Callable[[str], str]) -> str:
    """Apply ``fn`` to the parts of ``s`` that are not `code spans` (those Markdown escapes itself)."""
    out, pos = [], 0
    for m in _CODE_SPAN.finditer(s):
        out += [fn(s[pos:m.start()]), m.group(0)]
        pos = m.end()
    return "".join(out + [fn(s[pos:])])


def _outside_code_and_math(s: str, fn: Callable[[str], str], math: Callable[[str], str] = str) -> str:
    """Apply ``fn`` to the parts of ``s`` outside code spans and inline math, ``math`` to each math span."""
    out, pos = [], 0
    for m in _SPAN.finditer(s):
        out += [fn(s[pos:m.start()]), m.group(0) if m.group("code") else math(m.group(0))]
        pos = m.end()
    return "".join(out + [fn(s[pos:])])


def text(s: Any, *, emphasis: bool = False) -> str:
    """Prose as Markdown: whitespace folded, HTML escaped (and ``*`` unless ``emphasis``), `code` and inline
    math (``$..$``, ``\\(..\\)``) kept as written."""
    s = " ".join(str(s).split())
    def esc(t: str) -> str:
        t = html.escape(t, quote=False).replace("[", r"\[").replace("]", r"\]")  # "[B] (x)" is no link
        return t if emphasis else t.replace("*", r"\*")

    return _outside_code_and_math(s, esc)


def cell(s: Any, **kw) -> str:
    """Like :func:`text`, safe inside a table cell (a ``|`` in math becomes ``\\vert{}``: the table splits
    cells before arithmatex runs)."""
    return _outside_code_and_math(text(s, **kw), lambda t: t.replace("|", "&#124;"),
                                  lambda m: m.replace("|", r"\vert{}"))


# A reST role: :math:`x`, :func:`name`, :py:class:`~a.b.C` ...
_ROLE = re.compile(r":(?:py:)?([a-z]+):`([^`]+)`")


def docstring_markdown(s: Any, *, emphasis: bool = False, table: bool = False) -> str:
    """Docstring prose (reST) as Markdown: ``:math:`X``` becomes inline math ``$X$`` that arithmatex
    typesets, ````code```` and other roles (``:func:`name```) become `code`; then escaped as :func:`text`
    (as :func:`cell` with ``table``)."""
    def role(m: re.Match) -> str:
        name, body = m.group(1), m.group(2).strip()
        if name == "math":
            return f"${body}$" if "$" not in body else f"\\({body}\\)"
        return f"`{body.lstrip('~').rsplit('.', 1)[-1] if body.startswith('~') else body}`"

    md = _ROLE.sub(role, " ".join(str(s).split())).replace("``", "`")
    return cell(md, emphasis=emphasis) if table else text(md, emphasis=emphasis)


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

    return _outside_code_and_math(markdown, lambda t: _CLAUSE_RE.sub(link, t))


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
    "notin": "∉", "subseteq": "⊆", "cup": "∪", "cap": "∩", "sim": "∼", "mid": "|", "pm": "±", "mp": "∓",
    "ll": "≪", "gg": "≫", "sqrt": "√", "propto": "∝", "equiv": "≡", "ldots": "…", "cdots": "⋯", "dots": "…",
    "ell": "ℓ", "langle": "⟨", "rangle": "⟩", "vert": "|", "lvert": "|", "rvert": "|", "ast": "*", "star": "⋆",
    "lbrace": "\x01", "rbrace": "\x02", "{": "\x01", "}": "\x02", "%": "%", "_": "_", "&": "&", "|": "‖",
    "$": "$", "#": "#",
}
_TEX_SPACE = {",", ";", ":", "!", " ", "quad", "qquad"}
# Sizes read as nothing; so do font switches without braces (``\mathbf 1``, ``\mathcal A``: _TEX_FONT).
_TEX_DROP = {"left", "right", "big", "Big", "bigg", "Bigg", "bigl", "bigr", "Bigl", "Bigr", "displaystyle",
             "limits", "nolimits", "widehat", "overline"}
_TEX_FUNCS = {"log", "exp", "min", "max", "sin", "cos", "tanh", "sech", "arg", "clamp", "sg", "lim", "mean",
              "std", "softmax", "clip"}
# Accents on one symbol become combining characters (\hat A → Â, \bar w → w̄).
_TEX_ACCENT = {"hat": "\u0302", "bar": "\u0304", "tilde": "\u0303", "vec": "\u20d7", "dot": "\u0307"}
_TEX_ARG = re.compile(r"\\(?:text|mathrm|operatorname|mathcal|mathbf|mathbb|mathit|boldsymbol|bm|mathsf|"
                      r"overline|widehat)\s*\{([^{}]*)\}")
_TEX_FONT = re.compile(r"\\(?:text|mathrm|operatorname|mathcal|mathbf|mathbb|mathit|boldsymbol|bm|mathsf)"
                       r"(?![A-Za-z])\s*")
_TEX_ACCENT_ARG = re.compile(r"\\(hat|bar|tilde|vec|dot)\s*\{([^{}]*)\}")
_TEX_FRAC = re.compile(r"\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}")
_TEX_FRAC_DIGITS = re.compile(r"\\[dt]?frac\s*(\d)\s*(\d)")
# Characters Unicode writes as sub- and superscripts.
_SUBSCRIPT = dict(zip("0123456789+-−=()aehijklmnoprstuvx", "₀₁₂₃₄₅₆₇₈₉₊₋₋₌₍₎ₐₑₕᵢⱼₖₗₘₙₒₚᵣₛₜᵤᵥₓ"))
_SUPERSCRIPT = dict(zip("0123456789+-−=()ni", "⁰¹²³⁴⁵⁶⁷⁸⁹⁺⁻⁻⁼⁽⁾ⁿⁱ"))


def _script(mark: str, body: str) -> str:
    """``_{t-1}`` → ``ₜ₋₁``, ``^2`` → ``²``; where Unicode lacks a character: ``_soft`` (one word) or
    ``_(a∈A)``."""
    table = _SUBSCRIPT if mark == "_" else _SUPERSCRIPT
    body = body.strip().replace(" ", "")
    if body and all(ch in table for ch in body):
        return "".join(table[ch] for ch in body)
    mark = "\x04" if mark == "_" else "\x05"  # marks of finished scripts, left alone by later passes
    if re.fullmatch(r"[^\W_]+|.", body) or re.fullmatch(r"\([^()]*\)", body):
        return mark + body.replace("-", "−")
    return f"{mark}({body.replace('-', '−')})"


def tex_to_text(tex: str) -> str:
    """A TeX formula as readable Unicode text (``\\frac{a}{b}`` → ``(a)/(b)``, ``\\alpha`` → ``α``,
    ``a_{t-1}`` → ``aₜ₋₁``, ``\\bar w`` → ``w̄``)."""
    s = tex
    for _ in range(4):  # nested \frac and \mathrm{..} unwrap from the inside out
        s = _TEX_ARG.sub(r"\1", s)
        s = _TEX_ACCENT_ARG.sub(lambda m: f"\\{m.group(1)} {m.group(2)}" if len(m.group(2).strip()) == 1
                                or re.fullmatch(r"\s*\\[A-Za-z]+\s*", m.group(2)) else m.group(2), s)
        s = _TEX_FRAC.sub(lambda m: f"({m.group(1)})/({m.group(2)})", s)
        s = _TEX_FRAC_DIGITS.sub(r"\1/\2", s)

    s = _TEX_FONT.sub("", s)

    def word(m: re.Match) -> str:
        w = m.group(1)
        if w in _TEX_SPACE:
            return " "
        if w in _TEX_DROP:
            return ""
        if w in _TEX_ACCENT:
            return "\x03" + _TEX_ACCENT[w]
        if w in _TEX_FUNCS:  # \log r → "log r", \log(x) → "log(x)", \min_i → "minᵢ"
            nxt = m.string[m.end():m.end() + 1]
            return w + " " if nxt.isalnum() or nxt == "\\" else w
        return _TEX_WORDS.get(w, w)

    s = re.sub(r"\\([A-Za-z]+|.)", word, s)
    s = re.sub(r"\x03(.)\s*([^\s\x03])", r"\2\1", s)
    s = s.replace("\x03", "")
    prev = None
    while prev != s:  # innermost groups first: w_{\gamma_{sft}}
        prev = s
        s = re.sub(r"([_^])\{([^{}]*)\}", lambda m: _script(m.group(1), m.group(2)), s)
    s = re.sub(r"([_^])([^\s{}_^])", lambda m: _script(m.group(1), m.group(2)), s)
    s = s.replace("{", "").replace("}", "").replace("~", " ").replace("\x01", "{").replace("\x02", "}")
    s = s.replace("\x04", "_").replace("\x05", "^")
    return re.sub(r"⟨\s+|\s+⟩", lambda m: m.group(0).strip(), " ".join(s.split()))


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
