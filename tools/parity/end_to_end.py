"""End-to-end parity: the authors' IAM-CL2R code and the suite on the same data and replacement models.

    python -m tools.parity.end_to_end --iamcl2r REF/iamcl2r --data-root data --work /tmp/parity-e2e \\
        [--reference-python REF/venv/bin/python] [--strategies er hoc] [--seeds 1 2 3] [--epochs 3] \\
        [--images-per-class 50] [--eval-per-class 200] [--out results/parity/end_to_end.json]

* Data: the first 100 Tiny ImageNet classes (32x32, sorted wnids) written as ``cifar-100-python`` pickles, so the
  authors' loader reads them unchanged (train: all 500 images, test: the 50 val images; both codes keep the first
  ``--images-per-class``), and CIFAR-10 (``cifar-10-batches-py``, the first ``--eval-per-class`` images of each class
  of each split: queries from train, gallery from test).
* Replacement models: ResNet-18s pretrained by the suite (cosine schedule) on 25 / 50 / 100 Tiny ImageNet classes
  outside the stream, one per family; the suite reads them as plain state dicts, the authors' code as converted
  ``{'net': ...}`` files under a path containing "pretrained" (their loader drops the classifier only then).
* Runs: one at a time, the reference under its own Python (``main()`` with torchvision's md5 check bypassed, wandb
  disabled), the suite through ``runner.py``; each run's wall time and peak memory by ``/usr/bin/time``. Finished
  runs are kept in ``--work`` and skipped when the script runs again.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import torch
import yaml

from benchmarks.record import RECORD_FILE, read_record
from cl2r_bench.config import resolve
from cl2r_bench.data.cifar import read_cifar
from cl2r_bench.data.datasets import DataError
from cl2r_bench.data.tiny_imagenet import read_tiny_imagenet
from cl2r_bench.models import replacement_family
from cl2r_bench.settings import RunSettings
from cl2r_bench.training.pretrain import pretrained_replacement
from tools.parity.common import (  # noqa: I001
    ROOT,
    ParityError,
    first_per_class,
    reference_checkout,
    reference_python,
    save_reference_checkpoint,
    to_reference_state,
    write_cifar_pickles,
)

STREAM_CLASSES = 100
PRETRAIN_COUNTS = (25, 50, 100)
SUITE_STRATEGY = {"er": "er", "hoc": "dsimplex_hoc"}
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
LOG_TIME = "%d.%m.%Y %H:%M:%S"   # the time stamps of the authors' log files
DRIVER = """
import sys
import torchvision.datasets.cifar as cifar
cifar.check_integrity = lambda *args, **kwargs: True
from iamcl2r.main import main
sys.argv = ["iamcl2r", "-c", sys.argv[1]]
main()
"""


def write_data(data_root: Path, work: Path, eval_per_class: int) -> Path:
    """The stream and the evaluation set as official CIFAR pickles under ``work/data-eval<N>`` (written once per
    evaluation size, so one work folder serves the parity runs and the timed pair with their replacement models)."""
    root = work / f"data-eval{eval_per_class}"
    if (root / "cifar-10-batches-py" / "test_batch").is_file():
        return root
    try:
        tiny = read_tiny_imagenet(data_root)
        cifar10 = read_cifar("cifar10", data_root, verify="off")
    except DataError as exc:
        raise ParityError(str(exc)) from None
    stream = [tiny.train.select(torch.nonzero(tiny.train.labels < STREAM_CLASSES).flatten()),
              tiny.test.select(torch.nonzero(tiny.test.labels < STREAM_CLASSES).flatten())]
    write_cifar_pickles(root / "cifar-100-python", *stream, tiny.class_names[:STREAM_CLASSES], "cifar-100-python")
    write_cifar_pickles(root / "cifar-10-batches-py", first_per_class(cifar10.train, eval_per_class),
                        first_per_class(cifar10.test, eval_per_class), list(cifar10.class_names), "cifar-10-batches-py")
    return root


def replacement_models(data_root: Path, work: Path, images_per_class: int, epochs: int) -> dict[str, list[Path]]:
    """Per head family, the suite-pretrained models (cached in ``work``) and their reference conversions."""
    tiny = read_tiny_imagenet(data_root)
    run_settings = RunSettings.from_config(resolve([("parity", {"model": {"backbone": "resnet18"}})]))
    settings = dataclasses.replace(run_settings.training, epochs=epochs, lr=0.1, lr_min=1e-4, progress=False)
    device = torch.device("cpu")
    out: dict[str, list[Path]] = {}
    for family in ("learnable", "dsimplex"):
        paths = []
        for k, count in enumerate(PRETRAIN_COUNTS):
            classes = list(range(STREAM_CLASSES, STREAM_CLASSES + count))
            path, _ = pretrained_replacement(tiny, classes, head=family, model_kwargs=run_settings.model.build_kwargs,
                                             settings=settings,
                                             images_per_class=images_per_class, device=device, seed=k,
                                             cache_dir=work / "suite_models")
            state = torch.load(path, weights_only=True)
            converted = work / "pretrained_models" / family / f"ckpt_{k}.pt"
            if not converted.is_file():
                save_reference_checkpoint(to_reference_state(state, family, classes=count), converted)
            paths.append(path)
        out[family] = paths
    return out


def timed(command: list[str], log: Path, **kwargs) -> dict:
    """Run ``command`` under /usr/bin/time; wall seconds and peak resident memory (MiB)."""
    stats = log.with_suffix(".time")
    started = time.perf_counter()
    with open(log, "w") as out:
        done = subprocess.run(["/usr/bin/time", "-f", "%M", "-o", str(stats)] + command, stdout=out,
                              stderr=subprocess.STDOUT, **kwargs)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise ParityError(f"{' '.join(command[:3])} failed (exit {done.returncode}); see {log}")
    return {"wall_s": wall, "peak_rss_mib": int(stats.read_text().split()[-1]) / 1024}


def reference_run(args, refs: dict, python: Path, data: Path, strategy: str, seed: int, folder: Path) -> dict:
    base = yaml.safe_load((refs["iamcl2r"] / "configs" / f"{strategy}_7tasks.yaml").read_text())
    family = "dsimplex" if strategy == "hoc" else "learnable"
    cfg = {**base, "data_path": str(data), "output_folder": str(folder / "out"), "epochs": args.epochs,
           "img_per_class": args.images_per_class, "seed": seed, "num_workers": 0, "eval_period": args.epochs,
           "learning_rate": 0.001, "momentum": 0.9,
           "pretrained_model_path": [str(args.work / "pretrained_models" / family / f"ckpt_{k}.pt") for k in range(3)]}
    shutil.rmtree(folder / "out", ignore_errors=True)  # an earlier run's files would be parsed instead
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.yaml").write_text(yaml.safe_dump(cfg))
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(refs["iamcl2r"] / "src"), "WANDB_MODE": "disabled",
           "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1", "HOME": str(folder),
           **{k: v for k, v in os.environ.items() if k in THREAD_VARIABLES}}
    stats = timed([str(python), "-c", DRIVER, str(folder / "config.yaml")], folder / "run.log", cwd=folder, env=env)
    return {**parse_reference_run(folder), **stats}


def parse_reference_run(folder: Path) -> dict:
    """The matrix (from their ``comp-matrix.txt``), training seconds (the sum of their per-epoch ``Time:``) and
    evaluation seconds (from "Starting Evaluation" to the last log line) of a finished reference run."""
    text = next((folder / "out").rglob("comp-matrix.txt")).read_text()
    values = [float(x) for x in re.findall(r"\d+\.\d*(?:e[-+]?\d+)?", text.split("Avg. Comp.")[0])]
    tasks = math.isqrt(len(values))
    matrix = [[values[t * tasks + k] for k in range(t + 1)] for t in range(tasks)]
    train_log = next((folder / "out").rglob("train-*.log")).read_text()
    epoch_seconds = [float(x) for x in re.findall(r"Training Loss: .*?Time: ([\d.]+)", train_log)]
    stamp = r"^(\d\d\.\d\d\.\d{4} \d\d:\d\d:\d\d)"
    stamps = [datetime.strptime(m, LOG_TIME) for m in re.findall(stamp + " .*Starting Evaluation", train_log, re.M)]
    last = datetime.strptime(re.findall(stamp, train_log, re.M)[-1], LOG_TIME)
    return {"matrix": matrix, "train_s": sum(epoch_seconds),
            "eval_s": (last - stamps[0]).total_seconds() if stamps else None}


def suite_run(args, data: Path, replacements: dict, strategy: str, seed: int, folder: Path) -> dict:
    name = SUITE_STRATEGY[strategy]
    family = replacement_family("dsimplex" if strategy == "hoc" else "learnable")
    checkpoints = "[" + ",".join(str(p) for p in replacements[family]) + "]"
    command = [sys.executable, str(ROOT / "runner.py"), "run", "--scenario", "iamcl2r", "--strategy", name,
               "--dataset", "cifar100", "--data-root", str(data), "--preset", "paper", "--epochs", str(args.epochs),
               "--seed", str(seed), "--output", str(folder), "--no-progress", "--overwrite",
               "--set", f"stream.images_per_class={args.images_per_class}",
               "--set", f"replacement.checkpoints={checkpoints}",
               "--set", "evaluation.plots=false", "--set", "data.verify=off"]
    folder.mkdir(parents=True, exist_ok=True)
    stats = timed(command, folder / "run.log", cwd=ROOT)
    record = read_record(next(folder.rglob(RECORD_FILE)))
    timings = record["timings"]
    return {"matrix": [[v for v in r] for r in record["compatibility_matrix"]], **stats,
            "train_s": timings["train_seconds"], "eval_s": timings["eval_seconds"],
            "train_images": sum(t["images"] for t in timings["tasks"])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iamcl2r", required=True, help="checkout of miccunifi/iamcl2r")
    parser.add_argument("--reference-python", help="the reference's interpreter (default: venv/bin/python beside it)")
    parser.add_argument("--data-root", required=True, help="folder holding tiny-imagenet-200/ and cifar-10-batches-py/")
    parser.add_argument("--work", type=Path, required=True, help="scratch folder (kept: finished runs are skipped)")
    parser.add_argument("--strategies", nargs="+", default=["er", "hoc"], choices=sorted(SUITE_STRATEGY))
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    parser.add_argument("--epochs", type=int, default=3, help="epochs per task (both codes)")
    parser.add_argument("--images-per-class", type=int, default=50, help="stream images per class (both codes)")
    parser.add_argument("--eval-per-class", type=int, default=200, help="CIFAR-10 queries and gallery per class")
    parser.add_argument("--pretrain-images", type=int, default=100, help="images per class of the replacements")
    parser.add_argument("--pretrain-epochs", type=int, default=3)
    parser.add_argument("--suite-runs", type=int, choices=(1, 2), default=1,
                        help="2: run the suite twice per seed, the first kept as 'suite_first_run' (a study's first "
                             "run also scores its replacement models; later runs read the scores from the cache)")
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "parity" / "end_to_end.json")
    args = parser.parse_args()
    refs = {"iamcl2r": reference_checkout(args.iamcl2r, "src/iamcl2r/methods/hoc.py", "miccunifi/iamcl2r")}
    python = reference_python(args.reference_python, refs["iamcl2r"])
    args.work = args.work.resolve()
    data = write_data(Path(args.data_root), args.work, args.eval_per_class)
    replacements = replacement_models(Path(args.data_root), args.work, args.pretrain_images, args.pretrain_epochs)
    results = json.loads(args.out.read_text()) if args.out.is_file() else {}
    for strategy in args.strategies:
        entry = results.setdefault(strategy, {"epochs": args.epochs, "images_per_class": args.images_per_class,
                                              "queries": 10 * args.eval_per_class, "suite": {}, "reference": {}})
        codes = ["reference"] + (["suite_first_run"] if args.suite_runs == 2 else []) + ["suite"]
        for seed in args.seeds:
            for code in codes:
                runs = entry.setdefault(code, {})
                if str(seed) in runs:
                    continue
                folder = args.work / f"{code}-{strategy}-seed{seed}-eval{args.eval_per_class}"
                print(f"{code} {strategy} seed {seed} ...", flush=True)
                runs[str(seed)] = (reference_run(args, refs, python, data, strategy, seed, folder)
                                   if code == "reference" else
                                   suite_run(args, data, replacements, strategy, seed, folder))
                args.out.parent.mkdir(parents=True, exist_ok=True)
                args.out.write_text(json.dumps(results, indent=1, allow_nan=False) + "\n")
                print(f"  {runs[str(seed)]['wall_s']:.0f}s, M[-1] = {runs[str(seed)]['matrix'][-1]}", flush=True)


if __name__ == "__main__":
    main()
