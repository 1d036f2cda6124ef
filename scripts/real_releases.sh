#!/usr/bin/env bash
# Run kllint on the real RL releases named in issue 2 and time each run.
# Usage: scripts/real_releases.sh [DIR]   (DIR: where to download, outside the repo)
set -euo pipefail
dir=${1:-/tmp/kllint-real}
mkdir -p "$dir" && cd "$dir"
pip download --quiet --no-deps trl==0.14.0 verl==0.4.1 openrlhf==0.8.11 -d .
for wheel in *.whl; do name=${wheel%%-*}; [ -d "$name" ] || python3 -m zipfile -e "$wheel" "$name"; done
for pkg in trl/trl verl/verl "openrlhf/openrlhf-0.8.11.data/purelib/openrlhf"; do
  echo "== $pkg"
  /usr/bin/time -f "%e s wall, %M KB max RSS" kllint "$pkg" --format concise --exit-zero
done
