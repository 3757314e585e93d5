#!/bin/bash
# Seeds 1 and 2 of the upgrade protocol, then dsimplex_fd on IAM-CL2R seed 0; one core, lowest priority.
cd /work/zoo-tree && . /work/main/.venv/bin/activate
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
for SEED in 1 2; do
for NAME in er bct lce unibct ract advbct bt2 bct_er lwf fd cvs cores dsimplex_fd dsimplex_hoc; do
  echo "=== start $NAME seed $SEED $(date -u)" >> /work/upgrade-runs/log.txt
  nice -n 19 python runner.py --scenario upgrade --strategy $NAME --dataset tinyimagenet --data-root /work/data \
    --preset quick --set stream.images_per_class=100 --set replacement.pretrain.epochs=3 --seeds $SEED \
    --output /work/upgrade-runs --no-progress >> /work/upgrade-runs/log.txt 2>&1
  echo "=== end $NAME seed $SEED rc=$? $(date -u)" >> /work/upgrade-runs/log.txt
done
done
