"""The SAC evaluation's paragraph figures (reference_impl/sac/quality.py), against hand counts: §10's
consistency score as the reference defines it (SAC-GATE-7), and the held-out n-gram share beside SAC-COV-1."""
from __future__ import annotations

import pytest

from reference_impl.sac.quality import attested_share, ngram_set, paragraph_consistency

pytestmark = pytest.mark.meta


def test_paragraph_consistency_counts_distinct_lexicon_pairs():
    lex = frozenset({"中国", "国家", "人民"})
    # 中国家人民: pairs 中国 国家 家人 人民 -> three words of four pairs (hand count)
    assert paragraph_consistency("中国家人民", lex) == 3 / 4
    # a loop repeats one word: 中国中国中国 has pairs 中国 国中 中国 国中 中国 -> one distinct word of five
    assert paragraph_consistency("中国中国中国", lex) == 1 / 5
    assert paragraph_consistency("中", lex) == 0.0 and paragraph_consistency("", lex) == 0.0
    assert paragraph_consistency("中国", lex) == 1.0  # two characters: one pair, a word
    assert paragraph_consistency("中国", ["中国", "国家"]) == 1.0  # any collection of words will do


def test_ngram_set_is_every_window_of_the_text():
    assert ngram_set("abcab", 2) == {"ab", "bc", "ca"}  # ab twice, once in the set
    assert ngram_set("abc", 3) == {"abc"}  # the whole text is its one window
    assert ngram_set("ab", 3) == frozenset()  # shorter than n: none
    assert isinstance(ngram_set("abc", 2), frozenset)


def test_attested_share_counts_windows_with_multiplicity():
    attested = frozenset({"ab", "bc"})
    # abcab: windows ab bc ca ab -> 3 of 4 attested (ab counted twice)
    assert attested_share("abcab", attested, 2) == 3 / 4
    assert attested_share("abc", frozenset({"abc"}), 3) == 1.0  # one window, attested
    assert attested_share("xy", attested, 2) == 0.0
    assert attested_share("a", attested, 2) == 0.0  # fewer than n characters: no window, share 0
