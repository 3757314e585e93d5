#!/usr/bin/env bash
# Issue 56, packing: N copies of the loop benchmark (tools/bench_training_loop.py, ResNet-18, d-Simplex-HOC's loss
# and teacher, fp16, CUDA graphs) started together on one GPU; each prints its own images per second, and their sum
# is what the packed GPU trains. Logs and nvidia-smi samples go to $OUT.
#   bash tools/studies/gpu_speed_packing.sh N
set -uo pipefail
n=${1:?N}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  > /dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=timestamp,memory.used,utilization.gpu --format=csv -l 1 > "$OUT/packing_smi.csv" 2>&1 &
smi=$!
start=$(date +%s.%N)
pids=()
for i in $(seq 1 "$n"); do
  python3 -m tools.bench_training_loop --backbone resnet18 --strategy dsimplex_hoc --amp float16 --images 32768 \
    --epochs 1 --device cuda --repeats 2 --compile reduce-overhead > "$OUT/packing_$i.log" 2>&1 &
  pids+=($!)
done
wait "${pids[@]}"
end=$(date +%s.%N)
kill "$smi"
echo "$n processes, wall $(python3 -c "print(round($end - $start, 1))") s" | tee "$OUT/packing_wall.txt"
grep -h "median" "$OUT"/packing_*.log
