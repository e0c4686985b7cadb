"""The reference trainers are device- and dtype-generic: two updates of each on the CPU, with the
code path a GPU run takes.

No GPU on CI, so the test watches the trainer files instead: every tensor they create with a torch
factory (``zeros``, ``rand``, ``randint``, ``as_tensor``, ...) must name its device, or it would land
on the CPU while the networks sit on ``cuda:N``. Each trainer runs with ``--dtype float64`` (not the
default), and its checkpoint must hold float64 networks and optimiser moments, load through
``map_location`` onto the CPU, and its metrics must be finite. The trainers whose extras are missing
(``transformers`` for isreshape-lm, ``textworld`` for ccapo-textworld) are skipped, not dropped.
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch
from torch.overrides import TorchFunctionMode

from conformance_tests import simdevice
from conformance_tests.harness import named_leaves
from reference_impl.common import load_checkpoint

pytestmark = pytest.mark.meta

FACTORIES = {torch.zeros, torch.ones, torch.empty, torch.full, torch.tensor, torch.as_tensor, torch.arange,
             torch.rand, torch.randn, torch.randint, torch.randperm, torch.eye, torch.linspace}
SMALL_PPO = ["--smoke", "--n-envs", "2", "--rollout-steps", "10", "--minibatch-size", "10"]
LM_TINY = ["--max-operand", "4", "--hidden", "16", "--layers", "1", "--heads", "2", "--pretrain-steps", "20",
           "--batch-prompts", "2", "--group-size", "4", "--max-new-tokens", "3", "--eval-every", "1",
           "--arms", "v4", "--sample-dtype", "float64"]
TW_TINY = ["--prompts", "1", "--group-size", "3", "--max-steps", "6", "--train-games", "1", "--heldout-games", "0",
           "--epochs", "1", "--arms", "ccapo"]
# name -> (module, tiny arguments, run directory inside --out, extra package the trainer needs)
TRAINERS = {
    "ppo": ("reference_impl.ppo.trainer", SMALL_PPO),
    "mappo": ("reference_impl.ppo.mappo_trainer", SMALL_PPO),
    "ccapo": ("reference_impl.ccapo.trainer", ["--prompts", "2", "--group-size", "3"]),
    "isreshape-lm": ("reference_impl.isreshape.lm.trainer", LM_TINY, "v4/seed0", "transformers"),
    "ccapo-textworld": ("reference_impl.ccapo.textworld.trainer", TW_TINY, "ccapo-s0", "textworld"),
    "isreshape": ("reference_impl.isreshape.trainer",
                  ["--contexts", "4", "--tokens", "6", "--batch-contexts", "8", "--group-size", "4", "--epochs", "2"]),
    "sac": ("reference_impl.sac.trainer",
            [x for kv in ("vocab_size=400", "max_lines=1500", "env.n_envs=8", "env.horizon=6", "batch_size=16",
                          "learning_starts=8", "eval_positions=64", "eval_passages=4", "eval_len=8", "eval_every=1")
                   for x in ("--set", kv)]),
}


class FactoryWatch(TorchFunctionMode):
    """Records torch factory calls made directly from ``files`` without a ``device=`` argument."""

    def __init__(self, files: set[str]):
        super().__init__()
        self.files, self.found = files, []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in FACTORIES and "device" not in kwargs:
            caller = sys._getframe(1)
            if caller.f_code.co_filename in self.files:
                self.found.append(f"{Path(caller.f_code.co_filename).name}:{caller.f_lineno} torch.{func.__name__}")
        return func(*args, **kwargs)


def _floating(obj):
    """(path, tensor) of every floating tensor in a nested checkpoint."""
    return [(p, t) for p, t in named_leaves(obj) if isinstance(t, torch.Tensor) and t.is_floating_point()]


@pytest.mark.parametrize("name", sorted(TRAINERS))
def test_two_updates_name_their_device_and_keep_the_dtype(tmp_path, name, request):
    import importlib

    module, small, *rest = TRAINERS[name]
    subdir, needs = (rest + [".", None])[:2] if len(rest) < 2 else rest
    if needs:
        pytest.importorskip(needs)
    mod = importlib.import_module(module)
    out = tmp_path / name
    if name == "ccapo-textworld":
        small = small + ["--games-dir", str(request.getfixturevalue("tiny_game").parent)]
    watch = FactoryWatch({mod.__file__})
    with watch:
        assert mod.cli(["--updates", "2", "--out", str(out), "--device", "cpu", "--dtype", "float64", *small]) == 0
    assert not watch.found, f"tensors created without a device (they would stay on the CPU): {watch.found}"

    out = out / subdir
    ckpt = load_checkpoint(out / "checkpoint.pt")  # map_location: loads whatever device wrote it
    learner = {k: v for k, v in ckpt.items() if k not in ("ranks", "rng", "env", "agent_buf", "demo_buf")}
    tensors = list(_floating(learner))
    assert tensors, "the checkpoint holds no floating tensors"
    wrong = [(p, t.dtype) for p, t in tensors if t.dtype != torch.float64 and not p.endswith("['step']")]
    assert not wrong, f"--dtype float64 not honoured in {wrong[:5]}"
    assert all(t.device.type == "cpu" for _, t in tensors)

    recs = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines() if ln.strip()]
    assert recs and all(math.isfinite(v) for v in (recs[-1].get(k) for k in ("loss", "critic_loss"))
                        if isinstance(v, float))


@pytest.mark.parametrize("name", ["ppo", "mappo", "ccapo", "isreshape", "sac"])
def test_two_updates_on_the_simulated_gpu(tmp_path, name):
    """The GPU path without a GPU: on the simulated CUDA device a tensor the trainer leaves on the host (the
    env, a buffer, a generator, an evaluation table) raises where real CUDA would."""
    import importlib

    module, small, *_ = TRAINERS[name]
    mod = importlib.import_module(module)
    with simdevice.simulate(), simdevice.implementation_call():  # a trainer may read its metrics on the host
        assert mod.cli(["--updates", "2", "--out", str(tmp_path / name), "--device", "cuda", *small]) == 0
