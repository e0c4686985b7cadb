"""Data-parallel training under ``torchrun``: one process per device, DDP, gloo on CPU and NCCL on GPU.

Every trainer goes through the same few helpers, so a plain ``python`` run (no ``WORLD_SIZE`` in the
environment) takes exactly the single-process path and a ``torchrun --nproc_per_node N`` run takes
the data-parallel one:

- :func:`setup` reads torchrun's ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``, opens the process group and
  picks this process's device (``cuda`` → ``cuda:LOCAL_RANK``); :func:`teardown` closes it.
- :func:`rank_seed`: rank 0 keeps the run's seed (a one-process run is unchanged), other ranks get
  their own, so their environments and samples differ; network initialisation uses the run's seed
  on every rank and DDP broadcasts rank 0's parameters anyway.
- :func:`wrap` / :func:`unwrap`: DDP averages gradients in ``backward``; rollouts, evaluation and
  checkpoints use the bare module (no collective, no ``module.`` prefix in the state dict).
- :func:`on_global_batch`, :func:`gather_cat`, :func:`reduce_metrics`, :func:`gather_objects`:
  batch statistics and metrics over all ranks, so rank 0 (the only writer) logs the whole run.
- :func:`rng_states` / :func:`restore_rng` / :func:`gather_to_writer`: the checkpoint keeps every
  rank's random state (and rank-local state such as replay buffers), so resume is exact.
"""
from __future__ import annotations

import os
import random
import sys
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import torch
import torch.distributed as dist

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class Dist:
    """This process's place in the run: rank, world size and the device it trains on."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_writer(self) -> bool:
        """Only rank 0 writes config, metrics and checkpoints."""
        return self.rank == 0


def resolve_dtype(name: str) -> torch.dtype:
    """``--dtype`` name → torch dtype of the networks and the update tensors."""
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"--dtype must be one of {sorted(DTYPES)}, got {name!r}") from None


def portable_config(cfg: Any) -> dict:
    """The config as a run directory records it: without ``device``, so a checkpoint written on a
    GPU resumes on the CPU (or another GPU) and back; tensors load through ``map_location``."""
    import dataclasses

    return {k: v for k, v in dataclasses.asdict(cfg).items() if k != "device"}


def setup(device: str = "cpu") -> Dist:
    """The process group from torchrun's environment variables (none set: a one-process run).

    ``device="cuda"`` means one GPU per process, ``cuda:LOCAL_RANK``; the backend is NCCL on GPU and
    gloo on CPU. Calling it again in the same process reuses the open group.
    """
    dev = torch.device(device)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1 and not dist.is_initialized():
        return Dist(device=dev)
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if dev.type == "cuda":
        dev = torch.device("cuda", local if dev.index is None else dev.index)
        torch.cuda.set_device(dev)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if dev.type == "cuda" else "gloo")
    return Dist(rank=dist.get_rank(), world_size=dist.get_world_size(), local_rank=local, device=dev)


def teardown() -> None:
    """Close the process group (a no-op in a one-process run).

    Every rank waits for the others first: a rank that destroys its gloo group while a peer still
    talks to it can abort the peer ("terminate called without an active exception").
    """
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def exit_process(code: int) -> None:
    """End a trainer's ``python -m`` run with ``code``. In a torchrun worker the process ends right after
    its output is flushed, skipping interpreter and C++ shutdown: by then the group is closed and every
    file of the run is written and fsynced. Rarely (2 runs in about 60 under a loaded test session), a
    gloo worker aborted after a complete run (SIGABRT, "terminate called without an active exception"),
    failing the job; a teardown-order race did not reproduce it, which leaves that shutdown."""
    if dist.is_torchelastic_launched() and not dist.is_initialized():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


def barrier(d: Dist) -> None:
    if d.enabled:
        dist.barrier()


def rank_seed(seed: int, rank: int) -> int:
    """The seed of one rank's environments and samples: ``seed`` itself on rank 0, a distinct one elsewhere."""
    if rank == 0:
        return seed
    return int(np.random.SeedSequence([seed, rank]).generate_state(1)[0])


def wrap(module: torch.nn.Module, d: Dist) -> torch.nn.Module:
    """DDP around ``module`` when data-parallel (gradients averaged over ranks in ``backward``), else itself."""
    if not d.enabled:
        return module
    from torch.nn.parallel import DistributedDataParallel as DDP

    ids = [d.device] if d.device.type == "cuda" else None
    return DDP(module, device_ids=ids)


def unwrap(module: torch.nn.Module) -> torch.nn.Module:
    """The bare module inside a DDP wrapper (for rollouts, evaluation and state dicts)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    return module.module if isinstance(module, DDP) else module


def gather_cat(x: torch.Tensor, d: Dist) -> torch.Tensor:
    """All ranks' ``x`` (same shape on every rank) concatenated along dim 0, in rank order, on every rank."""
    if not d.enabled:
        return x
    parts = [torch.empty_like(x) for _ in range(d.world_size)]
    dist.all_gather(parts, x.contiguous())
    return torch.cat(parts)


def on_global_batch(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, d: Dist) -> torch.Tensor:
    """``fn`` applied to the batch of all ranks, then this rank's rows of the result.

    For batch statistics such as advantage normalisation: every rank normalises with the mean and
    std of the whole data-parallel batch, as one process holding all of it would.
    """
    if not d.enabled:
        return fn(x)
    n = x.shape[0]
    return fn(gather_cat(x, d))[d.rank * n:(d.rank + 1) * n]


def gather_objects(obj: Any, d: Dist) -> list:
    """Every rank's ``obj`` (picklable), in rank order, on every rank."""
    if not d.enabled:
        return [obj]
    out: list = [None] * d.world_size
    dist.all_gather_object(out, obj)
    return out


def reduce_metrics(rec: dict, d: Dist, *, total: Iterable[str] = (), minimum: Iterable[str] = (),
                   maximum: Iterable[str] = ()) -> dict:
    """Float metrics averaged over ranks (each rank's value is a mean over an equal share); keys in
    ``total`` summed, in ``minimum``/``maximum`` reduced by min/max. Other values (ints, bools,
    strings) are taken as they are on this rank. One all-reduce per reduction kind."""
    if not d.enabled:
        return rec
    total, minimum, maximum = set(total), set(minimum), set(maximum)
    out = dict(rec)
    numeric = [k for k, v in rec.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
               and (isinstance(v, float) or k in total)]
    kinds = {dist.ReduceOp.MIN: [k for k in numeric if k in minimum], dist.ReduceOp.MAX: [k for k in numeric if k in maximum],
             dist.ReduceOp.SUM: [k for k in numeric if k not in minimum and k not in maximum]}
    for op, keys in kinds.items():
        if not keys:
            continue
        t = torch.tensor([float(rec[k]) for k in keys], dtype=torch.float64, device=d.device)
        dist.all_reduce(t, op=op)
        for k, v in zip(keys, t.tolist()):
            if op != dist.ReduceOp.SUM:
                out[k] = v
            elif k in total:
                out[k] = type(rec[k])(v)
            else:
                out[k] = v / d.world_size
    return out


def metrics_sync(d: Dist, *, minimum: Sequence[str] = ()) -> Callable[[dict], dict] | None:
    """A per-minibatch metrics reducer for the PPO update loop (None in a one-process run)."""
    if not d.enabled:
        return None
    return lambda m: reduce_metrics(m, d, minimum=minimum)


# --- random state: every rank's, so a resumed data-parallel run replays the uninterrupted one -------

def rng_state(*gens: torch.Generator) -> dict:
    """This process's random state: the given generators, torch's, numpy's and Python's."""
    return {"generators": [g.get_state() for g in gens], "generator_devices": [g.device.type for g in gens],
            "torch_rng": torch.get_rng_state(), "numpy_rng": np.random.get_state(), "python_rng": random.getstate()}


def set_rng_state(state: dict, *gens: torch.Generator, reseed: int) -> None:
    """Undo :func:`rng_state`. A generator state saved on another device type (a GPU run resumed on
    the CPU, or back) cannot be loaded: that generator is re-seeded with ``reseed`` and a warning
    says the continuation is no longer bitwise that of the uninterrupted run."""
    for g, saved, where in zip(gens, state["generators"], state["generator_devices"]):
        if where == g.device.type:
            g.set_state(saved)
        else:
            warnings.warn(f"checkpoint generator was on {where}, this run samples on {g.device.type}: re-seeded, "
                          "so the resumed samples differ from an uninterrupted run", stacklevel=3)
            g.manual_seed(reseed)
    torch.set_rng_state(state["torch_rng"])
    np.random.set_state(state["numpy_rng"])
    random.setstate(state["python_rng"])


def rng_states(d: Dist, *gens: torch.Generator) -> list[dict]:
    """:func:`rng_state` of every rank, in rank order (a collective: every rank calls it)."""
    return gather_objects(rng_state(*gens), d)


def restore_rng(states: list[dict], d: Dist, *gens: torch.Generator, reseed: int) -> None:
    """This rank's entry of :func:`rng_states` from a checkpoint; the world size must match."""
    set_rng_state(per_rank(states, d), *gens, reseed=reseed)


def per_rank(entries: list, d: Dist):
    """This rank's entry of a per-rank list in a checkpoint, checking the checkpoint's world size."""
    if len(entries) != d.world_size:
        raise ValueError(f"the checkpoint holds the state of {len(entries)} process(es) but this run has "
                         f"{d.world_size}; resume with --nproc_per_node {len(entries)}")
    return entries[d.rank]


def gather_to_writer(obj: Any, d: Dist) -> list | None:
    """Every rank's ``obj`` in rank order on rank 0 (None elsewhere): rank-local state for its checkpoint."""
    if not d.enabled:
        return [obj]
    out: list | None = [None] * d.world_size if d.is_writer else None
    dist.gather_object(obj, out, dst=0)
    return out
