"""Learned adapters trained to convergence (cl2r_bench/adapters/learned.py): a step budget, early stopping on a
held-out share with the best weights kept, a one-line note for a fit that ran out of steps, and λ-orth's defaults
recovering a rotation as Procrustes does (docs/METHODS.md §7)."""
import json

import numpy as np
import pytest
import torch
from torch import nn

from benchmarks.adapted_cases import WATCHING, PairedFeatures
from benchmarks.record import unpack_hits
from cl2r_bench.adapter_study import Study, evaluate_adapter
from cl2r_bench.adapters import AdapterError, convergence_note, make_adapter
from cl2r_bench.adapters.learned import FitProgress, StepBudget, split_held_out, train_to_convergence
from cl2r_bench.reporting.adapter_recommendation import paired_gain_interval


def noisy_rotation(seed: int, classes: int = 40, per_class: int = 30, dim: int = 48) -> PairedFeatures:
    """The issue's case: 1,200 items in 48-d; the new space is a fixed rotation of the old one plus noise."""
    rng = np.random.default_rng(seed)
    centres = np.random.default_rng(123).normal(size=(classes, dim))
    labels = np.repeat(np.arange(classes), per_class)
    old = centres[labels] + 1.6 * rng.normal(size=(len(labels), dim))
    rotation = np.linalg.qr(np.random.default_rng(7).normal(size=(dim, dim)))[0]
    new = old @ rotation + 0.3 * rng.normal(size=old.shape)
    return PairedFeatures.normalised(torch.tensor(old, dtype=torch.float32), torch.tensor(new, dtype=torch.float32),
                                     torch.tensor(labels))


def backward_hits(study: Study, name: str, params: dict) -> tuple[np.ndarray, dict]:
    _, result = evaluate_adapter(study, name, adapter_params=params, seed=0, orders=["random"], steps=2,
                                 scoring=WATCHING)
    return unpack_hits(result["query_top1"]["B/old"], len(study.test)), result


@pytest.mark.slow
def test_lambda_orth_recovers_a_noisy_rotation_as_procrustes_does_with_its_defaults():
    study = Study("rotation", noisy_rotation(1), noisy_rotation(2), {})
    procrustes, _ = backward_hits(study, "procrustes", {})
    converged, result = backward_hits(study, "lambda_orth", {})
    gain, (low, high) = paired_gain_interval(converged[None, :], procrustes)
    assert result["fit"]["converged"] and result["fit"]["steps"] < StepBudget().max_steps
    assert result["fit"]["watched"] == "held-out retrieval error"
    assert low <= 0 <= high or gain > 0, f"λ-orth B/old {gain:+.1f} points from Procrustes ({low:+.1f}, {high:+.1f})"
    old_budget, result = backward_hits(study, "lambda_orth", {"lambda_orth": {"max_steps": 160}})
    assert not result["fit"]["converged"]
    assert 100 * (procrustes.mean() - old_budget.mean()) > 20, "160 steps (80 epochs of 1,200 items) undertrain"


class Scalar(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(()))


def pulled_apart(n: int, share: float, seed: int) -> torch.Tensor:
    """Targets: 1.0 for the training items, 0.5 for the held-out ones (the same draw as the fit's)."""
    training, held_out = split_held_out(n, share, torch.Generator().manual_seed(seed))
    targets = torch.ones(n)
    targets[held_out] = 0.5
    return targets


def test_a_fit_stops_once_its_held_out_loss_stops_falling_and_keeps_its_best_weights():
    """Training pulls w from 0 to 1 (Adam, lr 0.01: about 0.01 per step); the held-out loss (w - 0.5)^2 is lowest
    near step 50 and rises after, so the fit stops `patience` checks later with w restored to about 0.5."""
    module, targets = Scalar(), pulled_apart(100, 0.5, seed=3)
    budget = StepBudget(max_steps=1000, holdout=0.5, check_every=10, patience=5, batch_size=50, lr=0.01)
    log = train_to_convergence(module, lambda idx: (module.w - targets[idx]).pow(2).mean(), 100, budget,
                               torch.Generator().manual_seed(3))
    curve = np.array(log["loss_curve"])
    assert log["converged"] and log["holdout_items"] == 50
    assert log["steps"] == log["best_step"] + 5 * 10 < 1000
    assert log["best_step"] == int(curve[np.argmin(curve[:, 2]), 0])
    assert float(module.w.detach()) == pytest.approx(0.5, abs=0.06)


def test_a_watch_decides_when_to_stop_and_which_weights_to_keep_instead_of_the_loss():
    """The same pull of w from 0 to 1, watched by |w - 0.8| (a stand-in for held-out retrieval error): the held-out
    loss would keep w near 0.5, the watch keeps it near 0.8."""
    module, targets = Scalar(), pulled_apart(100, 0.5, seed=3)
    budget = StepBudget(max_steps=1000, holdout=0.5, check_every=10, patience=5, batch_size=50, lr=0.01)
    log = train_to_convergence(module, lambda idx: (module.w - targets[idx]).pow(2).mean(), 100, budget,
                               torch.Generator().manual_seed(3), watch=lambda idx: abs(float(module.w.detach()) - 0.8))
    assert log["converged"] and float(module.w.detach()) == pytest.approx(0.8, abs=0.06)


def test_a_fit_that_runs_out_of_steps_is_not_converged_and_one_line_says_how_to_give_it_more():
    module, targets = Scalar(), pulled_apart(100, 0.0, seed=0)
    budget = StepBudget(max_steps=20, holdout=0.0, check_every=10, patience=5, batch_size=50, lr=0.01)
    log = train_to_convergence(module, lambda idx: (module.w - targets[idx]).pow(2).mean(), 100, budget,
                               torch.Generator().manual_seed(0))
    assert (log["steps"], log["converged"], log["holdout_items"]) == (20, False, 0)
    note = convergence_note("fct", log, " (seed 0)")
    assert note.startswith("warning: adapter fct (seed 0) did not converge in 20 steps: its training loss was best "
                           f"at step 20 ({log['loss_curve'][-1][2]:.4g}) and had not yet stayed flat for "
                           "adapter_params.fct.patience checks")
    assert note.endswith("--set adapter_params.fct.max_steps=80") and "\n" not in note
    assert convergence_note("fct", {**log, "converged": True}) is None
    assert convergence_note("procrustes", {"anchors": 10.0}) is None


def test_the_held_out_share_is_a_seeded_draw_and_is_dropped_when_too_small():
    training, held = split_held_out(100, 0.1, torch.Generator().manual_seed(0))
    again, held_again = split_held_out(100, 0.1, torch.Generator().manual_seed(0))
    assert len(held) == 10 and torch.equal(held, held_again) and torch.equal(training, again)
    assert sorted(torch.cat([training, held]).tolist()) == list(range(100))
    assert len(split_held_out(10, 0.1, torch.Generator().manual_seed(0))[1]) == 0


@pytest.mark.parametrize("name", ["lambda_orth", "fct", "fastfill"])
def test_the_former_epochs_parameter_is_one_line_naming_its_replacement(name):
    message = rf"adapter_params\.{name}\.epochs: .* set adapter_params\.{name}\.max_steps"
    with pytest.raises(AdapterError, match=message):
        make_adapter(name, {name: {"epochs": 80}})


@pytest.mark.parametrize("key, value", [("max_steps", 0), ("holdout", 1.0), ("patience", 0), ("lr", 0.0)])
def test_budget_settings_are_checked_by_the_adapters_own_config(key, value):
    with pytest.raises(AdapterError, match=rf"adapter_params\.lambda_orth\.{key}"):
        make_adapter("lambda_orth", {"lambda_orth": {key: value}})


def test_a_fit_reports_a_line_every_few_seconds_and_one_when_it_ends():
    """A clock that advances 2 s per reading: a line at most every 5 s of it (every third check), each naming the
    step of the budget, the watched score, the best so far, the time spent and the most the rest can take."""
    ticks = iter(range(0, 10_000, 2))
    lines = []
    progress = FitProgress("fit fct seed 0", lines.append, clock=lambda: float(next(ticks)))
    module, targets = Scalar(), pulled_apart(100, 0.5, seed=3)
    budget = StepBudget(max_steps=1000, holdout=0.5, check_every=10, patience=5, batch_size=50, lr=0.01)
    log = train_to_convergence(module, lambda idx: (module.w - targets[idx]).pow(2).mean(), 100, budget,
                               torch.Generator().manual_seed(3), progress=progress)
    checks = len(log["loss_curve"])
    assert len(lines) == checks // 3 + 1                           # clock 0, then 2, 4, 6 (a line), ...
    assert lines[0].startswith("fit fct seed 0: step 30 of 1000, held-out loss ") and "(best " in lines[0]
    assert lines[0].endswith(f"6 s, at most {6 / 30 * 970:.0f} s more")
    assert lines[-1].startswith(f"fit fct seed 0: converged after {log['steps']} steps in ")


def test_the_fit_benchmark_prints_each_adapter_against_procrustes(capsys):
    from tools.bench_adapter_fits import main
    main(["--fit", "200", "--test", "100", "--old-dim", "8", "--new-dim", "12", "--classes", "5",
          "--adapters", "procrustes", "--json"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("200 fitting x 8 -> 12 dims, 100 test items, 5 classes")
    assert lines[1].startswith("procrustes   fit") and "(     1.0 x procrustes)" in lines[1]
    row = json.loads(lines[-1])["rows"][0]
    assert row["adapter"] == "procrustes" and row["cross_case"] == "B/old" and 0 <= row["top1"] <= 100


def test_the_old_module_name_still_loads_a_plug_in_for_one_release_with_a_warning():
    import importlib
    import sys

    from cl2r_bench.adapters.learned import LearnedAdapter

    sys.modules.pop("cl2r_bench.adapters.training", None)
    with pytest.warns(FutureWarning, match="cl2r_bench.adapters.training is now cl2r_bench.adapters.learned"):
        old = importlib.import_module("cl2r_bench.adapters.training")
    assert old.LearnedAdapter is LearnedAdapter and old.StepBudget is StepBudget
