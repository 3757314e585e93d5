"""The small run the tests share and what they do to runs: :data:`TINY`, a 3-task IAM-CL2R run on generated data in
a few seconds (the ``tiny`` fixture of conftest.py writes it as a config), the same run waiting before each task
(:func:`waiting_config`), an interrupt at a chosen task, and the authors' released matrices."""
from pathlib import Path

import yaml

from cl2r_bench.reporting.published import IAMCL2R_RELEASED

# A 3-task IAM-CL2R run on generated data in a few seconds: replacements at tasks 0 and 2.
TINY = {
    "dataset": "synthetic", "preset": "quick", "device": "cpu",
    # The plain generator (noise 0.08, no shared layout): tests of mechanics need models that learn in an epoch.
    "data": {"synthetic_classes": 24, "synthetic_train_per_class": 24, "synthetic_test_per_class": 6,
             "synthetic_noise": 0.08, "synthetic_similarity": 0.0},
    "stream": {"initial_classes": 4, "increment": 4, "num_tasks": 3, "images_per_class": 24},
    "replacement": {"tasks": [0, 2], "pretrain": {"class_counts": [3, 6], "epochs": 1}},
    "model": {"small_width": 8, "small_out_dim": 16},
    "training": {"epochs": 1, "batch_size": 32, "new_batch_size": 16, "memory_batch_size": 16, "progress": False},
    # Figures off: the tests of figures turn them on (every strategy and adapter in test_assembly.py and
    # test_adapter_runs.py; test_runner.py, test_upgrade.py, test_plugin_scenario.py).
    "evaluation": {"heldout_classes": 6, "queries_per_class": None, "plots": False},
}


def tiny_config(folder: Path) -> Path:
    """Write :data:`TINY` as ``folder/tiny.yaml``, caching its replacement models under ``folder/cache``; its
    path."""
    config = dict(TINY, replacement=dict(TINY["replacement"], pretrain=dict(
        TINY["replacement"]["pretrain"], cache_dir=str(folder / "cache"))))
    path = folder / "tiny.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


WAITING_STRATEGY = Path(__file__).resolve().parent / "waiting_strategy.py"


def waiting_config(config: Path, folder: Path, seconds: float) -> Path:
    """``config`` (a :data:`TINY` config) with BCT waiting ``seconds`` before each task (``waiting_strategy.py``), as
    ``folder/waiting.yaml``: a run that lasts as long on a loaded machine as on an idle one, and mostly waits."""
    settings = yaml.safe_load(config.read_text())
    settings.update(strategy="waiting_bct", plugins=[str(WAITING_STRATEGY)],
                    strategy_params={"waiting_bct": {"seconds": seconds}})
    path = folder / "waiting.yaml"
    path.write_text(yaml.safe_dump(settings))
    return path


# METHODS.md §2: the authors' released 7-task d-Simplex-HOC and ER matrices (percent).
HOC_REFERENCE_ROWS = IAMCL2R_RELEASED["matrices"]["dsimplex_hoc"]
ER_REFERENCE_ROWS = IAMCL2R_RELEASED["matrices"]["er"]


def interrupt_run_at(monkeypatch, task: int):
    """Make every run stop with KeyboardInterrupt (Ctrl-C) when it reaches ``task``; returns the undo function."""
    from cl2r_bench.app import run_loop as experiment
    original = experiment.Run._run_task

    def stop(self, t, *rest):
        if t == task:
            raise KeyboardInterrupt
        return original(self, t, *rest)

    monkeypatch.setattr(experiment.Run, "_run_task", stop)
    return lambda: monkeypatch.setattr(experiment.Run, "_run_task", original)
