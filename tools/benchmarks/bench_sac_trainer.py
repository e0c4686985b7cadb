"""SAC trainer throughput: learning updates per second, environment steps included (target: 25 updates/s).

Runs ``rlconform train sac`` in-process for ``--updates`` updates on a preset (``full``: the V2 sizes,
for a GPU; ``cpu``: the CPU default) into a temporary run directory, then reads the time stamp
of each update's metrics record. The figure is the steady rate: from the 10th learning update (the
first ones warm up and, on one GPU, record the CUDA graph) to the last update before the final
evaluation. Also reported: the time to the first learning update (corpus, baseline evaluation,
replay fill) and the whole run.

Run: ``python -m tools.benchmarks.bench_sac_trainer [--device cuda] [--preset full] [--updates 200]``
"""
from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

from tools.benchmarks import _common as C


def steady_rate(records: list[dict], skip: int = 10) -> tuple[float, int]:
    """Updates per second over the learning updates after the first ``skip``, last update excluded
    (it evaluates); and how many updates that covers. Records without a loss are before learning."""
    learning = [r for r in records if "critic_loss" in r]
    span = learning[skip:-1]
    if len(span) < 2:
        raise SystemExit(f"too few learning updates to measure ({len(learning)}); raise --updates")
    dt = span[-1]["time"] - span[0]["time"]
    return (len(span) - 1) / dt, len(span) - 1


def main(argv=None) -> dict:
    ap = C.parser(__doc__)
    ap.add_argument("--preset", default="full", choices=("full", "cpu"))
    ap.add_argument("--updates", type=int, default=200)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a Config override, as in train")
    args = ap.parse_args(argv)
    from reference_impl.sac import trainer

    with tempfile.TemporaryDirectory() as out:
        argv_train = ["--out", out, "--preset", args.preset, "--updates", str(args.updates), "--device", args.device]
        for kv in args.set:
            argv_train += ["--set", kv]
        t0 = time.perf_counter()
        rc = trainer.cli(argv_train)
        total = time.perf_counter() - t0
        records = [json.loads(line) for line in Path(out, "metrics.jsonl").read_text().splitlines()]
    if rc:
        raise SystemExit(f"train sac exited {rc}")
    rate, n = steady_rate(records)
    first = next(r for r in records if "critic_loss" in r)
    res = {"benchmark": "sac_trainer", "device": args.device, "preset": args.preset, "updates": args.updates,
           "updates_per_s": rate, "measured_updates": n,
           "seconds_to_first_learning_update": first["time"] - records[0]["time"],
           "total_s": total, "overrides": args.set}
    path = C.write(f"sac_trainer_{args.device.split(':')[0]}_{args.preset}", res, args.json)
    print(f"SAC trainer --preset {args.preset} on {args.device}: {rate:.1f} updates/s over {n} learning updates "
          f"(first learning update {res['seconds_to_first_learning_update']:.1f} s after the first record; {total:.1f} s in all)")
    print(f"wrote {path}")
    return res


if __name__ == "__main__":
    main(sys.argv[1:])
