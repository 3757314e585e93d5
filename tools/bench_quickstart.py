"""Benchmark: the README's quick start (its first command after the install), from a cold cache, timed whole.

The command is read from the README's first code block, so the figure follows what a newcomer types. Each
repeat runs it in a fresh folder (replacement models pretrained again, nothing cached) as a subprocess, and
prints the wall time with its parts from ``metrics.json``: replacement pretraining, training, evaluation, and
the rest (interpreter start, imports, data generation, plots). Measure on idle cores: another heavy process
slows it sharply.

    python -m tools.bench_quickstart [--repeats 2]
"""
from __future__ import annotations

import argparse
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.record import RECORD_FILE, read_record

ROOT = Path(__file__).resolve().parents[1]


def quickstart_command() -> list[str]:
    """The ``python runner.py ...`` part of the README's first line."""
    first = next(line for line in (ROOT / "README.md").read_text().splitlines() if "runner.py" in line)
    command = shlex.split(first[first.index("python runner.py"):])
    return [sys.executable, str(ROOT / "runner.py"), *command[2:]]


def timed_run(command: list[str], folder: Path) -> dict[str, float]:
    started = time.perf_counter()
    subprocess.run([*command, "--output", str(folder / "results"), "--no-progress", "--set",
                    f"replacement.pretrain.cache_dir={folder / 'cache'}"], check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - started
    record = read_record(next((folder / "results").rglob(RECORD_FILE)))
    t = record["timings"]
    parts = {"pretrain": t["pretrain_seconds"], "train": t["train_seconds"], "eval": t["eval_seconds"]}
    return {"wall": wall, **parts, "other": wall - sum(parts.values())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    command = quickstart_command()
    print("quick start:", " ".join(command[1:]))
    runs = []
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory() as folder:
            runs.append(timed_run(command, Path(folder)))
            print("  " + "  ".join(f"{k} {v:.1f} s" for k, v in runs[-1].items()))
    print("median: " + "  ".join(f"{k} {statistics.median(r[k] for r in runs):.1f} s" for k in runs[0]))


if __name__ == "__main__":
    main()
