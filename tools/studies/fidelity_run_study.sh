#!/usr/bin/env bash
# The scale study (see README.md here). Every step is resumable: run the script again after an
# interruption and it continues (pretraining from its last epoch, runs from their last finished task).
#   bash tools/studies/fidelity_run_study.sh small      # small CNN: replacements, then 2 / 6 / 20 epochs per task
#   bash tools/studies/fidelity_run_study.sh resnet18   # ResNet-18 (the paper's backbone): replacements, 5 / 20 / 70 epochs
# DATA (default data/) holds tiny-imagenet-200/ and cifar-10-batches-py/; OUT (default results/fidelity-runs).
# EPOCHS="2 6" runs only those epochs per task (default: the scale's three).
# SEEDS="1 2" runs those seeds of each strategy, one after another in its process (default: the configured seed, 42).
# INIT=shared gives every replacement model the same initialisation (replacement.pretrain.seed=0, the control of
# README.md; folders end in -shared-init); by default each has its own seed.
# STRATEGIES="dsimplex_fd bct_er" picks the strategies (default: er dsimplex_hoc); the replacement models of each
# strategy's head family are pretrained first (cached, so only once per family).
# PARALLEL=1 runs the strategies two at a time, one thread each (2 CPU cores without a GPU: two one-thread
# processes train faster than one two-thread process).
set -euo pipefail
cd "$(dirname "$0")/../.."
DATA=${DATA:-data}
OUT=${OUT:-results/fidelity-runs}
scale=${1:?give the scale: small or resnet18}
case "$scale" in
  small) backbone=small_cnn; epochs=(2 6 20) ;;
  resnet18) backbone=resnet18; epochs=(5 20 70) ;;
  *) echo "unknown scale $scale: small or resnet18" >&2; exit 2 ;;
esac
if [ -n "${EPOCHS:-}" ]; then read -r -a epochs <<< "$EPOCHS"; fi
common=(--preset fidelity --data-root "$DATA" --no-progress --set "model.backbone=$backbone")
if [ -n "${SEEDS:-}" ]; then read -r -a seeds <<< "$SEEDS"; common+=(--seeds "${seeds[@]}"); fi
suffix=
if [ "${INIT:-independent}" = shared ]; then
  common+=(--set replacement.pretrain.seed=0); suffix=-shared-init
fi

read -r -a strategies <<< "${STRATEGIES:-er dsimplex_hoc}"
# one strategy per replacement family, so that no two processes pretrain the same models
read -r -a pretrainers <<< "$(python -c '
import sys
from models import replacement_family
from strategies import get_strategy
first = {}
for name in sys.argv[1:]:
    first.setdefault(replacement_family(get_strategy(name).head), name)
print(*first.values())' "${strategies[@]}")"

each() {  # each "STRATEGY..." COMMAND...: the command once per strategy, two at a time with PARALLEL=1
  local names
  read -r -a names <<< "$1"; shift
  if [ "${PARALLEL:-0}" = 1 ]; then
    export OMP_NUM_THREADS=1
    local i pids strategy pid
    for ((i = 0; i < ${#names[@]}; i += 2)); do
      pids=()
      for strategy in "${names[@]:i:2}"; do "$@" --strategy "$strategy" & pids+=($!); done
      for pid in "${pids[@]}"; do wait "$pid"; done
    done
  else
    for strategy in "${names[@]}"; do "$@" --strategy "$strategy"; done
  fi
}

each "${pretrainers[*]}" python runner.py pretrain "${common[@]}"
for e in "${epochs[@]}"; do
  each "${strategies[*]}" python runner.py run "${common[@]}" --epochs "$e" --resume \
    --output "$OUT/$backbone-e$e$suffix"
done
