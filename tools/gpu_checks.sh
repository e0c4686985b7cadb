#!/usr/bin/env bash
# The GPU proof of issues 22 and 23, for a session lent a GPU: after `bash ../shared/gpu/prepare.sh`,
# `cp tools/gpu_checks.sh .gpu/checks.sh`, then on the GPU machine `bash .gpu/run.sh` (it runs this with
# $OUT set; about 400 s). Only a few files come back from $OUT: the audit goes in one tarball.
set -u
OUT=${OUT:-/tmp/gpu-out}
dev=$(python3 -c "import torch; print(torch.cuda.get_device_name())")
echo "device: $dev" | tee "$OUT/summary.txt"
# 22: every clause passes on CUDA (exit 0); the report is the site's published CUDA audit
timeout 220 rlconform audit --device cuda --jobs 8 --out /tmp/audit-cuda > /tmp/audit-cuda.log 2>&1
echo "audit --device cuda rc=$?" | tee -a "$OUT/summary.txt"
grep -m1 "Verdict" /tmp/audit-cuda/checklist.md | tee -a "$OUT/summary.txt"
cp /tmp/audit-cuda.log /tmp/audit-cuda/
tar -czf "$OUT/audit-cuda.tgz" -C /tmp audit-cuda
# 23: the SAC update (wall time, kernel launches: both sides), host syncs, PPO, the trainer's updates/s
timeout 90 python3 -m tools.benchmarks.bench_sac_update --device cuda --rounds 7 --json "$OUT/sac_update_cuda.json" 2>&1 \
  | tail -4 | tee -a "$OUT/summary.txt"
timeout 40 python3 -m tools.benchmarks.bench_host_syncs --device cuda --json "$OUT/host_syncs_cuda.json" 2>&1 | tail -1 \
  | tee -a "$OUT/summary.txt"
timeout 50 python3 -m tools.benchmarks.bench_ppo_epoch --device cuda --rounds 5 --json "$OUT/ppo_epoch_cuda.json" 2>&1 \
  | tail -1 | tee -a "$OUT/summary.txt"
start=$(date +%s.%N)
timeout 120 rlconform train sac --preset full --device cuda --updates 200 --out /tmp/sac-full > /tmp/sac-full.log 2>&1
echo "sac --preset full, 200 updates: rc=$? in $(echo "$(date +%s.%N) - $start" | bc) s" | tee -a "$OUT/summary.txt"
