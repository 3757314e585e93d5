"""End to end through the command line: results written and consistent, resume, metrics, leaderboard, errors."""
import csv
import io
import json

import numpy as np
import pytest
import torch
from helpers.runs import HOC_REFERENCE_ROWS as HOC_ROWS
from helpers.runs import interrupt_run_at

from benchmarks.metrics import all_metrics, as_matrix
from cl2r_bench.app import cli as runner


def run_cli(*args):
    return runner.main([str(a) for a in args])


def test_iamcl2r_run_writes_consistent_results(tiny, tmp_path, capsys):
    out = tmp_path / "out"
    assert run_cli("--config", tiny, "--scenario", "iamcl2r", "--strategy", "dsimplex_hoc", "--output", out,
                   "--set", "evaluation.plots=true") == 0
    run_dir = out / "iamcl2r" / "synthetic" / "dsimplex_hoc" / "seed42"
    record = json.loads((run_dir / "metrics.json").read_text())
    matrix = record["compatibility_matrix"]
    assert record["complete"] and record["num_tasks"] == 3 and record["replacement_tasks"] == [0, 2]
    assert [len(r) for r in matrix] == [3, 3, 3] and matrix[0][1] is None and matrix[1][2] is None
    assert all(0.0 <= v <= 1.0 for r in matrix for v in r if v is not None)
    recomputed = all_metrics(as_matrix(matrix))
    assert record["metrics"]["AC"] == recomputed["AC"] and record["metrics"]["AA"] == pytest.approx(recomputed["AA"])
    assert record["evaluation"]["extractions"] == {"gallery": 3, "query": 3}
    assert record["evaluation"]["queries"] == 6 * 24 and record["evaluation"]["gallery_images"] == 6 * 6
    assert record["config"]["strategy_params"]["dsimplex_hoc"]["mu"] == 10.0
    assert record["versions"]["torch"] and record["device"]["type"] == "cpu"
    assert len(record["timings"]["tasks"]) == 3 and record["timings"]["train_seconds"] > 0
    assert [r["source"] for r in record["replacement_models"]] == ["pretrained", "pretrained"]
    assert {p.name for p in run_dir.iterdir()} >= {"metrics.json", "config.yaml", "state.pt", "checkpoints",
                                                    "compatibility_matrix.png", "aa_per_task.png"}
    state = torch.load(run_dir / "checkpoints" / "task2.pt", weights_only=True)
    assert "head.lift.weight" in state and "head.vertices" not in state
    hits = torch.load(run_dir / "state.pt", weights_only=True)["evaluator"]["hits"]
    flips = record["negative_flips"]

    def lost(before, after):
        return float((before & ~after).float().mean())

    assert flips["self"] == pytest.approx([lost(hits[t - 1][t - 1], hits[t][t]) for t in (1, 2)])
    assert flips["cross"] == pytest.approx([lost(hits[t - 1][t - 1], hits[t][t - 1]) for t in (1, 2)])
    assert [flips["mean_self"], flips["mean_cross"]] == pytest.approx([np.mean(flips["self"]), np.mean(flips["cross"])])
    assert "| iamcl2r" in capsys.readouterr().out


def test_interrupted_run_resumes_to_the_same_metrics(tiny, tmp_path, monkeypatch):
    clean, broken = tmp_path / "clean", tmp_path / "broken"
    assert run_cli("--config", tiny, "--strategy", "er", "--output", clean) == 0
    undo = interrupt_run_at(monkeypatch, 2)
    assert run_cli("--config", tiny, "--strategy", "er", "--output", broken) == 130
    partial = json.loads((broken / "iamcl2r/synthetic/er/seed42/metrics.json").read_text())
    assert partial["tasks_completed"] == 2 and not partial["complete"]
    assert run_cli("--config", tiny, "--strategy", "er", "--output", broken) == 2
    undo()
    moved = tmp_path / "moved"
    broken.rename(moved)  # a run folder may move before it resumes
    assert run_cli("--config", tiny, "--strategy", "er", "--output", moved, "--resume") == 0
    resumed = json.loads((moved / "iamcl2r/synthetic/er/seed42/metrics.json").read_text())
    expected = json.loads((clean / "iamcl2r/synthetic/er/seed42/metrics.json").read_text())
    assert resumed["compatibility_matrix"] == expected["compatibility_matrix"]
    assert resumed["metrics"] == expected["metrics"]
    assert resumed["noise"] == expected["noise"]
    assert resumed["negative_flips"] == expected["negative_flips"] and len(expected["negative_flips"]["self"]) == 2


def test_resume_with_other_settings_is_refused(tiny, tmp_path, capsys):
    out = tmp_path / "out"
    assert run_cli("--config", tiny, "--strategy", "er", "--scenario", "cl2r", "--set", "replacement.tasks=[]",
                   "--output", out) == 0
    assert run_cli("--config", tiny, "--strategy", "er", "--scenario", "cl2r", "--set", "replacement.tasks=[]",
                   "--output", out, "--resume", "--set", "training.lr=0.5") == 2
    assert "training.lr" in capsys.readouterr().err


def test_metrics_command_reproduces_the_papers_numbers(tmp_path, capsys):
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"compatibility_matrix": HOC_ROWS}))
    assert run_cli("metrics", path, "--json") == 0
    metrics = json.loads(capsys.readouterr().out)
    assert round(metrics["AC"], 3) == 0.952 and round(metrics["AA"], 2) == 68.90 and metrics["violations"] == [[4, 3]]


def test_leaderboard_groups_seeds(tmp_path, capsys):
    for seed, ac in ((1, 0.5), (2, 1.0)):
        folder = tmp_path / f"iamcl2r/synthetic/er/seed{seed}"
        folder.mkdir(parents=True)
        (folder / "metrics.json").write_text(json.dumps({
            "complete": True, "scenario": "iamcl2r", "dataset": "synthetic", "strategy": "er", "seed": seed,
            "metrics": {"AC": ac, "AA": 40.0 + seed, "ACA": 30.0}}))
    (tmp_path / "iamcl2r/synthetic/er/partial").mkdir()
    (tmp_path / "iamcl2r/synthetic/er/partial/metrics.json").write_text(json.dumps({"complete": False}))
    assert run_cli("leaderboard", "--results", tmp_path, "--format", "csv") == 0
    (header, row), = [list(csv.reader(io.StringIO(capsys.readouterr().out)))]
    assert header == ["scenario", "dataset", "strategy", "AC_mean", "AC_std", "AA_mean", "AA_std", "ACA_mean",
                      "ACA_std", "NFR_self_mean", "NFR_self_std", "NFR_cross_mean", "NFR_cross_std", "starting_models",
                      "seeds"]
    assert row[:3] == ["iamcl2r", "synthetic", "er"] and row[-1] == "2"
    assert [float(v) for v in row[3:8]] == pytest.approx([0.75, np.std([0.5, 1.0], ddof=1), 41.5,
                                                          np.std([41.0, 42.0], ddof=1), 30.0])
    assert row[8] == ""  # ACA is 30.0 in both seeds: no spread, not a std of 0


def test_malformed_matrix_file_is_rejected(tmp_path, capsys):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps([[0.5], [0.4]]))
    assert run_cli("metrics", path) == 2
    assert "row 1" in capsys.readouterr().err


def test_mismatched_replacement_checkpoint_is_rejected(tiny, tmp_path, capsys):
    from cl2r_bench.models import build_model

    wrong = tmp_path / "wrong.pt"
    torch.save(build_model(backbone="small_cnn", head="dsimplex", num_classes=4, small_width=4).state_dict(), wrong)
    code = run_cli("--config", tiny, "--output", tmp_path / "o", "--set", f"replacement.checkpoints=[{wrong}]",
                   "--set", "replacement.tasks=[0]")
    err = capsys.readouterr().err
    assert code == 2 and "shape" in err and str(wrong) in err


def test_leaderboard_timing_is_median_per_iteration_against_the_baseline(tmp_path, capsys):
    runs = {("er", 1): [(2.0, 100), (2.0, 100), (9.0, 100)],
            ("er", 2): [(6.0, 200)],
            ("bct", 1): [(5.0, 100)]}
    for (strategy, seed), tasks in runs.items():
        folder = tmp_path / f"iamcl2r/synthetic/{strategy}/seed{seed}"
        folder.mkdir(parents=True)
        (folder / "metrics.json").write_text(json.dumps({
            "complete": True, "scenario": "iamcl2r", "dataset": "synthetic", "strategy": strategy, "seed": seed,
            "metrics": {"AC": 0.0, "AA": 40.0, "ACA": 30.0},
            "timings": {"tasks": [{"seconds": s, "iterations": n} for s, n in tasks]}}))
    assert run_cli("leaderboard", "--results", tmp_path, "--format", "csv", "--timing") == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert "iamcl2r,synthetic,bct,50.0,2.0,1" in lines and "iamcl2r,synthetic,er,25.0,1.0,2" in lines


def test_leaderboard_matrices_average_seeds(tmp_path, capsys):
    for seed, scale in ((1, 1.0), (2, 0.5)):
        folder = tmp_path / f"iamcl2r/synthetic/er/seed{seed}"
        folder.mkdir(parents=True)
        rows = [[0.4 * scale], [0.2 * scale, 0.6 * scale], [0.1, 0.3, 0.5]]
        (folder / "metrics.json").write_text(json.dumps({
            "complete": True, "scenario": "iamcl2r", "dataset": "synthetic", "strategy": "er", "seed": seed,
            "metrics": {"AC": 0.0, "AA": 40.0, "ACA": 30.0}, "replacement_tasks": [0, 2],
            "compatibility_matrix": [r + [None] * (3 - len(r)) for r in rows]}))
    assert run_cli("leaderboard", "--results", tmp_path, "--matrices") == 0
    out = capsys.readouterr().out
    assert "#### iamcl2r / synthetic / er (2 seeds)" in out
    cells = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]] for line in out.splitlines()
             if line.startswith("| ")}
    # an entry no seed changes has no spread: no "± 0.0"
    assert cells["1"] == ["15.0 ± 7.1", "45.0 ± 21.2", ""] and cells["2*"] == ["10.0", "30.0", "50.0"]
    # across replacement 2: pairs (2, 0) and (2, 1) -> accuracies 10 and 30, neither above its diagonal
    across = [line for line in out.splitlines() if "| 20.00 " in line]
    assert len(across) == 1 and "| 0.000 " in across[0] and "±" not in across[0]
    assert across[0].split("|")[-3].strip() == "2"


def test_leaderboard_never_merges_different_experiments(tmp_path, capsys):
    """A 7-task and a 31-task run of one strategy are two rows (tagged with what differs); seeds of one
    experiment are one row; --matrices handles matrices of different sizes."""
    def write(name: str, seed: int, tasks: int, ac: float) -> None:
        folder = tmp_path / name / f"seed{seed}"
        folder.mkdir(parents=True)
        matrix = [[0.5] * (t + 1) + [None] * (tasks - t - 1) for t in range(tasks)]
        config = {"seed": seed, "output": str(tmp_path / name), "strategy": "er", "adapter": {"name": "none"},
                  "stream": {"num_tasks": tasks, "increment": 15 if tasks == 7 else 3},
                  "training": {"progress": seed == 1},
                  "strategy_params": {"er": {}, "bct": {"influence_weight": seed}}}
        (folder / "metrics.json").write_text(json.dumps({
            "complete": True, "scenario": "iamcl2r", "dataset": "synthetic", "strategy": "er", "seed": seed,
            "num_tasks": tasks, "replacement_tasks": [0], "compatibility_matrix": matrix, "config": config,
            "metrics": {"AC": ac, "AA": 50.0, "ACA": 50.0}}))

    write("short", 1, 7, 0.25)
    write("short", 2, 7, 0.75)
    write("long", 1, 31, 0.0)
    assert run_cli("leaderboard", "--results", tmp_path, "--format", "csv") == 0
    rows = list(csv.reader(capsys.readouterr().out.strip().splitlines()))[1:3]
    assert sorted((r[2], r[-1]) for r in rows) == [
        ("er [stream.increment=15; stream.num_tasks=7]", "2"), ("er [stream.increment=3; stream.num_tasks=31]", "1")]
    assert run_cli("leaderboard", "--results", tmp_path, "--matrices") == 0
    assert "stream.num_tasks=31" in capsys.readouterr().out


def test_help_and_list_show_what_can_be_run(capsys):
    from cl2r_bench.adapters import list_adapters
    from strategies import list_strategies

    assert run_cli("--help") == 0
    text = capsys.readouterr().out
    assert all(c in text for c in ("leaderboard", "plot", "list", "--scenario SCENARIO", "--resume", "--set"))
    assert run_cli("list") == 0
    listed = capsys.readouterr().out
    for name in ("cl2r", "iamcl2r", "model_update", "quick", "paper", "synthetic", "none", *list_strategies(),
                 *list_adapters()):
        assert f"\n  {name} " in listed, name


def test_a_run_ends_by_saying_where_the_figures_are_and_what_to_do_next(tiny, tmp_path, capsys):
    out = tmp_path / "out"
    assert run_cli("--config", tiny, "--scenario", "cl2r", "--set", "replacement.tasks=[]", "--strategy", "er",
                   "--output", out, "--set", "evaluation.plots=true") == 0
    last = capsys.readouterr().out.strip().splitlines()[-3:]
    assert last[0] == f"figures: {out}/cl2r/synthetic/er/seed42/*.png"
    assert {p.name for p in (out / "cl2r/synthetic/er/seed42").glob("*.png")} == {"compatibility_matrix.png",
                                                                                 "aa_per_task.png"}
    assert run_cli("--config", tiny, "--scenario", "cl2r", "--set", "replacement.tasks=[]", "--strategy", "er",
                   "--output", out, "--overwrite") == 0
    printed = capsys.readouterr().out
    assert "figures:" not in printed and "next: python runner.py leaderboard" in printed, "no figures, none named"
    assert last[1].startswith(f"next: python runner.py leaderboard --results {out}")
    assert last[2].startswith("note: on the generated data these numbers show that the pipeline runs end to end")


def test_runs_of_one_command_that_would_share_a_folder_are_refused_before_any_runs(tmp_path, capsys):
    """--adapter all with one adapter.label would write every adapter into one folder, each replacing the
    last; it is one line, exit 2, and nothing is written."""
    from cl2r_bench.app.cli import main

    code = main(["--scenario", "model_update", "--dataset", "synthetic", "--adapter", "all", "--set",
                 "adapter.label=same", "--output", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and "two runs asked for would share the run folder" in err and "adapter.name" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("setting, message", [
    ("strategy_params.err.lr=1", "strategy_params.err: unknown strategy 'err'"),
    ("adapter_params.procrusts.anchors=3", "adapter_params.procrusts: unknown adapter 'procrusts'"),
    ("adapter_params.procrustes.anchors=-3", "adapter_params.procrustes.anchors = -3 must be at least 1"),
    ("adapter_params.irp.anchors=0", "adapter_params.irp.anchors = 0 must be at least 1"),
])
def test_parameters_of_parts_a_run_does_not_use_are_still_checked(setting, message, tmp_path, capsys):
    """A typo in a part's name, or an invalid value of a part the run does not use, is an error, as an
    unknown key is everywhere else."""
    from cl2r_bench.app.cli import main

    assert main(["--dataset", "synthetic", "--set", setting, "--output", str(tmp_path)]) == 2
    assert message in capsys.readouterr().err
