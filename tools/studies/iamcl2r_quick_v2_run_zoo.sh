#!/usr/bin/env bash
cd /work/main
. .venv/bin/activate
for s in 0 1 2; do
  echo "=== $(date -u) START seed $s (commit $(git rev-parse --short HEAD))"
  python -u runner.py --scenario iamcl2r --strategy all --dataset tinyimagenet --data-root /work/data --preset quick --seeds $s --output /work/zoo-runs --no-progress --resume
  rc=$?
  echo "=== $(date -u) END seed $s rc=$rc"
done
