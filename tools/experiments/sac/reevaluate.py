"""Evaluate the final checkpoint of every run of a SAC suite again, with the trainer's ``evaluate``.

``python -m tools.experiments.sac.reevaluate SUITE OUT.jsonl``

Used for figures added to the evaluation after a suite ran (``heldout_4gram_share``): the policy is
rebuilt from the run's ``config.json`` and ``checkpoint.pt`` (on the CPU, whatever device wrote it)
and scored on the same held-out positions and passages as during training, beside the unigram
baseline. One JSON line per run.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch

from reference_impl.common import load_checkpoint
from reference_impl.sac.corpus import load_corpus
from reference_impl.sac.env import EnvConfig
from reference_impl.sac.nets import PolicyNet
from reference_impl.sac.trainer import Config, _scores_policy, _scores_unigram, evaluate
from tools.experiments.sac import run_positional


def config_of(run: Path) -> Config:
    raw = json.loads((run / "config.json").read_text(encoding="utf-8"))["config"]
    fields = {f.name for f in dataclasses.fields(Config)}
    env = EnvConfig(**raw.pop("env"))
    return Config(**{k: v for k, v in raw.items() if k in fields}, env=env)


def reevaluate(run: Path) -> dict:
    cfg = config_of(run)
    corpus = load_corpus(vocab_size=cfg.vocab_size, max_lines=cfg.max_lines, heldout_frac=cfg.heldout_frac)
    ck = load_checkpoint(run / "checkpoint.pt")
    policy = PolicyNet(corpus.vocab_size, cfg.d_model, cfg.gru_hidden, kind=cfg.encoder, window=cfg.env.history)
    policy.load_state_dict(ck["policy"])
    policy = policy.to(torch.float32).eval()
    ev = evaluate(_scores_policy(policy, torch.device("cpu")), corpus, cfg.env, cfg)
    base = evaluate(_scores_unigram(corpus), corpus, cfg.env, cfg)
    return {"run": run.name, "update": ck["update"], **ev, **{f"baseline_{k}": v for k, v in base.items() if k != "sample"}}


def main(suite: str, out: str) -> None:
    torch.set_num_threads(1)
    rows = [reevaluate(run) for run in sorted(Path(suite).iterdir()) if (run / "checkpoint.pt").exists()]
    Path(out).write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    for r in rows:
        print(r["run"], r["update"], {k: round(v, 4) for k, v in r.items() if isinstance(v, float)})


if __name__ == "__main__":
    run_positional(main, __doc__, 2)
