#!/usr/bin/env bash
# Rebuild the committed tables and figures of results/fidelity/ from the run folders of run_study.sh.
#   bash tools/studies/fidelity_collect.sh            (OUT as in run_study.sh, default results/fidelity-runs)
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-results/fidelity-runs}
DEST=results/fidelity
mkdir -p "$DEST/plots"
for scale in "$OUT"/*/; do
  name=$(basename "$scale")
  if ! python runner.py leaderboard --results "$scale" --matrices > "$DEST/$name.md.tmp" 2>/dev/null; then
    rm -f "$DEST/$name.md.tmp"; echo "skipped $name (no finished run yet)"; continue
  fi
  mv "$DEST/$name.md.tmp" "$DEST/$name.md"
  for run in "$scale"iamcl2r/*/*/seed*/; do
    strategy=$(basename "$(dirname "$run")")
    if [ -f "$run/metrics.json" ] && grep -q '"complete": true' "$run/metrics.json"; then
      cp "$run/compatibility_matrix.png" "$DEST/plots/$name-$strategy.png"
    fi
  done
done
python tools/scale_summary.py "$OUT" > "$DEST/summary.md"
