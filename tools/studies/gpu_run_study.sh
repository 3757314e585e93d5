#!/usr/bin/env bash
# The GPU study: the paper protocol on the suite's real data (preset fidelity: Tiny ImageNet stream at
# 32x32, 50,000 CIFAR-10 queries, 70 epochs per task with the authors' epoch length and schedule, fp16 autocast),
# every run a process of its own on one GPU. Resumable: run it again and finished runs and cached models are kept.
#   DATA=data OUT=results/gpu-runs SEEDS="42 1 2" bash tools/studies/gpu_run_study.sh
# Per backbone (resnet18: ER and d-Simplex-HOC; small_cnn: ER, d-Simplex-HOC, d-Simplex-FD, the fidelity study's
# verdict) the replacement models of each head family are pretrained first, one process per family; then every
# (strategy, seed) run starts at once. Then: python runner.py leaderboard --results "$OUT" --matrices
set -euo pipefail
cd "$(dirname "$0")/../.."
DATA=${DATA:-data}
OUT=${OUT:-results/gpu-runs}
read -r -a seeds <<< "${SEEDS:-42 1 2}"
mkdir -p "$OUT/logs"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
PYTHON=${PYTHON:-python}
"$PYTHON" -c "import sys; from cl2r_bench.data.datasets import read_tiny_imagenet; read_tiny_imagenet(sys.argv[1])" "$DATA"

study() {  # study BACKBONE STRATEGY...: pretrain both head families, then all runs of the backbone at once
  local backbone=$1 strategy seed family
  shift
  local args=(--preset fidelity --data-root "$DATA" --no-progress --set "model.backbone=$backbone")
  for family in er dsimplex_hoc; do
    "$PYTHON" runner.py pretrain "${args[@]}" --strategy "$family" > "$OUT/logs/pretrain-$backbone-$family.log" 2>&1 &
  done
  wait
  for strategy in "$@"; do
    for seed in "${seeds[@]}"; do
      "$PYTHON" runner.py run "${args[@]}" --strategy "$strategy" --seed "$seed" --resume \
        --output "$OUT/$backbone-e70" > "$OUT/logs/$backbone-$strategy-seed$seed.log" 2>&1 &
    done
  done
  wait
}

study resnet18 er dsimplex_hoc &
study small_cnn er dsimplex_hoc dsimplex_fd &
wait
echo "study finished"
