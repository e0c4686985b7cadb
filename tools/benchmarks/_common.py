"""Shared pieces of the script benchmarks: one thread, thread-CPU timing, medians, the matmul peak,
peak RSS in a subprocess, and the JSON result files that ``report.py`` turns into the site page.

Every script benchmark takes ``--device``; on a GPU the clock is wall time around a synchronised
stream (thread CPU time would miss the device's work), on the CPU it is the thread's CPU time, so a
busy shared machine slows every contender alike.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import torch
import torch.utils._python_dispatch

from tools.benchmarks.spread import BUSY_SPREAD, round_spread

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "performance" / "raw"


def parser(doc: str) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--device", default="cpu", help="cpu or cuda[:n]; a GPU row only comes from a GPU run")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds per contender (median reported)")
    ap.add_argument("--json", default=None, help="write the results here (default: docs/performance/raw/<name>.json)")
    return ap


def one_thread() -> None:
    torch.set_num_threads(1)  # one core per contender: comparable, and stable on a shared machine


def clock(device: torch.device) -> Callable[[], float]:
    if device.type == "cuda":
        def wall() -> float:
            torch.cuda.synchronize(device)
            return time.perf_counter()
        return wall
    return time.thread_time


def median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def interleave(contenders: dict[str, Callable[[], object] | tuple[Callable[[], tuple], Callable[..., object]]],
               rounds: int, device: torch.device, warmup: int = 1) -> dict[str, list[float]]:
    """Round r runs every contender once, in a rotated order; returns the times per contender. A contender
    is a callable, or a pair ``(setup, fn)``: ``fn(*setup())`` with only ``fn`` timed (a fresh store per
    round). Warns on stderr when the rounds disagree as a busy machine makes them (:mod:`tools.benchmarks.spread`)."""
    tick = clock(device)
    names = list(contenders)

    def once(name: str) -> float:
        call = contenders[name]
        setup, fn = call if isinstance(call, tuple) else (tuple, call)
        args = setup()
        t0 = tick()
        fn(*args)
        return tick() - t0

    for _ in range(warmup):
        for n in names:
            once(n)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        for n in names[r % len(names):] + names[:r % len(names)]:
            times[n].append(once(n))
    spread = round_spread(times)
    if spread > BUSY_SPREAD:
        print(f"warning: the rounds varied by {spread:.0%} (a busy machine?): the ratio may be off; rerun",
              file=sys.stderr)
    return times


def matmul_peak(device: torch.device, sizes=(1024, 2048), reps: int = 3) -> float:
    """Single-thread fp32 matmul GFLOP/s: the best over square sizes of the median over reps."""
    tick, best = clock(device), 0.0
    for n in sizes:
        a = torch.randn(n, n, device=device)
        b = torch.randn(n, n, device=device)
        a @ b
        ts = []
        for _ in range(reps):
            t0 = tick()
            a @ b
            ts.append(tick() - t0)
        best = max(best, 2 * n ** 3 / median(ts) / 1e9)
    return best


def cuda_kernel_launches(fn: Callable[[], object]) -> int:
    """CUDA kernel launches of one call (torch.profiler's launch API events; a CUDA graph replay is one)."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    launches = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx", "cudaGraphLaunch")
    return sum(e.count for e in prof.key_averages() if e.key in launches)


def flops(fn: Callable[[], object]) -> int:
    """Matmul-class FLOPs (forward and backward) of one call, counted by torch's flop counter."""
    with _FlopCount() as fc:
        fn()
    return fc.total


class _FlopCount(torch.utils._python_dispatch.TorchDispatchMode):
    """torch's flop formulas without FlopCounterMode's module tracker (which TensorDict modules break)."""

    def __init__(self):
        from torch.utils.flop_counter import flop_registry

        super().__init__()
        self.registry, self.total = flop_registry, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        count = self.registry.get(func.overloadpacket)
        if count is not None:
            self.total += count(*args, **kwargs, out_val=out)
        return out


def peak_rss_bytes() -> int:
    """Peak RSS of this process since the last :func:`reset_peak_rss` (VmHWM; ru_maxrss elsewhere)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def reset_peak_rss() -> bool:
    """Give freed heap back to the OS and restart the peak-RSS count from the current RSS (Linux:
    clear_refs 5), so the peak measured next is that of the work that follows, not of the setup."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def rss_in_subprocess(module: str, *args: str) -> dict:
    """Run ``python -m module *args`` (which prints one JSON line last) and return that JSON."""
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, env=env,
                         cwd=Path(__file__).resolve().parents[2], check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def gpu_stamp() -> dict:
    """The GPU's name, its driver and torch's CUDA version (nvidia-smi's driver where it runs)."""
    try:
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=20).stdout.split("\n")[0].strip()
    except (OSError, subprocess.SubprocessError):
        driver = "unknown"
    return {"name": torch.cuda.get_device_name(), "driver": driver, "cuda": torch.version.cuda}


def write(name: str, result: dict, path: str | None) -> Path:
    """The result with the run's provenance, as JSON (report.py reads every file in RESULTS)."""
    from rlconform.provenance import stamp

    p = Path(path) if path else RESULTS / f"{name}.json"
    p.parent.mkdir(parents=True, exist_ok=True)
    result = dict(result, provenance=stamp(packages=result.pop("packages", ())))
    if torch.cuda.is_available():  # a GPU row names its device and driver
        result["provenance"]["gpu"] = gpu_stamp()
    p.write_text(json.dumps(result, indent=2) + "\n")
    return p
