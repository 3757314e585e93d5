"""``runner.py plot`` on hand-made result folders: every run's figures are redrawn from its ``metrics.json``,
experiments are compared per scenario and data set without ever averaging runs of different settings, tasks are
numbered from 0, and large matrices stay readable."""
import json

import numpy as np
import pytest
from helpers.records import DELETE, changed, update_record, valid_record, write

from benchmarks.metrics import all_metrics, as_matrix
from benchmarks.noise import noise_metrics
from cl2r_bench.app import cli as runner
from cl2r_bench.reporting import plots
from cl2r_bench.reporting.experiments import experiment_groups

PNG = b"\x89PNG\r\n\x1a\n"


def is_png(path) -> bool:
    return path.is_file() and path.stat().st_size > 1000 and path.read_bytes()[:8] == PNG


def strategy_record(strategy: str, seed: int) -> dict:
    record = changed(valid_record(seed), "strategy", strategy)
    record["method"] = record["config"]["strategy"] = strategy
    return record


def sized_record(size: int, seed: int = 1, noise: bool = True) -> dict:
    """A complete record of ``size`` tasks, replacements at tasks 0 and ``size // 2``."""
    rng = np.random.default_rng(seed)
    matrix = np.tril(rng.uniform(0.2, 0.6, (size, size)))
    matrix[np.triu_indices(size, 1)] = np.nan
    replaced = [0, size // 2]
    record = valid_record(seed)
    record.update(num_tasks=size, tasks_completed=size, replacement_tasks=replaced, metrics=all_metrics(matrix),
                  compatibility_matrix=[[None if np.isnan(v) else float(v) for v in row] for row in matrix],
                  noise=noise_metrics(matrix, 200, replacement_tasks=replaced) if noise else None,
                  negative_flips=None)
    for key in ("replacement_models", "timings"):
        del record[key]
    return record


@pytest.fixture
def results(tmp_path):
    """Two seeds of er, one of dsimplex_hoc and one model_update run."""
    folder = tmp_path / "results"
    for name, record in (("er/seed1", strategy_record("er", 1)), ("er/seed2", strategy_record("er", 2)),
                         ("hoc/seed1", strategy_record("dsimplex_hoc", 1)), ("update/seed1", update_record())):
        write(folder, name, record)
    return folder


def test_plot_redraws_every_run_and_writes_comparisons(results, capsys):
    assert runner.main(["plot", str(results)]) == 0
    out, err = capsys.readouterr()
    for run in ("er/seed1", "er/seed2", "hoc/seed1"):
        assert is_png(results / run / "compatibility_matrix.png") and is_png(results / run / "aa_per_task.png")
    assert is_png(results / "update/seed1" / "backfilling.png")
    expected = {f"{scenario}_synthetic_{kind}.png" for scenario in ("iamcl2r", "model_update")
                for kind in ("curves", "summary")}
    assert {p.name for p in (results / "plots").iterdir()} == expected
    assert all(is_png(results / "plots" / name) for name in expected)
    assert all(str(results / "plots" / name) in out for name in expected) and err == ""


def test_out_folder_and_skipped_records(results, tmp_path, capsys):
    bad = write(results, "bad", changed(valid_record(5), "metrics.AC", 1.7))
    old = write(results, "old", changed(valid_record(6), "metrics.AC_per_task", DELETE))
    out = tmp_path / "figures"
    assert runner.main(["plot", str(results), "--out", str(out)]) == 0
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2
    assert err[0].startswith(f"skipped {bad}: 'metrics.AC' is 1.7")
    assert err[1].startswith(f"skipped {old}: 'metrics.AC_per_task' must be 3 numbers")
    assert is_png(out / "iamcl2r_synthetic_curves.png") and not (results / "plots").exists()
    assert not (old.parent / "compatibility_matrix.png").exists()


def test_experiments_that_differ_in_settings_are_separate_series():
    records = [changed(valid_record(seed), "config.stream.increment", increment)
               for increment in (4, 8) for seed in (1, 2)]
    records.append(strategy_record("dsimplex_hoc", 1))
    series = plots.experiment_series(experiment_groups(records))[("iamcl2r", "synthetic")]
    assert [(s.label, [r["seed"] for r in s.runs]) for s in series] == [
        ("dsimplex_hoc", [1]), ("er [stream.increment=4]", [1, 2]), ("er [stream.increment=8]", [1, 2])]


def test_runs_without_config_of_different_sizes_are_never_averaged():
    records = [changed(sized_record(size, noise=False), "config", None) for size in (3, 4)]
    series = plots.experiment_series(experiment_groups(records))[("iamcl2r", "synthetic")]
    assert [(s.label, len(s.runs)) for s in series] == [("er [3 tasks, replacements [0, 1]]", 1),
                                                        ("er [4 tasks, replacements [0, 2]]", 1)]


def test_missing_folder_is_a_one_line_usage_error(tmp_path, capsys):
    assert runner.main(["plot", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: results folder") and "does not exist" in err


def test_folder_without_complete_runs_is_a_usage_error(tmp_path, capsys):
    write(tmp_path, "partial", changed(valid_record(), "complete", False))
    assert runner.main(["plot", str(tmp_path)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("skipped") and err[1].startswith("error: no complete metrics.json")


def tick_labels(axis) -> list[str]:
    return [label.get_text() for label in axis.get_ticklabels()]


def test_tasks_are_numbered_from_zero():
    plt = plots._pyplot()
    record = valid_record()
    fig = plots._heatmap(plt, record)
    heatmap = fig.axes[0]
    assert tick_labels(heatmap.xaxis) == tick_labels(heatmap.yaxis) == ["0*", "1", "2*"]
    assert "tasks 0-2" in heatmap.get_xlabel()
    plt.close(fig)
    fig = plots._aa_curve(plt, record)
    assert list(fig.axes[0].get_xticks()) == [0, 1, 2]
    assert [line.get_xdata()[0] for line in fig.axes[0].lines[1:]] == [0, 2]
    plt.close(fig)


def test_large_matrix_has_marks_and_colour_bar_but_no_cell_text():
    plt = plots._pyplot()
    record = sized_record(31)
    fig = plots._heatmap(plt, record)
    heatmap, colour_bar = fig.axes
    assert len(heatmap.texts) == 0 and colour_bar.get_ylabel() == "M[t][k] (%)"
    decisions = [d["decision"] for d in record["noise"]["pair_decisions"]]
    assert len(heatmap.patches) == sum(d in ("incompatible", "within_noise") for d in decisions)
    crosses = heatmap.collections[-1].get_offsets()
    assert sorted(map(tuple, np.asarray(crosses).astype(int))) == sorted((k, t) for t, k in
                                                                         record["metrics"]["violations"])
    assert tick_labels(heatmap.xaxis)[:2] == ["0*", "1"] and tick_labels(heatmap.xaxis)[-1] == "30"
    plt.close(fig)


def test_small_matrix_shows_values_and_intervals():
    plt = plots._pyplot()
    record = valid_record()
    fig = plots._heatmap(plt, record)
    texts = [t.get_text() for t in fig.axes[0].texts]
    matrix = 100 * as_matrix(record["compatibility_matrix"])
    assert len(texts) == 6 and texts[0].startswith(f"{matrix[0, 0]:.1f}\n±")
    plt.close(fig)


def test_saved_records_round_trip_through_json(tmp_path, capsys):
    write(tmp_path, "big/seed1", json.loads(json.dumps(sized_record(31))))
    assert runner.main(["plot", str(tmp_path)]) == 0
    assert is_png(tmp_path / "big/seed1/compatibility_matrix.png")
    assert is_png(tmp_path / "plots" / "iamcl2r_synthetic_summary.png")


def test_the_cross_case_axis_holds_old_old_every_bar_and_every_interval():
    """All gains below old/old used to end the axis at the reference line; now it holds every bar's end and
    interval with a margin, and the reference is named on the axis, not in a legend over a bar."""
    from cl2r_bench.reporting.adapter_recommendation import AdapterSummary

    def row(name: str, gain: float, low: float, high: float) -> AdapterSummary:
        return AdapterSummary(name, 3, False, "B/old", "no", gain, (low, high), None, None, None, None, None, 1.0,
                              None)

    plt = plots._pyplot()
    fig = plots.cross_case_figure(plt, "t", [row("a", -4.0, -6.0, -2.0), row("b", -9.0, -12.5, -7.0)], 50.0)
    left, right = fig.axes[0].get_xlim()
    assert left < 50 - 12.5 and right > 50.0 and not fig.axes[0].get_legend()
    assert "old/old 50.0" in fig.axes[0].get_xlabel()
    plt.close(fig)


def test_one_backfilling_scale_leaves_the_no_adapter_curve_out_and_says_where_it_starts():
    adapters = [[60.0, 62.0, 64.0], [58.0, 61.0, 64.0]]
    low, high = plots.backfilling_scale(adapters, baseline=55.0)
    assert low < 55.0 < 64.0 < high and high - low < 15, "the adapters' curves fill the axis"
    assert plots._clipped_label("none", [8.0, 40.0, 64.0], (low, high)) == "none, from 8.0 (below the scale)"
    assert plots._clipped_label("a", adapters[0], (low, high)) == "a"
