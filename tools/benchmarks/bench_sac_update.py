"""SAC update at V2 scale: the reference ``update_step`` against TorchRL ``DiscreteSACLoss`` + Adam.

Shape (seed 000 V2): batch 2048, 6000 actions (a third legal per row, <eos> always), observation
features 384, hidden 256, Top-p 0.98, CQL (λ 0.5) and BC (λ 0.1) on a quarter demo rows. Both sides
use the same architecture: a policy MLP 384-256-256-6000 and twin Q MLPs of the same shape with
target copies, Adam, and a soft target update (τ 0.005) per step. TorchRL gets the legal masks
through ``MaskedCategorical``; it has no CQL, BC or Top-p term, so the reference does more work.

One process, one torch thread, the two updates interleaved round by round; times are the thread CPU
time of a whole update (wall time around a synchronised stream on a GPU). The run also measures the
single-thread fp32 matmul peak, counts each update's matmul FLOPs with torch's flop counter, and
measures each side's peak RSS in its own subprocess (both import the same libraries). On CUDA a third
side runs the trainer's GPU update: the same ``update_step`` recorded once as a CUDA graph and replayed
(``reference_impl.sac.graphed``), and a fourth the same with its fused heads torch.compile'd (``compile=True``);
each side's kernel launches per update are counted by torch.profiler.

Run: ``python -m tools.benchmarks.bench_sac_update [--device cpu] [--rounds 5]``
"""
from __future__ import annotations

import functools
import importlib
import json
import sys

import torch
import torch.nn as nn

from reference_impl import _checks
from reference_impl.sac.graphed import CapturedUpdate
from reference_impl.sac.nets import TwinMLP
from reference_impl.sac.step import init_target, update_step
from tools.benchmarks import _common as C

B, A, OBS, HIDDEN, TOP_P = 2048, 6000, 384, 256, 0.98
LEGAL_SHARE, DEMO_SHARE, LR = 1 / 3, 0.25, 3e-4
FOREACH = None  # both sides' Adam: torch's default for the device (bench_dispatch sets True, CUDA's default)


def mlp() -> nn.Sequential:
    return nn.Sequential(nn.Linear(OBS, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(),
                         nn.Linear(HIDDEN, A))


def Twin() -> nn.Module:  # noqa: N802 - reads as the class it builds
    """The reference's twin critics: both MLPs in one stacked module (one batched matmul per layer), as
    TorchRL's loss stacks its two Q networks with vmap."""
    return TwinMLP(OBS, HIDDEN, HIDDEN, A)


def batch(device, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)

    def legal():
        m = torch.rand(B, A, generator=g) < LEGAL_SHARE
        m[:, 0] = True  # <eos>
        return m

    mask, next_mask = legal(), legal()
    action = torch.multinomial(mask.float(), 1, generator=g).squeeze(1)  # a legal action per row
    out = {"obs": torch.randn(B, OBS, generator=g), "next_obs": torch.randn(B, OBS, generator=g),
           "action": action, "reward": torch.randn(B, generator=g), "done": torch.rand(B, generator=g) < 0.05,
           "is_demo": torch.rand(B, generator=g) < DEMO_SHARE, "legal_mask": mask, "next_legal_mask": next_mask}
    return {k: v.to(device) for k, v in out.items()}


def _reference_nets(device):
    torch.manual_seed(0)
    policy, critic = mlp().to(device), Twin().to(device)
    target = init_target(critic)
    log_alpha = torch.zeros((), device=device, requires_grad=True)
    opts = {"q": torch.optim.Adam(critic.parameters(), lr=LR, foreach=FOREACH),
            "pi": torch.optim.Adam(policy.parameters(), lr=LR, foreach=FOREACH),
            "alpha": torch.optim.Adam([log_alpha], lr=LR, foreach=FOREACH)}
    b = batch(device)
    with _checks.validation(True):
        update_step(policy, critic, target, log_alpha, opts, b, top_p=TOP_P)  # the first batch, validated
    return (policy, critic, target, log_alpha, opts), b


def reference_step(device, compile: bool = False):
    """The eager update (``compile``: its fused heads torch.compile'd, as the trainer's ``compile=True``)."""
    nets, b = _reference_nets(device)

    def step():
        with _checks.validation(False):  # as the trainers run after their first batch
            return update_step(*nets, b, top_p=TOP_P, compile=compile)
    return step


def graphed_step(device, compile: bool = False):
    """The trainer's GPU update: the same update_step, recorded once as a CUDA graph and replayed (with
    ``compile``, its fused heads torch.compile'd first: the trainer's ``compile=True``)."""
    nets, b = _reference_nets(device)
    upd = CapturedUpdate(*nets, top_p=TOP_P, compile=compile)

    def step():
        with _checks.validation(False):
            return upd(b)
    for _ in range(upd.warmup + 1):  # warm-up calls, then the capture: every timed call is a replay
        step()
    if not upd.captured:
        raise RuntimeError("the update was not captured")
    return step


def torchrl_step(device):
    from tensordict import TensorDict
    from tensordict.nn import TensorDictModule
    from torchrl.modules import MaskedCategorical, ProbabilisticActor, ValueOperator
    from torchrl.objectives import DiscreteSACLoss, SoftUpdate

    torch.manual_seed(0)
    actor = ProbabilisticActor(TensorDictModule(mlp(), in_keys=["observation"], out_keys=["logits"]),
                               in_keys={"logits": "logits", "mask": "action_mask"},
                               distribution_class=MaskedCategorical,
                               return_log_prob=False).to(device)
    qnet = ValueOperator(mlp(), in_keys=["observation"], out_keys=["action_value"]).to(device)
    loss = DiscreteSACLoss(actor, qnet, action_space="categorical", num_actions=A, num_qvalue_nets=2)
    updater = SoftUpdate(loss, tau=0.005)
    opt = torch.optim.Adam(loss.parameters(), lr=LR, foreach=FOREACH)
    b = batch(device)
    td = TensorDict({"observation": b["obs"], "action": b["action"], "action_mask": b["legal_mask"],
                     "next": {"observation": b["next_obs"], "reward": b["reward"][:, None],
                              "done": b["done"][:, None], "terminated": b["done"][:, None],
                              "action_mask": b["next_legal_mask"]}}, batch_size=[B], device=device)

    def step():
        out = loss(td.clone(False))
        total = out["loss_actor"] + out["loss_qvalue"] + out["loss_alpha"]
        opt.zero_grad(set_to_none=True)
        total.backward()
        opt.step()
        updater.step()
        return out
    return step


SIDES = {"reference": reference_step, "torchrl": torchrl_step}
GPU_SIDES = {"reference_graph": graphed_step,  # on CUDA only: elsewhere it is the eager update
             "reference_graph_compiled": functools.partial(graphed_step, compile=True)}


def rss_worker(side: str, device: str) -> None:
    """Subprocess entry: build one side, run three updates, print its peak RSS (JSON, last line)."""
    for lib in ("tensordict", "torchrl"):  # both sides pay for the same imports
        importlib.import_module(lib)

    C.one_thread()
    step = SIDES[side](torch.device(device))
    step()  # both sides: optimiser state allocated before the count starts
    reset = C.reset_peak_rss()  # the peak of the updates, not of building the batch
    for _ in range(3):
        step()
    print(json.dumps({"side": side, "peak_rss": C.peak_rss_bytes(), "peak_reset": reset}))


def main(argv=None) -> dict:
    ap = C.parser(__doc__)
    ap.add_argument("--rss-worker", default=None, help=argparse_hidden())
    args = ap.parse_args(argv)
    if args.rss_worker:
        rss_worker(args.rss_worker, args.device)
        return {}
    C.one_thread()
    dev = torch.device(args.device)
    sides = {**SIDES, **(GPU_SIDES if dev.type == "cuda" else {})}
    steps, failed = {}, {}
    for name, make in sides.items():
        try:
            steps[name] = make(dev)
        except Exception as exc:  # a GPU-only side (a compiler missing on the machine) must not cost the others
            if name in SIDES:
                raise
            failed[name] = f"{type(exc).__name__}: {exc}"[:800]
            print(f"side {name} not measured: {failed[name]}", file=sys.stderr)
    flop = {name: C.flops(fn) for name, fn in steps.items() if name in SIDES}
    flop.update({name: flop["reference"] for name in steps if name not in SIDES})  # a replay dispatches nothing
    kernels = {name: C.cuda_kernel_launches(fn) for name, fn in steps.items()} if dev.type == "cuda" else {}
    peak = C.matmul_peak(dev)
    times = C.interleave(steps, args.rounds, dev)
    peak_after = C.matmul_peak(dev)  # the machine may have changed under us: report both
    med = {n: C.median(t) for n, t in times.items()}
    rss = {n: C.rss_in_subprocess("tools.benchmarks.bench_sac_update", "--rss-worker", n, "--device", args.device)
           for n in SIDES} if dev.type == "cpu" else {}
    gflops = {n: flop[n] / med[n] / 1e9 for n in steps}
    res = {
        "benchmark": "sac_update", "device": str(dev), "rounds": args.rounds,
        "shape": {"batch": B, "actions": A, "obs": OBS, "hidden": HIDDEN, "top_p": TOP_P},
        "median_s": med, "times_s": times, "gflop": {n: flop[n] / 1e9 for n in SIDES}, "gflops": gflops,
        "matmul_peak_gflops": max(peak, peak_after), "matmul_peak_before_after": [peak, peak_after],
        "pct_of_peak": {n: 100 * gflops[n] / max(peak, peak_after) for n in steps},
        "peak_rss_bytes": {n: r["peak_rss"] for n, r in rss.items()},
        "ratio": med["torchrl"] / med["reference"],
        "ratio_graph": med["torchrl"] / med["reference_graph"] if "reference_graph" in med else None,
        "ratio_graph_compiled": (med["torchrl"] / med["reference_graph_compiled"]
                                 if "reference_graph_compiled" in med else None),
        "kernel_launches": kernels, "packages": ["torchrl", "tensordict"], "failed_sides": failed,
    }
    path = C.write(f"sac_update_{dev.type}", res, args.json)
    print(f"SAC update [B {B}, |A| {A}]: reference {med['reference']:.3f} s ({gflops['reference']:.1f} GFLOP/s, "
          f"{res['pct_of_peak']['reference']:.0f}% of {res['matmul_peak_gflops']:.1f}), torchrl {med['torchrl']:.3f} s "
          f"({gflops['torchrl']:.1f} GFLOP/s); torchrl/reference = {res['ratio']:.2f}x")
    if res["ratio_graph"] is not None:
        print(f"captured update (CUDA graph): {med['reference_graph']:.4f} s; torchrl/graph = {res['ratio_graph']:.2f}x")
    if res["ratio_graph_compiled"] is not None:
        print(f"captured, fused heads compiled: {med['reference_graph_compiled']:.4f} s; "
              f"torchrl/compiled graph = {res['ratio_graph_compiled']:.2f}x")
    if kernels:
        print("CUDA kernel launches per update: " + ", ".join(f"{n} {k}" for n, k in kernels.items()))
    if rss:
        print("peak RSS: " + ", ".join(f"{n} {r['peak_rss'] / 2**30:.2f} GiB" for n, r in rss.items()))
    print(f"wrote {path}")
    return res


def argparse_hidden():
    import argparse
    return argparse.SUPPRESS


if __name__ == "__main__":
    main(sys.argv[1:])
