"""How far the SAC policy network gets with teacher text alone: a training-length probe for SAC-GATE-3/7.

``python -m tools.experiments.sac.supervised_probe OUT.jsonl [--steps 4000] [--eval-every 500] [--lr 3e-3]``

The policy network of the CPU preset (same vocabulary, window, widths, encoder) is trained by
cross-entropy on the masked policy (the BC loss of §7 with every row a demo row) on random windows
of the training text, batch 256, and scored by the trainer's own ``evaluate`` every ``eval_every``
steps. No RL, no critic, no environment: it isolates what the network and the window can learn
from the data in a given number of gradient steps, i.e. whether training length holds back free
generation.
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from reference_impl.common import seed_everything
from reference_impl.sac.corpus import load_corpus
from reference_impl.sac.env import CharEnv
from reference_impl.sac.losses import bc_loss
from reference_impl.sac.masking import masked_softmax
from reference_impl.sac.nets import PolicyNet
from reference_impl.sac.trainer import Config, _scores_policy, evaluate


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m tools.experiments.sac.supervised_probe",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--steps", type=int, default=4000)
    p.add_argument("--eval-every", type=int, default=500)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--batch", type=int, default=256)
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    cfg = Config()
    corpus = load_corpus(vocab_size=cfg.vocab_size, max_lines=cfg.max_lines, heldout_frac=cfg.heldout_frac)
    seed_everything(0)
    m, g = cfg.env.history, torch.Generator().manual_seed(0)
    policy = PolicyNet(corpus.vocab_size, cfg.d_model, cfg.gru_hidden, kind=cfg.encoder, window=m)
    opt = torch.optim.Adam(policy.parameters(), lr=a.lr)
    env = CharEnv(corpus, corpus.train, cfg.env, generator=g, reward=False)  # only for its legal mask
    rows, t0 = [], time.time()
    with open(a.out, "w", encoding="utf-8") as f:
        for step in range(a.steps + 1):
            if step % a.eval_every == 0:
                ev = evaluate(_scores_policy(policy, torch.device("cpu")), corpus, cfg.env, cfg)
                rows.append({"step": step, "cpu_minutes": (time.time() - t0) / 60, **ev})
                f.write(json.dumps(rows[-1], ensure_ascii=False) + "\n")
                f.flush()
                print(json.dumps({k: v for k, v in rows[-1].items()}, ensure_ascii=False), flush=True)
            if step == a.steps:
                break
            pos = torch.randint(m, len(corpus.train), (a.batch,), generator=g, device="cpu")
            obs, tgt = corpus.train[pos[:, None] - m + torch.arange(m, device="cpu")], corpus.train[pos]
            legal = env.legal_mask(obs)
            pi = masked_softmax(policy(obs), legal)  # SAC-MASK-1, SAC-MASK-2
            demo = legal.gather(1, tgt[:, None]).squeeze(1)  # as the trainer's teacher: masked targets are rejected
            loss = bc_loss(torch.log(pi), tgt, demo, lam=1.0)  # SAC-BC-1
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()


if __name__ == "__main__":
    main()
