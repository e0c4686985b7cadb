"""Aten ops dispatched per update: what a GPU pays in kernel launches (and the CPU in per-op overhead).

Counted on the CPU with a dispatch mode around one update (after a first one that allocates the
optimisers' state), all sides with ``Adam(foreach=True)``, CUDA's default:
- the SAC update of bench_sac_update: the reference's CPU plan (row blocks that stay in cache, a radix
  Top-p search: its count grows with the batch by design), the reference's accelerator plan (what a GPU
  runs: one pass over the batch, Top-p by sort; taken here on the simulated CUDA device), and TorchRL's
  ``DiscreteSACLoss`` update, at two batch sizes;
- the masked PPO minibatch of bench_ppo_epoch: the reference against sb3-contrib (per minibatch).

A dispatch is not a kernel: views and host-side scalar ops (the optimisers' CPU step counters) are
dispatched but launch nothing, on either side. On a GPU the kernel launches are measured by the profiler.

Run: ``python -m tools.benchmarks.bench_dispatch [--actions 6000] [--batches 256 2048]``
"""
from __future__ import annotations

import collections
import contextlib
import sys

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tools.benchmarks import _common as C
from tools.benchmarks import bench_ppo_epoch, bench_sac_update


class DispatchCount(TorchDispatchMode):
    """Aten ops dispatched while the block runs, by op."""

    def __init__(self):
        super().__init__()
        self.ops: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


def count(step) -> collections.Counter:
    step()  # the optimisers' state, allocated outside the count
    with DispatchCount() as c:
        step()
    return c.ops


@contextlib.contextmanager
def plan(name: str):
    """The reference's accelerator plan runs on the simulated CUDA device (the CPU plan on the CPU)."""
    if name == "cpu":
        yield torch.device("cpu")
        return
    from conformance_tests import simdevice

    with simdevice.simulate(), simdevice.implementation_call():  # the update's one .tolist() is legal there
        yield simdevice.DEVICE


def sac_counts(batches, actions: int) -> dict:
    bench_sac_update.A, bench_sac_update.FOREACH = actions, True
    out: dict[str, dict[int, int]] = {"reference_cpu_plan": {}, "reference_accelerator_plan": {}, "torchrl": {}}
    for b in batches:
        bench_sac_update.B = b
        for name, where in (("reference_cpu_plan", "cpu"), ("reference_accelerator_plan", "accelerator")):
            with plan(where) as dev:
                out[name][b] = sum(count(bench_sac_update.reference_step(dev)).values())
        out["torchrl"][b] = sum(count(bench_sac_update.torchrl_step(torch.device("cpu"))).values())
    return out


def ppo_counts() -> dict:
    """Per minibatch: one epoch's dispatches over its number of minibatches."""
    n_mb = bench_ppo_epoch.N // bench_ppo_epoch.MB
    return {name: sum(count(make(torch.device("cpu"))).values()) / n_mb for name, make in bench_ppo_epoch.SIDES.items()}


def main(argv=None) -> dict:
    ap = C.parser(__doc__)
    ap.add_argument("--actions", type=int, default=bench_sac_update.A)
    ap.add_argument("--batches", type=int, nargs="+", default=[256, bench_sac_update.B])
    args = ap.parse_args(argv)
    C.one_thread()
    sac, ppo = sac_counts(args.batches, args.actions), ppo_counts()
    res = {"benchmark": "dispatch", "device": "cpu", "actions": args.actions, "batches": args.batches,
           "sac_update": sac, "ppo_minibatch": ppo, "packages": ["torchrl", "tensordict", "sb3_contrib"]}
    path = C.write("dispatch_cpu", res, args.json)
    for name, by_b in sac.items():
        print(f"SAC update, |A| {args.actions}: {name} " + ", ".join(f"B {b}: {n}" for b, n in by_b.items()))
    print("PPO minibatch: " + ", ".join(f"{name} {n:.0f}" for name, n in ppo.items()))
    print(f"wrote {path}")
    return res


if __name__ == "__main__":
    main(sys.argv[1:])
