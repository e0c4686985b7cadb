"""The reference trainers under torchrun: 2 CPU processes (gloo) against one process.

``test_one_distributed_update_equals_the_combined_batch_update`` launches this module itself as the
worker (``torchrun --nproc_per_node 2 -m conformance_tests.meta.test_trainers_distributed --worker OUT``). Each rank
holds one half of a fixed batch; the test replays the same update in this process on the whole
batch, with torch's own Adam and gradient clipping, and compares the parameters.

What "equal to a single-process update on the combined batch" requires:

- every per-rank loss is a *mean* over the rank's minibatch and all ranks' minibatches have the same
  size m, so DDP's average of the ranks' gradients is the gradient of the mean loss over the 2m rows
  of the combined minibatch;
- advantages are normalised with the mean and std of the combined batch (``on_global_batch``), not
  per rank;
- PPO shuffles each rank's half with that rank's own generator, so combined minibatch k is the union
  of the ranks' k-th minibatches (stratified by rank). A single process shuffling all 2n rows with
  one permutation would draw other minibatches (equal only in distribution), so the single-process
  replay rebuilds each combined minibatch from the ranks' permutations;
- the KL guard must read the KL of the combined minibatch on every rank (``sync_metrics``), or the
  ranks could stop at different minibatches; the recorded approx_kl is checked against it;
- gradient-norm clipping applies to the averaged gradient, as in one process.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from rlconform import launch

from conformance_tests.harness import tolerance
from reference_impl.common import distributed as ddp
from reference_impl.common.distributed import rank_seed
from reference_impl.ppo.losses import normalize_advantages
from reference_impl.ppo.masking import evaluate_actions
from reference_impl.ppo.nets import Actor, Critic
from reference_impl.ppo.trainer import MINIMA
from reference_impl.ppo.update import minibatch_loss, ppo_update

pytestmark = [pytest.mark.meta, pytest.mark.long]

WORLD, N_PER_RANK, MINIBATCH, EPOCHS, OBS, ACTIONS, HIDDEN, SHUFFLE_SEED = 2, 24, 8, 2, 6, 5, 16, 7
HP = dict(clip_eps=0.2, vf_coef=0.5, ent_coef=0.01)
MAX_GRAD_NORM = 0.5
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def torchrun(tmp_path_factory):
    """``torchrun(module, *args)``: ``torchrun --standalone --nproc_per_node 2 -m module args``, asserted to exit 0.
    The launcher is forked from the warm forkserver; its ranks are torchrun's own fresh processes."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    logs = tmp_path_factory.mktemp("torchrun")

    def start(module: str, *args: str, timeout: float = 240) -> None:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(WORLD),
               "-m", module, *args]
        proc = launch.run(cmd, cwd=REPO, env=env, timeout=timeout, tmp=logs)
        assert proc.returncode == 0, \
            f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"

    return start


def _nets():

    torch.manual_seed(0)
    return Actor(OBS, ACTIONS, HIDDEN).double(), Critic(OBS, HIDDEN).double()


def _combined_batch(actor) -> dict:
    """2n rows, the same on every rank: random legal masks, actions and old log-probs of ``actor``."""

    g = torch.Generator().manual_seed(123)
    n = WORLD * N_PER_RANK
    obs = torch.randn(n, OBS, generator=g, dtype=torch.float64)
    mask = torch.rand(n, ACTIONS, generator=g) < 0.6
    mask[torch.arange(n), torch.randint(ACTIONS, (n,), generator=g)] = True  # at least one legal action
    action = torch.multinomial(mask.double(), 1, generator=g).squeeze(1)
    with torch.no_grad():
        old_lp, _ = evaluate_actions(actor(obs), mask, action)
    return {"obs": obs, "mask": mask, "action": action, "old_log_prob": old_lp,
            "advantage": torch.randn(n, generator=g, dtype=torch.float64) * 3 + 1,
            "return": torch.randn(n, generator=g, dtype=torch.float64)}


def _normalise(a: torch.Tensor) -> torch.Tensor:

    return normalize_advantages(a, eps=1e-8, clamp=None)


def _worker(out: str) -> None:
    """One rank: its half of the batch, the trainer's DDP helpers, one ``ppo_update``; rank 0 saves."""

    torch.set_num_threads(1)
    d = ddp.setup("cpu")
    actor, critic = _nets()
    full = _combined_batch(actor)
    share = {k: v[d.rank * N_PER_RANK:(d.rank + 1) * N_PER_RANK] for k, v in full.items()}
    share["advantage"] = ddp.on_global_batch(_normalise, share["advantage"], d)
    opt = torch.optim.Adam([*actor.parameters(), *critic.parameters()], lr=1e-2, eps=1e-5)
    gen = torch.Generator().manual_seed(ddp.rank_seed(SHUFFLE_SEED, d.rank))
    stats = ppo_update(ddp.wrap(actor, d), ddp.wrap(critic, d), opt, share, epochs=EPOCHS, minibatch_size=MINIBATCH,
                       max_grad_norm=MAX_GRAD_NORM, target_kl=None, generator=gen,
                       sync_metrics=ddp.metrics_sync(d, minimum=MINIMA), **HP)
    if d.is_writer:
        torch.save({"actor": actor.state_dict(), "critic": critic.state_dict(), "stats": stats}, out)
    ddp.teardown()


def _single_process_replay() -> tuple[dict, dict, list[dict]]:
    """The same update in one process on the combined batch: each combined minibatch is the union of
    the ranks' minibatches; one mean loss over it, one backward, per-network clipping, one Adam step.
    Returns the parameters and each combined minibatch's metrics (approx_kl, log_prob_min)."""

    actor, critic = _nets()
    full = _combined_batch(actor)
    full["advantage"] = _normalise(full["advantage"])
    opt = torch.optim.Adam([*actor.parameters(), *critic.parameters()], lr=1e-2, eps=1e-5)
    gens = [torch.Generator().manual_seed(rank_seed(SHUFFLE_SEED, r)) for r in range(WORLD)]
    metrics = []
    for _ in range(EPOCHS):
        perms = [torch.randperm(N_PER_RANK, generator=g) + r * N_PER_RANK for r, g in enumerate(gens)]
        for start in range(0, N_PER_RANK, MINIBATCH):
            idx = torch.cat([p[start:start + MINIBATCH] for p in perms])
            loss, m = minibatch_loss(actor, critic, {k: v[idx] for k, v in full.items()}, **HP)
            metrics.append(m)
            opt.zero_grad()
            loss.backward()
            for net in (actor, critic):
                torch.nn.utils.clip_grad_norm_(list(net.parameters()), MAX_GRAD_NORM)
            opt.step()
    return actor.state_dict(), critic.state_dict(), metrics


@pytest.mark.clause("PPO-UPDATE-2", "PPO-ADV-1", "PPO-KLSTOP-1")
def test_one_distributed_update_equals_the_combined_batch_update(tmp_path, torchrun):
    out = tmp_path / "ddp.pt"
    torchrun("conformance_tests.meta.test_trainers_distributed", "--worker", str(out))
    got = torch.load(out, weights_only=False)
    actor, critic, want_metrics = _single_process_replay()
    rtol, atol = tolerance("PPO-UPDATE-2", torch.float64)
    worst = 0.0
    for name, want_sd in (("actor", actor), ("critic", critic)):
        for key, want in want_sd.items():
            have = got[name][key]
            worst = max(worst, float((have - want).abs().max()))
            torch.testing.assert_close(have, want, rtol=rtol, atol=atol, msg=f"{name}.{key} [PPO-UPDATE-2]")
    assert len(got["stats"]) == len(want_metrics) == EPOCHS * N_PER_RANK // MINIBATCH
    for k, (have, want) in enumerate(zip(got["stats"], want_metrics)):  # what the KL guard reads, every rank
        for key in ("approx_kl", "log_prob_min", "loss"):
            np.testing.assert_allclose(have[key], want[key], rtol=rtol, atol=atol,
                                       err_msg=f"minibatch {k}: {key} of the combined minibatch [PPO-KLSTOP-1]")
    moved = max(float((got["actor"][k] - v).abs().max()) for k, v in _nets()[0].state_dict().items())
    assert moved > 1e-3, "the update did not move the actor: the comparison would be vacuous"
    print(f"DDP vs single process: max |param diff| = {worst:.3g}")


def test_ppo_trainer_under_torchrun_writes_once_and_resumes_exactly(tmp_path, torchrun):
    """2 processes: rank 0 alone writes the run directory; metrics cover both ranks' samples; a run
    stopped after 2 updates and resumed (every rank's random state comes from the checkpoint) logs the
    same third update as a run of 3."""
    small = ["--smoke", "--n-envs", "2", "--rollout-steps", "10", "--minibatch-size", "10", "--checkpoint-every", "1"]
    straight, split = tmp_path / "straight", tmp_path / "split"
    torchrun("reference_impl.ppo.trainer", "--updates", "3", "--out", str(straight), *small)
    torchrun("reference_impl.ppo.trainer", "--updates", "2", "--out", str(split), *small)
    torchrun("reference_impl.ppo.trainer", "--updates", "3", "--resume", "--out", str(split), *small)
    files = sorted(f.name for f in split.iterdir())  # .lock: the one writer's (reference_impl.common.run)
    assert files == [".lock", "checkpoint.pt", "config.json", "metrics.jsonl"]
    full, resumed = ([json.loads(ln) for ln in (d / "metrics.jsonl").read_text().splitlines()] for d in (straight, split))
    assert [r["update"] for r in resumed] == [1, 2, 3]
    assert [r["env_steps"] for r in resumed] == [WORLD * 20 * k for k in (1, 2, 3)]  # both ranks' moves counted
    assert len(torch.load(split / "checkpoint.pt", weights_only=False)["rng"]) == WORLD
    for key in ("loss", "approx_kl", "entropy_ratio", "env_steps"):
        assert resumed[2][key] == full[2][key], key


if __name__ == "__main__":  # the torchrun worker of the test above
    if sys.argv[1:2] == ["--worker"]:
        from reference_impl.common.distributed import exit_process

        _worker(sys.argv[2])
        exit_process(0)  # as the trainers end a torchrun worker
