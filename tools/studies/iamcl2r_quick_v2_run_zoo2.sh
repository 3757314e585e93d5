#!/usr/bin/env bash
cd /work/zoo2-tree
. /work/main/.venv/bin/activate
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
for s in 2 1; do
  echo "=== $(date -u) START seed $s (commit $(git rev-parse --short HEAD))"
  nice -n 15 python -u runner.py --scenario iamcl2r --strategy all --dataset tinyimagenet --data-root /work/data --preset quick --seeds $s --output /work/zoo-runs --no-progress --resume
  echo "=== $(date -u) END seed $s rc=$?"
done
