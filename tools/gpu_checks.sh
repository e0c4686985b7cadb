#!/usr/bin/env bash
# The GPU proof of issues 22 and 23, for a session lent a GPU: after `bash tools/gpu_prepare.sh` (which
# also copies this to .gpu/checks.sh), on the GPU machine `bash .gpu/run.sh` (it runs this with
# $OUT set). Only a few files come back from $OUT: summary.txt as it goes, results.tgz re-packed
# at every step, and audit-cuda.tgz after the audit.
# STEPS picks steps by number (default: all, about 600 s with the compiles of steps 2 and 4: more than one
# call leaves after a start). Two calls: `STEPS="1 2 4" bash .gpu/run.sh` (the speed figures), then
# `STEPS="3 5 6 7" bash .gpu/run.sh` (the CUDA audit and the rest) if the session has the time.
set -u
STEPS=${STEPS:-1 2 3 4 5 6 7}
want() { [[ " $STEPS " == *" $1 "* ]]; }
OUT=${OUT:-/tmp/gpu-out}
R=/tmp/gpu-results && rm -rf "$R" && mkdir -p "$R"
# each step re-packs the results so far: a run cut off at the call's time limit still brings them back
say() { tar -czf "$OUT/results.tgz" -C /tmp gpu-results; echo "=== [${SECONDS}s] $*" | tee -a "$OUT/summary.txt"; }
keep() { tee -a "$OUT/summary.txt"; }
say "device: $(python3 -c 'import torch; print(torch.cuda.get_device_name(), "torch", torch.__version__)')"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | keep

if want 1; then
say "1 the captured SAC update follows the eager one on CUDA; the fast paths against the plain formulas"
timeout 150 python3 -m pytest -q -p no:cacheprovider conformance_tests/meta/test_sac_graph.py \
  conformance_tests/meta/test_sac_fastpaths.py 2>&1 | tail -4 | keep
fi

if want 2; then
say "2 SAC update at the V2 shape vs TorchRL (eager, captured, captured with compiled objectives; wall time, launches)"
timeout 270 python3 -m tools.benchmarks.bench_sac_update --device cuda --rounds 15 \
  --json "$R/sac_update_cuda.json" 2>&1 | tail -6 | keep
say "2b where the update's GPU time goes (kernel classes; eager and compiled heads) and the Top-p plans captured"
timeout 180 python3 -m tools.benchmarks.bench_sac_breakdown --device cuda --rounds 10 \
  --json "$R/sac_breakdown_cuda.json" 2>&1 | tail -6 | keep
fi

if want 3; then
say "3 every clause on CUDA: rlconform audit --device cuda"
timeout 200 rlconform audit --device cuda --jobs 12 --out /tmp/audit-cuda > /tmp/audit-cuda.log 2>&1
echo "audit --device cuda rc=$?" | keep
grep -m1 -A1 "Summary" /tmp/audit-cuda/checklist.md | keep
cp /tmp/audit-cuda.log /tmp/audit-cuda/ 2>/dev/null
tar -czf "$OUT/audit-cuda.tgz" -C /tmp audit-cuda 2>/dev/null
fi

if want 4; then
say "4 SAC trainer --preset full: updates/s, captured update, then with its fused heads compiled"
timeout 150 python3 -m tools.benchmarks.bench_sac_trainer --device cuda --preset full --updates 150 \
  --json "$R/sac_trainer_cuda_full.json" 2>&1 | tail -2 | keep
timeout 200 python3 -m tools.benchmarks.bench_sac_trainer --device cuda --preset full --updates 150 \
  --set compile=True --json "$R/sac_trainer_cuda_full_compiled.json" 2>&1 | tail -2 | keep
fi

if want 5; then
say "5 host syncs, PPO epoch vs sb3-contrib"
timeout 60 python3 -m tools.benchmarks.bench_host_syncs --device cuda --json "$R/host_syncs_cuda.json" 2>&1 | tail -2 | keep
timeout 60 python3 -m tools.benchmarks.bench_ppo_epoch --device cuda --rounds 5 --json "$R/ppo_epoch_cuda.json" 2>&1 \
  | tail -1 | keep
fi

if want 6; then
say "6 GPU busy fraction: IS-Reshape LM trainer, SAC trainer (full preset)"
timeout 120 python3 -m tools.benchmarks.bench_trainer_busy --json "$R/busy_isreshape_lm.json" isreshape-lm \
  --updates 40 --out /tmp/isr-busy --device cuda 2>&1 | tail -2 | keep
timeout 120 python3 -m tools.benchmarks.bench_trainer_busy --json "$R/busy_sac_full.json" sac \
  --preset full --updates 120 --out /tmp/sac-busy --device cuda 2>&1 | tail -2 | keep
fi

if want 7; then
say "7 GPU busy fraction: CCAPO TextWorld trainer (episodes/s; the games were compiled by gpu_prepare.sh)"
if [ -f .gpu/data/twgames.tgz ]; then
  tar -xzf .gpu/data/twgames.tgz -C /tmp
  timeout 90 python3 -m tools.benchmarks.bench_trainer_busy --json "$R/busy_ccapo_textworld.json" ccapo-textworld \
    --out /tmp/tw-busy --arms ccapo --updates 10 --games-dir /tmp/games --device cuda 2>&1 | tail -2 | keep
else
  echo "no .gpu/data/twgames.tgz: run tools/gpu_prepare.sh" | keep
fi
fi

say "done"
