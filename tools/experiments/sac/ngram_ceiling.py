"""What a window of m characters can reach on SAC-GATE-3, without any RL: a count-based character model.

``python -m tools.experiments.sac.ngram_ceiling OUT.jsonl [--windows 1 2 4 8] [--vocab-sizes 2000 4000]``

The scorer is a back-off Markov model: the next-character counts of the training split after the
longest suffix (up to m characters) of the observation that the training text contains. It is
plugged into the trainer's own ``evaluate`` (same held-out positions, same greedy writing, same
legal mask, same 4-gram coverage), so its figures are directly comparable with the SAC policy's:
they show what the observation window allows a next-character predictor to reach on this corpus.
A policy that only sees m characters cannot beat the best predictor of the next character from
those m characters on the hit rates, so the count model is an estimate of the ceiling. A first row
measures real news text as the "writer" (another held-out passage; the text just before the
passage): what perfectly fluent writing scores on the 4-gram coverage without seeing the reference.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
from collections import Counter, defaultdict

import torch

from reference_impl.sac.corpus import load_corpus
from reference_impl.sac.reward import ngram_coverage
from reference_impl.sac.trainer import Config, _scores_unigram, evaluate


FIGURES = ("top1_hit", "top3_hit", "coverage", "consistency", "heldout_4gram_share")


def count_model(train: torch.Tensor, m: int) -> list[dict]:
    """tables[k][context of k ids] -> Counter of next ids, for k = 0..m."""
    ids = train.tolist()
    tables = [defaultdict(Counter) for _ in range(m + 1)]
    for i in range(len(ids)):
        for k in range(min(m, i) + 1):
            tables[k][tuple(ids[i - k:i])][ids[i]] += 1
    return tables


def backoff_scorer(tables: list[dict], V: int):
    """score(obs [N, m]) -> log(1 + counts) after the longest known suffix of each row."""
    m = len(tables) - 1

    def score(obs: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(len(obs), V, dtype=torch.float32, device=obs.device)
        for r, row in enumerate(obs[:, -m:].tolist() if m else [[]] * len(obs)):
            for k in range(m, -1, -1):
                cnt = tables[k].get(tuple(row[len(row) - k:]))
                if cnt:
                    idx = torch.tensor(list(cnt.keys()), device=obs.device)
                    out[r, idx] = torch.tensor(list(cnt.values()), dtype=torch.float32, device=obs.device).log1p()
                    break
        return out

    return score


def fluent_writers(corpus, cfg: Config, n: int = 512, seed: int = 0) -> dict[str, float]:
    """4-gram coverage (SAC-COV-1, the evaluation's n and window) of real news text that is *not* the
    reference continuation, against it: another held-out passage, and the 64 characters just before it
    (same article: the most a writer could take from a long observation window without seeing the future)."""
    held, L = corpus.heldout, cfg.eval_len
    g = torch.Generator().manual_seed(seed)
    starts = torch.randint(L, len(held) - L, (n,), generator=g, device="cpu").tolist()
    others = torch.randint(L, len(held) - L, (n,), generator=g, device="cpu").tolist()
    txt = lambda a, b: corpus.decode(held[a:b])  # noqa: E731
    cov = lambda x, y: ngram_coverage(x, y, n=cfg.eval_ngram, window=L)  # noqa: E731
    return {"other_passage": sum(cov(txt(o, o + L), txt(s, s + L)) for s, o in zip(starts, others)) / n,
            "preceding_text": sum(cov(txt(s - L, s), txt(s, s + L)) for s in starts) / n}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m tools.experiments.sac.ngram_ceiling",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--windows", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--vocab-sizes", type=int, nargs="+", default=[2000])
    p.add_argument("--eval-passages", type=int, default=32)
    a = p.parse_args(argv)
    rows = []
    for vs in a.vocab_sizes:
        cfg = Config(vocab_size=vs, eval_passages=a.eval_passages)
        corpus = load_corpus(vocab_size=vs, max_lines=cfg.max_lines, heldout_frac=cfg.heldout_frac)
        base = evaluate(_scores_unigram(corpus), corpus, cfg.env, cfg)
        rows.append({"vocab_size": vs, "writer": "real news text", **fluent_writers(corpus, cfg)})
        print(json.dumps(rows[-1]), flush=True)
        for m in a.windows:
            env = dataclasses.replace(cfg.env, history=max(m, 1))
            ev = evaluate(backoff_scorer(count_model(corpus.train, m), corpus.vocab_size), corpus, env, cfg)
            gains = [ev[k] - base[k] for k in ("top1_hit", "top3_hit", "coverage")]
            row = {"vocab_size": vs, "window": m, **{k: ev[k] for k in FIGURES}, **{f"baseline_{k}": base[k] for k in FIGURES},
                   "ood_gain_pp": 100 * min(gains), "sample": ev["sample"]}
            rows.append(row)
            print(json.dumps(row, ensure_ascii=False), flush=True)
    with open(a.out, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    assert all(math.isfinite(r.get("ood_gain_pp", 0.0)) for r in rows)


if __name__ == "__main__":
    main()
