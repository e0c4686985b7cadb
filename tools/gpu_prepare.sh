#!/usr/bin/env bash
# Fill .gpu/ for a session lent a GPU (run from the project root, then `bash .gpu/run.sh` there with .gpu
# carried). On top of ../shared/gpu/prepare.sh it adds:
# - TextWorld and its pure-Python dependencies, pinned to the versions a dev install resolves (newer TatSu
#   breaks textworld 1.7); jericho 3.3 has no wheel on PyPI, so it is built here (its libfrotz.so needs only
#   glibc 2.22);
# - the default single-room games, compiled here (the GPU machine then only plays them);
# - tools/gpu_checks.sh as the checks.
set -euo pipefail
[ -f pyproject.toml ] || { echo "run me from the project root" >&2; exit 2; }
python3 -c "import rlconform, textworld" 2>/dev/null \
  || { echo "python3 lacks rlconform or textworld: activate a venv with pip install -e '.[textworld]'" >&2; exit 2; }
EXTRA_WHEELS="textworld==1.7.0 tatsu==5.8.3 mementos==1.3.1 hashids==1.3.1 more-itertools==11.2.1 \
  prompt-toolkit==3.0.53 wcwidth==0.9.4 termcolor==3.3.0" \
  bash ../shared/gpu/prepare.sh
python3 -m pip wheel -q --no-deps -w .gpu/whl jericho==3.3.1
games=$(mktemp -d)
# one update is enough to compile the 12 training and 12 held-out games of the default configuration
python3 -m rlconform.cli train ccapo-textworld --out "$games/run" --arms ccapo --updates 1 \
  --games-dir "$games/games" > "$games/log.txt" 2>&1 || { tail -20 "$games/log.txt"; exit 1; }
tar -czf .gpu/data/twgames.tgz -C "$games" games && rm -rf "$games"
cp tools/gpu_checks.sh .gpu/checks.sh
du -sh .gpu
