#!/usr/bin/env bash
# Issue 56 on a lent GPU, in stages over warm calls of the workplace's device tool (64 MiB travel per call, so the
# data arrive in parts). Every stage runs from the repository root there; work and logs go to $W, data to $D.
#   device.sh setup           wheels into /tmp/site, CIFAR-10 batches; starts the loop benchmarks in the background
#   device.sh unpack DIR      a part of Tiny ImageNet carried in DIR (a .tar.gz part, or a piece of the rest)
#   device.sh protocol        in the background, once the benchmarks end: decode, pretrain, the d-Simplex-HOC run
#   device.sh wait SECONDS    until the protocol ends or SECONDS pass, then everything into $OUT/speed.tgz
# What it times: tools/bench_training_loop.py --variants and tools/profile_training.py on generated images (GPU
# alone), then the decoded-image caches, `runner.py pretrain` (the replacement models) and `runner.py run`
# (preset fidelity, seed 42) each from command to exit, with nvidia-smi sampled every 2 s.
set -uo pipefail
W=${W:-/tmp/speed}
D=${D:-/tmp/data}
mkdir -p "$W" "$D"
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
stamp() { echo "$(date +%s.%N) $*" >> "$W/timeline.txt"; }

timed() {  # timed NAME COMMAND...: run it, log its output, note its start, end and exit status
  local name=$1
  shift
  stamp "start $name"
  "$@" > "$W/$name.log" 2>&1
  stamp "end $name rc=$?"
}

benchmarks() {
  timed bench_fp16 python3 -m tools.bench_training_loop --backbone resnet18 --strategy dsimplex_hoc \
    --amp float16 --images 16384 --epochs 1 --repeats 2 --device cuda
  timed bench_fp16_graphs python3 -m tools.bench_training_loop --backbone resnet18 --strategy dsimplex_hoc \
    --amp float16 --compile reduce-overhead --images 16384 --epochs 1 --repeats 2 --device cuda
  timed profile_fp16 python3 -m tools.profile_training --amp float16 --json "$W/profile_fp16.json"
  stamp "benchmarks done"
}

protocol() {
  until grep -q "benchmarks done" "$W/timeline.txt" 2>/dev/null; do sleep 1; done
  nvidia-smi --query-gpu=timestamp,memory.used,utilization.gpu --format=csv -l 2 > "$W/smi.csv" 2>&1 &
  local smi=$!
  local args=(--preset fidelity --data-root "$D" --no-progress)
  timed decode python3 -c "import sys; from cl2r_bench.data.tiny_imagenet import read_tiny_imagenet; \
from cl2r_bench.data.cifar import read_cifar; read_tiny_imagenet(sys.argv[1]); read_cifar('cifar10', sys.argv[1])" "$D"
  timed pretrain python3 runner.py pretrain "${args[@]}" --strategy dsimplex_hoc
  timed run python3 runner.py run "${args[@]}" --strategy dsimplex_hoc --seed 42 --output "$W/runs"
  kill "$smi"
  stamp "protocol done"
}

case ${1:?stage} in
  setup)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
      .whl/*.whl || exit 1
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$W/gpu.txt"
    python3 -c "import torch, avalanche; print(torch.__version__, torch.version.cuda, avalanche.__version__, \
torch.cuda.get_device_name())" | tee "$W/versions.txt"
    (cd data/gpu/c && sha256sum -c --quiet SHA256SUMS) || exit 1
    mkdir -p "$D/cifar-10-jpeg" && tar -xzf data/gpu/c/cifar-10-jpeg.tar.gz -C "$D/cifar-10-jpeg"
    timed cifar_batches python3 data/gpu/c/to_batches.py "$D/cifar-10-jpeg" "$D"
    stamp "setup done"
    setsid nohup bash "$0" benchmarks > "$W/benchmarks.out" 2>&1 < /dev/null &
    ;;
  benchmarks) benchmarks ;;
  unpack)
    dir=${2:?unpack DIR}
    sums=$PWD/data/gpu/t01/SHA256SUMS
    if ls "$dir"/*.tar.gz > /dev/null 2>&1; then
      (cd "$dir" && sha256sum -c --quiet --ignore-missing "$sums") || exit 1
      for part in "$dir"/*.tar.gz; do tar -xzf "$part" -C "$D"; done
    fi
    mkdir -p "$W/pieces" && cp "$dir"/piece.* "$W/pieces/" 2>/dev/null
    if [ "$(ls "$W/pieces" | wc -l)" = 3 ]; then
      mkdir -p /tmp/parts && cat "$W"/pieces/piece.* | tar -x -C /tmp/parts
      (cd /tmp/parts && sha256sum -c --quiet --ignore-missing "$sums") || exit 1
      for part in /tmp/parts/*.tar.gz; do tar -xzf "$part" -C "$D"; done
      rm -rf /tmp/parts "$W/pieces"
    fi
    stamp "unpacked $dir"
    echo "train classes unpacked: $(ls "$D/tiny-imagenet-200/train" 2>/dev/null | wc -l)"
    ;;
  protocol)
    setsid nohup bash "$0" protocol_now > "$W/protocol.out" 2>&1 < /dev/null &
    ;;
  protocol_now) protocol ;;
  wait)
    limit=$(( $(date +%s) + ${2:?wait SECONDS} ))
    while [ "$(date +%s)" -lt "$limit" ] && ! grep -q "protocol done" "$W/timeline.txt" 2>/dev/null; do sleep 2; done
    cat "$W/timeline.txt"
    tail -n 3 "$W"/*.log
    tar -czf "$OUT/speed.tgz" --exclude='*.pt' --exclude='*.pth' -C "$W" . && ls -la "$OUT"
    ;;
esac
