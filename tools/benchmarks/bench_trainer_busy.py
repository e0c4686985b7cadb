"""A trainer on a GPU: its throughput and how busy it keeps the GPU (the GPU-busy target).

Runs ``rlconform train NAME ...`` in-process with its own arguments, under torch.profiler with only
CUDA activity recorded (CUPTI's kernel records; no CPU op tracing, so the trainer runs at nearly its
own pace). Reports the wall time, the GPU busy fraction (the union of the kernels' intervals over the
wall time: what share of the run the GPU computed), updates/s, and the trainer's own unit per second:
generated tokens for ``isreshape-lm`` (prompts x group x response length per update), episodes for
``ccapo-textworld`` (games x group per update). A low busy fraction names the host as the bound.

Run: ``python -m tools.benchmarks.bench_trainer_busy --device cuda isreshape-lm --updates 30 --out DIR``
(everything after the trainer's name goes to the trainer; give it ``--device`` yourself)
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from pathlib import Path

from tools.benchmarks import _common as C

UNITS = {  # trainer -> (unit, units per update from the run's config.json)
    "isreshape-lm": ("tokens", lambda c: c["batch_prompts"] * c["group_size"] * c["max_new_tokens"]),
    "ccapo-textworld": ("episodes", lambda c: c["prompts"] * c["group_size"]),
}


def busy_seconds(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end) intervals (kernels of several streams may overlap)."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def _kernel_intervals(prof) -> list[tuple[float, float]]:
    from torch.autograd import DeviceType

    return [(e.time_range.start / 1e6, e.time_range.end / 1e6) for e in prof.events()
            if e.device_type == DeviceType.CUDA]


def _units(metrics: Path, per_update) -> int | None:
    """Units per update from the run's config.json (beside its metrics); None if it lacks the fields."""
    try:
        return per_update(json.loads((metrics.parent / "config.json").read_text())["config"])
    except (OSError, KeyError, TypeError):
        return None


def main(argv=None) -> dict:
    from rlconform.cli import TRAINERS

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument("trainer", choices=sorted(TRAINERS), help="a `rlconform train` name")
    ap.add_argument("args", nargs=argparse.REMAINDER, help="the trainer's own arguments (with --out and --device)")
    a = ap.parse_args(argv)
    if "--out" not in a.args[:-1]:
        ap.error("give the trainer its --out DIR (the metrics are read from there)")
    import torch
    from torch.profiler import ProfilerActivity, profile

    mod, fn = TRAINERS[a.trainer].split(":")
    train = getattr(importlib.import_module(mod), fn)
    out = Path(a.args[a.args.index("--out") + 1])
    t0 = time.perf_counter()
    gpu = torch.cuda.is_available()  # without one: the throughput only (a smoke run of the tool)
    with profile(activities=[ProfilerActivity.CUDA if gpu else ProfilerActivity.CPU]) as prof:
        rc = train(list(a.args))
        if gpu:
            torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    if rc:
        raise SystemExit(f"train {a.trainer} exited {rc}")
    busy = busy_seconds(_kernel_intervals(prof)) if gpu else float("nan")
    unit, per_update = UNITS.get(a.trainer, (None, None))
    runs = [m for m in sorted(out.rglob("metrics.jsonl"))  # runs may lie below --out (OUT/<arm>/seed<S>)
            if per_update is None or _units(m, per_update) is not None]  # not a pre-training's log
    if not runs:
        raise SystemExit(f"no training run's metrics.jsonl under {out}")
    updates = sum(len({json.loads(line)["update"] for line in m.read_text().splitlines()}) for m in runs)
    res = {"benchmark": "trainer_busy", "trainer": a.trainer, "args": a.args, "wall_s": wall,
           "gpu_busy_s": busy, "busy_fraction": busy / wall, "updates": updates, "updates_per_s": updates / wall}
    if unit:
        res[f"{unit}_per_s"] = _units(runs[0], per_update) * updates / wall
    path = C.write(f"trainer_busy_{a.trainer}_{'cuda' if gpu else 'cpu'}", res, a.json)
    print(f"{a.trainer}: {wall:.1f} s wall, GPU busy {100 * res['busy_fraction']:.0f}%, {res['updates_per_s']:.2f} updates/s"
          + "".join(f", {v:.0f} {k.replace('_per_s', '')}/s" for k, v in res.items() if k.endswith("_per_s")
                    and k != "updates_per_s"))
    print(f"wrote {path}")
    return res


if __name__ == "__main__":
    main(sys.argv[1:])
