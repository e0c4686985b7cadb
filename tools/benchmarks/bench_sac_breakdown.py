"""Where one SAC update's device time goes, and the Top-p plans head to head.

The captured update (one launch) is bound by its kernels' time, so the question for a GPU is which
kernels. Two measurements at the V2 shape of ``bench_sac_update``:

1. **breakdown**: torch.profiler over a few eager updates of the device's plan (the captured update
   replays the same kernels). Each kernel's device time, per update, summed into classes (matmul, sort,
   scan, softmax, foreach, index, reduction, elementwise), with the top kernels by name; TorchRL's
   update beside it; on CUDA also ours with the fused heads compiled (``compile=True``), whose Inductor
   kernels form the class "fused". On the CPU the same table lists aten ops by self CPU time (a smoke run: the CPU plan
   is a different one).
2. **top_p**: ``top_p_select`` by the sort (the accelerator plan today) and by the radix threshold search
   (the CPU's, one pass over the whole batch off the CPU), on flat, peaked and mixed batches, interleaved,
   once each has been checked to select the same sets; on CUDA each is also timed replayed as a CUDA
   graph, as the trainer's captured update runs it. The ratio sorted / threshold says which plan the GPU
   should take (backup._select).

Run: ``python -m tools.benchmarks.bench_sac_breakdown [--device cuda] [--rounds 10]``
"""
from __future__ import annotations

import collections
import functools
import sys
from typing import Callable

import torch

from reference_impl import _checks
from reference_impl.sac import masked_softmax, top_p_select
from tools.benchmarks import _common as C
from tools.benchmarks import bench_sac_update as U
from tools.benchmarks.bench_sac_top_p import KINDS, _logits

# (class, name fragments), first match wins: CUDA kernel names (cuBLAS/CUTLASS GEMMs, cub sorts, ATen's
# templated kernels) and, on the CPU, aten op names
CLASSES = (
    ("fused", ("triton_",)),  # Inductor's generated kernels (the compiled heads), whatever ops they fuse
    ("matmul", ("gemm", "gemv", "xmma", "cutlass", "nvjet", "splitk", "aten::mm", "aten::bmm", "aten::addmm",
                "aten::baddbmm")),
    ("sort", ("sort",)),
    ("scan", ("scan", "cumsum")),
    ("softmax", ("softmax",)),
    ("foreach", ("multi_tensor_apply", "foreach", "adam")),  # the optimisers, the norm clip, the soft update
    ("index", ("index", "scatter", "gather")),
    ("reduction", ("reduce", "aten::sum", "aten::amax", "aten::logsumexp", "aten::mean", "aten::min",
                   "aten::max", "aten::norm", "aten::linalg_vector_norm")),
    ("elementwise", ("elementwise", "aten::")),
)


def kernel_class(name: str) -> str:
    """The class of a kernel (or, on the CPU, an aten op) by its name; ``other`` for none."""
    low = name.lower()
    return next((cls for cls, frags in CLASSES if any(f in low for f in frags)), "other")


def device_times(fn: Callable[[], object], device: torch.device, calls: int = 3) -> dict[str, float]:
    """Seconds per call of each kernel name (CUDA: the kernels' device time; CPU: the aten ops' self time)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    gpu = device.type == "cuda"
    fn()  # allocator and cuBLAS handles warm, outside the trace
    if gpu:
        torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CUDA if gpu else ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            fn()
        if gpu:
            torch.cuda.synchronize(device)
    out: dict[str, float] = collections.Counter()
    for e in prof.events():
        if gpu and e.device_type == DeviceType.CUDA:
            out[e.name] += (e.time_range.end - e.time_range.start) / 1e6 / calls
        elif not gpu and e.name.startswith("aten::"):
            out[e.name] += e.self_cpu_time_total / 1e6 / calls
    return dict(out)


def by_class(times: dict[str, float]) -> dict[str, float]:
    out: dict[str, float] = collections.Counter()
    for name, t in times.items():
        out[kernel_class(name)] += t
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def _sides(device: torch.device) -> dict[str, Callable]:
    """The contenders: ours and TorchRL's update, and on CUDA ours with its fused heads compiled (the
    trainer's ``compile=True``: Inductor's kernels in place of the heads' eager passes)."""
    extra = {"reference_compiled": functools.partial(U.reference_step, compile=True)} if device.type == "cuda" else {}
    return {**U.SIDES, **extra}


def breakdown(device: torch.device, calls: int, top: int = 12) -> dict:
    """Per side: the device time per update by class, its total, and the top kernels by time. A side that
    cannot run (the compiled one, where Inductor's compiler fails) is recorded as failed, not fatal."""
    res = {}
    for side, make in _sides(device).items():
        try:
            times = device_times(make(device), device, calls)
        except Exception as exc:
            if side in U.SIDES:
                raise
            res[side] = {"failed": f"{type(exc).__name__}: {exc}"[:800]}
            print(f"{side} not profiled: {res[side]['failed']}", file=sys.stderr)
            continue
        res[side] = {"total_s": sum(times.values()), "by_class_s": by_class(times),
                     "top": [{"name": n[:160], "class": kernel_class(n), "s": t}
                             for n, t in sorted(times.items(), key=lambda kv: -kv[1])[:top]]}
    return res


def _graphed(fn: Callable[[], object]) -> Callable[[], object]:
    """``fn`` recorded once as a CUDA graph (after a warm-up on a side stream) and replayed."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def top_p_plans(device: torch.device, rounds: int) -> dict:
    """Median seconds of each Top-p plan per batch kind (and per capture, on CUDA), and sorted / threshold."""
    g = torch.Generator().manual_seed(0)
    res = {}
    for kind in KINDS:
        logits = _logits(kind, g, U.B, U.A)
        mask = torch.rand(logits.shape, generator=g) < U.LEGAL_SHARE
        mask[:, 0] = True
        probs, mask = masked_softmax(logits, mask).to(device), mask.to(device)
        plans = {m: (lambda m=m: top_p_select(probs, mask, p=U.TOP_P, method=m)) for m in ("sorted", "threshold")}
        if not torch.equal(plans["sorted"](), plans["threshold"]()):
            raise RuntimeError(f"the Top-p plans select different sets on the {kind} batch")
        failed = None
        if device.type == "cuda":
            try:
                plans.update({f"{m}_graph": _graphed(fn) for m, fn in list(plans.items())})
            except Exception as exc:  # a failed capture must not cost the eager figures of a short GPU run
                failed = f"{type(exc).__name__}: {exc}"[:800]
                print(f"Top-p on {kind} rows not captured: {failed}", file=sys.stderr)
        times = C.interleave(plans, rounds, device)
        med = {m: C.median(t) for m, t in times.items()}
        res[kind] = {"median_s": med, "sorted_over_threshold": med["sorted"] / med["threshold"]}
        if "sorted_graph" in med:
            res[kind]["graph_sorted_over_threshold"] = med["sorted_graph"] / med["threshold_graph"]
        if failed:
            res[kind]["graph_failed"] = failed
    return res


def main(argv=None) -> dict:
    ap = C.parser(__doc__)
    ap.add_argument("--calls", type=int, default=3, help="profiled updates per side (breakdown)")
    ap.add_argument("--batch", type=int, default=U.B, help="rows of the update's batch (V2: 2048)")
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.calls < 1 or args.batch < 1:
        ap.error("--rounds, --calls and --batch must be at least 1")
    C.one_thread()
    dev = torch.device(args.device)
    rows, U.B = U.B, args.batch  # the update's batch builder reads it
    try:
        with _checks.validation(False):
            parts = {"breakdown": breakdown(dev, args.calls), "top_p": top_p_plans(dev, args.rounds)}
    finally:
        U.B = rows
    res = {"benchmark": "sac_breakdown", "device": str(dev), "rounds": args.rounds, "calls": args.calls,
           "shape": {"batch": args.batch, "actions": U.A, "top_p": U.TOP_P}, **parts,
           "packages": ["torchrl", "tensordict"]}
    path = C.write(f"sac_breakdown_{dev.type}", res, args.json)
    unit = "device" if dev.type == "cuda" else "self CPU"
    for side, b in parts["breakdown"].items():
        if "failed" in b:
            continue
        classes = ", ".join(f"{c} {1e3 * t:.2f}" for c, t in b["by_class_s"].items())
        print(f"{side}: {1e3 * b['total_s']:.2f} ms of {unit} time per update ({classes} ms)")
    for kind, r in parts["top_p"].items():
        extra = (f"; captured {r['graph_sorted_over_threshold']:.2f}x" if "graph_sorted_over_threshold" in r else "")
        print(f"Top-p on {kind} rows: sorted / threshold = {r['sorted_over_threshold']:.2f}x{extra}")
    print(f"wrote {path}")
    return res


if __name__ == "__main__":
    main(sys.argv[1:])
