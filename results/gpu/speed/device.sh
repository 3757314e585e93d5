#!/usr/bin/env bash
# Issue 56 on a lent GPU, over warm calls of the workplace's device tool (64 MiB travel per call beside the working
# tree, so the data arrive in parts: results/gpu/speed/data_parts.py). Every stage runs from the repository root
# there; work and logs go to $W, data to $D, the carried parts to $P.
#   [PROTOCOL_ONLY=1] device.sh setup  wheels into /tmp/site, the first part; starts the pipeline in the background
#   device.sh part         copies the part this call carries (.gpu/pN) into $P
#   device.sh wait SECONDS until the pipeline ends or SECONDS pass, then $W (no weights) into $OUT/speed.tgz
# The pipeline, alone on the GPU and in this order, nvidia-smi sampled every 2 s throughout:
#   1. while the parts arrive, the loop benchmark (the suite's loop against a plain PyTorch loop, generated images)
#      eager fp16, then with CUDA graphs (training.compile: reduce-overhead);
#   2. once every part is in: the data rebuilt and checked (SHA-256 of every image array);
#   3. `runner.py pretrain` (the 3 replacement ResNet-18s, side by side), then `runner.py run` (preset fidelity, d-Simplex-HOC,
#      seed 42), each timed from command to exit, with CUDA graphs when the benchmark found them 1.2x faster
#      (and again without them, resuming, if they fail);
#   4. the torch profiler over the loop, eager and with graphs.
# PROTOCOL_ONLY=1 (set for the setup stage) skips 1 and 4 and runs the protocol with graphs: the benchmarks and
# profiles are in raw-graphs/, and the device time (about 360 s of pretraining and 314 s of run, projected) is short.
set -uo pipefail
W=${W:-/tmp/speed}
D=${D:-/tmp/data}
P=${P:-/tmp/parts}
mkdir -p "$W" "$D" "$P"
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
stamp() { echo "$(date +%s.%N) $*" >> "$W/timeline.txt"; }

timed() {  # timed NAME LIMIT COMMAND...: run it under a time limit, log its output, note start, end and exit status
  local name=$1 limit=$2
  shift 2
  stamp "start $name"
  timeout "$limit" "$@" > "$W/$name.log" 2>&1
  stamp "end $name rc=$?"
}

loop_rate() {  # the suite loop's images per second in a benchmark log (0 when absent)
  local rate
  rate=$(grep -o "suite: median [0-9.]*s *([0-9]* images/s)" "$W/$1.log" 2>/dev/null | tail -1 | grep -o "([0-9]*" | tr -d '(')
  echo "${rate:-0}"
}

LOOP=(--backbone resnet18 --strategy dsimplex_hoc --amp float16 --images 16384 --epochs 1 --device cuda)

benchmarks() {
  timed bench_eager 240 python3 -m tools.bench_training_loop "${LOOP[@]}" --repeats 2
  timed bench_graphs 300 python3 -m tools.bench_training_loop "${LOOP[@]}" --repeats 2 --compile reduce-overhead
  stamp "benchmarks done"
}

protocol() {
  local expected
  expected=$(cat "$P/expected.txt")
  until [ "$(ls "$P" | wc -l)" -ge "$expected" ]; do sleep 1; done
  timed unpack 300 python3 results/gpu/speed/data_parts.py unpack "$P" "$D" || return
  grep -q "every SHA-256 equal" "$W/unpack.log" || { stamp "data check failed"; return; }
  local args=(--preset fidelity --data-root "$D" --no-progress --strategy dsimplex_hoc)
  local plain=("${args[@]}")
  if [ -n "${COMPILE:-}" ]; then
    args+=(--set "training.compile=$COMPILE")
  fi
  stamp "protocol settings: ${args[*]}"
  pretrain_packed "${args[@]}"
  if ! grep -q "rc=0" <(grep "end pretrain" "$W/timeline.txt"); then
    timed pretrain_eager 600 python3 runner.py pretrain "${plain[@]}"
  fi
  timed run 900 python3 runner.py run "${args[@]}" --seed 42 --output "$W/runs"
  if ! ls "$W"/runs/*/*/*/seed42/metrics.json > /dev/null 2>&1; then
    timed run_eager 900 python3 runner.py run "${plain[@]}" --seed 42 --output "$W/runs" --resume
  fi
}

pretrain_packed() {  # the fidelity preset's 3 replacement models (tasks 0/2/4: 25/50/100 classes, seeds 0/1/2)
  # pretrained side by side, one process each: the same cache keys, and so the same models, as one `runner.py
  # pretrain` makes one after the other (checked on the CPU: equal weights), in the time of the largest
  local tasks=(0 2 4) counts=(25 50 100) pids=() i rc=0
  stamp "start pretrain"
  for i in 0 1 2; do
    timeout 600 python3 runner.py pretrain "$@" --set "replacement.tasks=[${tasks[i]}]" \
      --set "replacement.pretrain.class_counts=[${counts[i]}]" --set "replacement.pretrain.seed=[$i]" \
      > "$W/pretrain_$i.log" 2>&1 &
    pids+=($!)
  done
  for i in "${pids[@]}"; do wait "$i" || rc=1; done
  stamp "end pretrain rc=$rc"
}

pipeline() {
  nvidia-smi --query-gpu=timestamp,memory.used,utilization.gpu --format=csv -l 2 > "$W/smi.csv" 2>&1 &
  local smi=$!
  if [ -n "${PROTOCOL_ONLY:-}" ]; then
    COMPILE=reduce-overhead protocol
    kill "$smi"
    stamp "pipeline done"
    return
  fi
  benchmarks
  COMPILE=$(python3 -c "import sys; e, g = float(sys.argv[1] or 0), float(sys.argv[2] or 0); \
print('reduce-overhead' if g > 1.2 * e > 0 else '')" "$(loop_rate bench_eager)" "$(loop_rate bench_graphs)")
  stamp "graphs for the protocol: ${COMPILE:-no}"
  COMPILE=$COMPILE protocol
  timed profile_eager 180 python3 -m tools.profile_training "${LOOP[@]}" --json "$W/profile_eager.json"
  timed profile_graphs 240 python3 -m tools.profile_training "${LOOP[@]}" --compile reduce-overhead \
    --json "$W/profile_graphs.json"
  kill "$smi"
  stamp "pipeline done"
}

case ${1:?stage} in
  setup)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
      .whl/*.whl || exit 1
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$W/gpu.txt"
    python3 -c "import torch, avalanche, PIL, sys; print(sys.version.split()[0], torch.__version__, \
torch.version.cuda, avalanche.__version__, PIL.__version__, torch.cuda.get_device_name())" | tee "$W/versions.txt"
    cp .gpu/p1/* "$P/" && ls "$P" | wc -l
    stamp "setup done"
    PROTOCOL_ONLY=${PROTOCOL_ONLY:-} setsid nohup bash "$0" pipeline > "$W/pipeline.out" 2>&1 < /dev/null &
    ;;
  pipeline) pipeline ;;
  part)
    cp .gpu/p*/* "$P/" && echo "parts in: $(ls "$P" | wc -l) of $(cat "$P/expected.txt")"
    tail -n 2 "$W/timeline.txt"
    ;;
  wait)
    limit=$(( $(date +%s) + ${2:?wait SECONDS} ))
    while [ "$(date +%s)" -lt "$limit" ] && ! grep -q "pipeline done" "$W/timeline.txt" 2>/dev/null; do sleep 2; done
    cat "$W/timeline.txt"
    tail -n 4 "$W"/*.log
    tar -czf "$OUT/speed.tgz" --exclude='*.pt' --exclude='*.pth' --exclude='*.npz' -C "$W" . && ls -la "$OUT"
    ;;
esac
