#!/usr/bin/env bash
# Rebuild the committed tables and figures of results/fidelity/ from the run folders of run_study.sh.
#   bash results/fidelity/collect.sh            (OUT as in run_study.sh, default results/fidelity-runs)
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-results/fidelity-runs}
DEST=results/fidelity
mkdir -p "$DEST/plots"
for scale in "$OUT"/*/; do
  name=$(basename "$scale")
  python runner.py leaderboard --results "$scale" --matrices > "$DEST/$name.md"
  for run in "$scale"iamcl2r/*/*/seed*/; do
    strategy=$(basename "$(dirname "$run")")
    [ -f "$run/compatibility_matrix.png" ] && cp "$run/compatibility_matrix.png" "$DEST/plots/$name-$strategy.png"
  done
done
python tools/scale_summary.py "$OUT" > "$DEST/summary.md"
