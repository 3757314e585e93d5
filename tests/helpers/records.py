"""Hand-made result records, as the run loop, the model_update scenario and ``runner.py adapt`` write them, and
helpers to change and write them: the input of the leaderboard, report, plot and record tests."""
import copy
import json
from pathlib import Path

from benchmarks.metrics import all_metrics, as_matrix
from benchmarks.noise import noise_metrics

MATRIX = [[0.5, None, None], [0.55, 0.6, None], [0.58, 0.62, 0.7]]


def valid_record(seed: int = 1) -> dict:
    """A complete IAM-CL2R record shaped as ``experiment.Run.record`` writes it."""
    matrix = as_matrix(MATRIX)
    return {
        "scenario": "iamcl2r", "strategy": "er", "method": "er", "dataset": "synthetic", "seed": seed,
        "num_tasks": 3, "tasks_completed": 3, "complete": True, "replacement_tasks": [0, 2],
        "compatibility_matrix": MATRIX, "metrics": all_metrics(matrix),
        "evaluation": {"queries": 144, "gallery_images": 36, "mode": "templates",
                       "extractions": {"gallery": 3, "query": 3}},
        "stream": {"classes_per_task": [4, 4, 4], "train_images_per_task": [96, 96, 96],
                   "class_order": list(range(12))},
        "replacement_models": [{"task": 0, "path": "r0.pt", "source": "pretrained", "classes": 3, "own_accuracy": 0.4,
                                "own_accuracy_interval": [0.32, 0.48]},
                               {"task": 2, "path": "r2.pt", "source": "pretrained", "classes": 6, "own_accuracy": 0.5,
                                "own_accuracy_interval": [0.42, 0.58]}],
        "adapter": None,
        "config": {"seed": seed, "scenario": "iamcl2r", "dataset": "synthetic", "strategy": "er",
                   "adapter": {"name": "none"}, "output": "results", "stream": {"num_tasks": 3, "increment": 4},
                   "training": {"epochs": 1, "progress": False}, "strategy_params": {"er": {}}},
        "versions": {"torch": "2.4"}, "device": {"type": "cpu"},
        "timings": {"tasks": [{"seconds": 2.0, "iterations": 100, "eval_seconds": 0.1, "images": 960,
                               "images_per_second": 480.0}] * 3,
                    "pretrain_seconds": 1.0, "train_seconds": 6.0, "eval_seconds": 0.3},
        "noise": noise_metrics(matrix, 144, replacement_tasks=[0, 2]),
        "negative_flips": {"self": [0.05, 0.0], "cross": [0.1, 0.05], "mean_self": 0.025, "mean_cross": 0.075},
    }


def update_record() -> dict:
    """A complete model_update record along a stream, as the run loop writes it: its 2x2 matrix and its adapter
    study of the stream's queries against its gallery (``protocol: stream``, ``retrieval``)."""
    def scores(top1: float, mAP: float) -> dict:
        return {"top1": top1, "top5": top1 + 20, "mAP": mAP}

    cases = {"old/old": scores(50.0, 40.0), "new/old": scores(45.0, 35.0), "new/new": scores(60.0, 50.0),
             "F/old": scores(48.0, 38.0), "F/F": scores(55.0, 44.0), "new/F": None, "B/old": scores(52.0, 41.0),
             "B/F": scores(53.0, 42.0), "B/B": scores(58.0, 47.0), "old+new/old": None}
    matrix = [[0.5, None], [0.52, 0.6]]
    curve, auc = {"top1": [53.0, 55.0, 58.0], "mAP": [42.0, 44.0, 47.0]}, {"top1_auc": 55.25, "mAP_auc": 44.25}
    return {
        "scenario": "model_update", "strategy": "model_update", "method": "lambda_orth", "dataset": "synthetic",
        "seed": 1, "protocol": "stream", "num_tasks": 2, "tasks_completed": 2, "complete": True,
        "replacement_tasks": [0, 1], "compatibility_matrix": matrix, "metrics": all_metrics(as_matrix(matrix)),
        "negative_flips": {"self": [0.1], "cross": [0.05], "mean_self": 0.1, "mean_cross": 0.05},
        "retrieval": {"cases": cases, "query_top1": {},
                      "negative_flips": {"self": [0.1], "cross": [0.04], "mean_self": 0.1, "mean_cross": 0.04},
                      "backfilling": {"betas": [0.0, 0.5, 1.0],
                                      "curves": {"random": curve, "uncertainty": None, "class_mean_distance": curve},
                                      "auc": {"random": auc, "uncertainty": None, "class_mean_distance": auc}},
                      "zero_shot": None, "queries": 144, "gallery_items": 36, "gallery_mode": "templates"},
        "adapter": {"name": "lambda_orth", "direction": "backward", "at": "replacements",
                    "fits": [{"task": 1, "items": 96, "seconds": 0.5, "f_W": 0.02}]},
        "config": {"seed": 1, "scenario": "model_update", "adapter": {"name": "lambda_orth"}},
        "timings": {"tasks": [{"seconds": 0.0, "iterations": 0}, {"seconds": 0.0, "iterations": 0}],
                    "pretrain_seconds": 6.0, "train_seconds": 0.0, "eval_seconds": 0.2},
    }


def former_update_record() -> dict:
    """A model_update record of the former layout (top-level ``cases`` as top-1 fractions): refused."""
    matrix = [[0.5, None], [0.45, 0.6]]
    return {
        "scenario": "model_update", "strategy": "model_update", "method": "lambda_orth", "dataset": "synthetic",
        "seed": 1, "num_tasks": 2, "tasks_completed": 2, "complete": True, "replacement_tasks": [],
        "compatibility_matrix": matrix, "metrics": all_metrics(as_matrix(matrix)),
        "cases": {"old/old": 0.5, "new/new": 0.6, "new/old": 0.45, "B(new)/old": None, "new/F(old)": 0.52,
                  "B(new)/B(new)": None, "full backfill": 0.6},
        "backfilling": {"betas": [0.0, 0.5, 1.0], "curves": {"random": [0.45, 0.5, 0.6]}, "area": {"random": 0.51}},
        "adapter": {"name": "lambda_orth", "fit": {"f_W": 0.02}, "fit_items": 96},
        "config": {"seed": 1, "scenario": "model_update", "adapter": {"name": "lambda_orth"}},
        "timings": {"model_training_seconds": 3.0, "adapter_fit_seconds": 0.5, "evaluation_seconds": 0.2},
    }


def retrieval_record(seed: int = 1) -> dict:
    """A complete leave-one-out record (``runner.py adapt``) as ``cl2r_bench.adapter_study.study_record`` writes it."""
    scores = {"top1": 60.0, "top5": 80.0, "mAP": 40.0}
    cases = {case: None for case in ("F/old", "B/F")} | {case: dict(scores) for case in (
        "old/old", "new/old", "new/new", "F/F", "new/F", "B/old", "B/B")}
    auc = {"top1_auc": 65.0, "mAP_auc": 45.0}
    return {
        "scenario": "adapt", "strategy": "adapt", "method": "procrustes", "dataset": "catalogue", "seed": seed,
        "protocol": "leave_one_out", "num_tasks": 2, "tasks_completed": 2, "complete": True, "replacement_tasks": [],
        "retrieval": {"cases": cases, "backfilling": {"betas": [0.0, 1.0], "curves": {}, "auc": {
            "random": auc, "uncertainty": None, "class_mean_distance": auc, "class_mean_cosine": auc}},
            "zero_shot": None, "queries": 100, "fitting_items": 200,
            "negative_flips": {"self": [0.1], "cross": [0.0], "mean_self": 0.1, "mean_cross": 0.0}},
        "models": {"train": "train.npz", "test": "test.npz"},
        "adapter": {"name": "procrustes", "fits": [{"task": 1, "seconds": 0.1, "items": 200}]},
        "config": {"command": "adapt", "adapter": {"name": "procrustes"}, "seed": seed},
        "timings": {"tasks": [], "adapter_fit_seconds": 0.1, "evaluation_seconds": 0.2},
    }


DELETE = object()


def changed(record: dict, path: str, value) -> dict:
    """``record`` with the entry at a dotted ``path`` set to ``value`` (or deleted when ``value`` is ``DELETE``)."""
    out = copy.deepcopy(record)
    *parents, last = path.split(".")
    target = out
    for key in parents:
        target = target[int(key)] if isinstance(target, list) else target[key]
    if value is DELETE:
        del target[last]
    elif isinstance(target, list):
        target[int(last)] = value
    else:
        target[last] = value
    return out


def write(folder: Path, name: str, content: dict | str | bytes) -> Path:
    path = folder / name / "metrics.json"
    path.parent.mkdir(parents=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif isinstance(content, str):
        path.write_text(content)
    else:
        with path.open("w") as f:
            json.dump(content, f)
    return path
