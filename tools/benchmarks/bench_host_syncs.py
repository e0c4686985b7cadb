"""Host syncs in the hot loops, guards off: tensor-to-Python conversions per SAC update and per PPO
minibatch (and, on a GPU, the synchronising calls torch's CUDA sync debug mode reports).

Counted on the CPU by wrapping ``Tensor.item``, ``tolist``, ``numpy``, ``__bool__``, ``__float__``,
``__int__`` and ``__index__`` while one step runs; each call is attributed to the module that made
it (``torch.optim`` conversions of the optimisers' CPU step counters never wait for a device, they
are listed apart). Workloads: the SAC update of bench_sac_update (at a smaller batch: the count does
not depend on it) and the PPO epoch of bench_ppo_epoch, with and without the KL guard (which reads
approx_kl on the host by design: one sync per minibatch).

Run: ``python -m tools.benchmarks.bench_host_syncs [--device cpu]``
"""
from __future__ import annotations

import collections
import contextlib
import sys
import warnings

import torch

from tools.benchmarks import _common as C

CONVERSIONS = ("item", "tolist", "numpy", "__bool__", "__float__", "__int__", "__index__")


@contextlib.contextmanager
def count_conversions():
    """Counter of tensor-to-Python conversions by calling module, while the block runs."""
    counts: collections.Counter = collections.Counter()
    saved = {name: getattr(torch.Tensor, name) for name in CONVERSIONS}

    def wrap(name, fn):
        def counted(self, *a, **k):
            counts[(sys._getframe(1).f_globals.get("__name__", "?"), name)] += 1
            return fn(self, *a, **k)
        return counted

    for name, fn in saved.items():
        setattr(torch.Tensor, name, wrap(name, fn))
    try:
        yield counts
    finally:
        for name, fn in saved.items():
            setattr(torch.Tensor, name, fn)


@contextlib.contextmanager
def cuda_syncs(device: torch.device):
    """Synchronising CUDA calls (torch's sync debug mode, as warnings); empty off a GPU."""
    found: list[str] = []
    if device.type != "cuda":
        yield found
        return
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            yield found
        found += [str(x.message) for x in w if "synchroniz" in str(x.message)]
    finally:
        torch.cuda.set_sync_debug_mode("default")


def _split(counts) -> dict:
    hot = sum(n for (mod, _), n in counts.items() if not mod.startswith("torch.optim"))
    optim = sum(n for (mod, _), n in counts.items() if mod.startswith("torch.optim"))
    return {"hot_loop": hot, "optimizer_cpu_counters": optim,
            "by_caller": {f"{mod}:{name}": n for (mod, name), n in sorted(counts.items())}}


def sac_update(device) -> dict:
    from tools.benchmarks import bench_sac_update as S

    S.B = 256  # the number of conversions does not depend on the batch size
    step = S.reference_step(device)  # validates its first batch, then runs with the guards off
    with count_conversions() as counts, cuda_syncs(device) as cuda:
        step()
    return {**_split(counts), "cuda_syncs": len(cuda), "per": "update"}


def ppo_minibatch(device, *, target_kl) -> dict:
    from tools.benchmarks import bench_ppo_epoch as P

    run = P.reference_epoch(device, target_kl=target_kl)  # one validated update first, then guards off
    with count_conversions() as counts, cuda_syncs(device) as cuda:
        records = run()
    out = _split(counts)
    n = len(records)
    return {**out, "minibatches": n, "hot_loop_per_minibatch": out["hot_loop"] / n,
            "cuda_syncs_per_minibatch": len(cuda) / n, "target_kl": target_kl}


def main(argv=None) -> dict:
    args = C.parser(__doc__).parse_args(argv)
    C.one_thread()
    dev = torch.device(args.device)
    res = {"benchmark": "host_syncs", "device": str(dev), "sac_update": sac_update(dev),
           "ppo_minibatch": ppo_minibatch(dev, target_kl=None),
           "ppo_minibatch_kl_guard": ppo_minibatch(dev, target_kl=1e9)}
    path = C.write(f"host_syncs_{dev.type}", res, args.json)
    s, p, pk = res["sac_update"], res["ppo_minibatch"], res["ppo_minibatch_kl_guard"]
    print(f"host syncs (guards off): SAC update {s['hot_loop']} (+{s['optimizer_cpu_counters']} optimiser CPU "
          f"counters); PPO minibatch {p['hot_loop_per_minibatch']:.3f} without the KL guard, "
          f"{pk['hot_loop_per_minibatch']:.3f} with it\nwrote {path}")
    return res


if __name__ == "__main__":
    main(sys.argv[1:])
