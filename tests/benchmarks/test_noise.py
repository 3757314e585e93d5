"""Noise-aware metrics (benchmarks/noise.py): intervals against their formulas, paired decisions, the runner's
output."""
import json
import math

import numpy as np
import pytest
import torch

from benchmarks.noise import bootstrap_accuracies, entry_index, noise_metrics, wilson_interval
from benchmarks.retrieval import CompatibilityEvaluator
from cl2r_bench.app import cli as runner
from cl2r_bench.data.datasets import ImageSet
from cl2r_bench.models import normalize


def test_wilson_interval_matches_the_formula_and_known_values():
    low, high = wilson_interval(0.5, 100)
    assert (round(low, 4), round(high, 4)) == (0.4038, 0.5962)        # 50 of 100, the textbook example
    z, p, n = 1.959963984540054, 0.7, 2000
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    assert wilson_interval(p, n) == pytest.approx((centre - half, centre + half))
    assert wilson_interval(0.0, 50)[0] == 0.0 and wilson_interval(1.0, 50)[1] == 1.0


def test_bootstrap_resamples_queries_jointly():
    rng = np.random.default_rng(0)
    hits = rng.random((1, 4000)) < 0.7
    samples = bootstrap_accuracies(np.concatenate([hits, hits, ~hits]), resamples=400, seed=1)
    assert np.array_equal(samples[0], samples[1])                       # same queries, same resample
    assert np.allclose(samples[0] + samples[2], 1.0)                    # complementary hits stay complementary
    assert samples[0].mean() == pytest.approx(hits.mean(), abs=0.003)
    assert samples[0].std() == pytest.approx(math.sqrt(0.7 * 0.3 / 4000), rel=0.15)


def test_records_on_as_many_queries_share_their_resamples_drawn_once(monkeypatch):
    import benchmarks.noise as noise

    rng = np.random.default_rng(2)
    first, second = rng.random((3, 500)) < 0.6, rng.random((2, 500)) < 0.3
    apart = [bootstrap_accuracies(hits, 300, 4) for hits in (first, second)]
    noise._kept_counts.cache_clear()
    drawn, draw = [], noise._count_chunks
    monkeypatch.setattr(noise, "_count_chunks", lambda *args: drawn.append(args) or draw(*args))
    kept = [bootstrap_accuracies(hits, 300, 4) for hits in (first, second)]
    assert len(drawn) == 1 and all(np.array_equal(a, b) for a, b in zip(apart, kept, strict=True))
    monkeypatch.setattr(noise, "KEPT_COUNTS", 500 * 300 - 1)           # too many to keep: drawn for each record
    assert np.array_equal(bootstrap_accuracies(first, 300, 4), apart[0]) and len(drawn) == 2


def _two_model_hits(n: int, gained: int, lost: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Entries (0,0), (1,0), (1,1) of a 2-task matrix: (1,0) = (0,0) with ``gained`` misses turned into hits and
    ``lost`` hits turned into misses (the same queries otherwise)."""
    rng = np.random.default_rng(seed)
    base = rng.random(n) < 0.6
    other = base.copy()
    other[np.flatnonzero(~base)[:gained]] = True
    other[np.flatnonzero(base)[:lost]] = False
    hits = np.stack([base, other, rng.random(n) < 0.8])
    matrix = np.array([[base.mean(), np.nan], [other.mean(), hits[2].mean()]])
    return matrix, hits


def test_pairing_decides_a_small_consistent_gain_the_binomial_method_cannot():
    matrix, hits = _two_model_hits(2000, gained=20, lost=0)           # +1 point, every change in the same direction
    paired = noise_metrics(matrix, 2000, hits=hits, resamples=500)
    binomial = noise_metrics(matrix, 2000, resamples=500)
    assert paired["method"] == "paired_bootstrap" and binomial["method"] == "binomial"
    assert paired["pair_decisions"][0]["decision"] == "compatible" and paired["AC_outside_noise"] == 1.0
    assert binomial["pair_decisions"][0]["decision"] == "within_noise"   # se of an unpaired difference ~1.5 points
    assert binomial["AC_outside_noise"] == 0.0 and binomial["AC_upper"] == 1.0 and binomial["within_noise"] == 1


def test_offsetting_changes_are_within_noise_and_a_large_loss_is_incompatible():
    matrix, hits = _two_model_hits(2000, gained=30, lost=30)          # same accuracy, 60 queries swapped
    noise = noise_metrics(matrix, 2000, hits=hits, resamples=500)
    assert noise["pair_decisions"][0]["decision"] == "within_noise"
    assert noise["AC_outside_noise"] == 0.0 and noise["AC_upper"] == 1.0
    matrix, hits = _two_model_hits(2000, gained=0, lost=300)
    noise = noise_metrics(matrix, 2000, hits=hits, resamples=500)
    assert noise["pair_decisions"][0]["decision"] == "incompatible" and noise["AC_upper"] == 0.0
    assert noise["AC_interval"] == [0.0, 0.0]


def test_ac_interval_and_across_pairs_on_a_three_task_matrix():
    rng = np.random.default_rng(3)
    n = 3000
    base = rng.random(n) < 0.5
    better = base | (rng.random(n) < 0.3)                              # a clear gain over base on the same queries
    worse = base & (rng.random(n) < 0.5)                               # a clear loss
    # rows: (0,0)=base (1,0)=better (1,1)=base (2,0)=worse (2,1)=worse (2,2)=base; replacement at task 2
    hits = np.stack([base, better, base, worse, worse, base])
    index = entry_index(3)
    matrix = np.full((3, 3), np.nan)
    for (t, k), i in index.items():
        matrix[t, k] = hits[i].mean()
    noise = noise_metrics(matrix, n, hits=hits, replacement_tasks=[0, 2], resamples=300)
    assert [d["decision"] for d in noise["pair_decisions"]] == ["compatible", "incompatible", "incompatible"]
    assert [d["across"] for d in noise["pair_decisions"]] == [False, True, True]
    assert noise["AC_outside_noise"] == pytest.approx(1 / 3) and noise["AC_interval"] == [pytest.approx(1 / 3)] * 2
    assert noise["across"] == {"AC_outside_noise": 0.0, "AC_upper": 0.0, "pairs": 2, "within_noise": 0}
    for t in range(3):
        for k in range(t + 1):
            low, high = noise["entry_intervals"][t][k]
            assert low < matrix[t, k] < high
    assert noise["entry_intervals"][0][1] is None


def test_evaluator_hits_reproduce_the_matrix_and_survive_a_state_round_trip():
    torch.manual_seed(0)
    gallery = ImageSet(torch.randint(0, 255, (20, 3, 8, 8), dtype=torch.uint8), torch.arange(4).repeat(5))
    query = ImageSet(torch.randint(0, 255, (60, 3, 8, 8), dtype=torch.uint8), torch.arange(4).repeat(15))
    models = [torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(192, 6)) for _ in range(3)]

    class Wrapped(torch.nn.Module):
        def __init__(self, net):
            super().__init__()
            self.net = net

        def forward(self, x):
            features = self.net(normalize(x, (0.5,) * 3, (0.25,) * 3))
            return features, features

    evaluator = CompatibilityEvaluator(query, gallery, amp=False)
    for m in models[:2]:
        evaluator.deploy(Wrapped(m))
    restored = CompatibilityEvaluator(query, gallery, amp=False)
    restored.load_state_dict(evaluator.state_dict())
    for e in (evaluator, restored):
        e.deploy(Wrapped(models[2]))
    hits = restored.hit_matrix()
    assert hits.shape == (6, 60) and hits.dtype == bool
    assert np.array_equal(hits, evaluator.hit_matrix())
    values = [v for row in restored.rows for v in row]
    assert np.allclose(hits.mean(axis=1), values)


def test_run_records_noise_and_replacement_accuracy(tiny, tmp_path, capsys):
    out = tmp_path / "out"
    assert runner.main(["--config", str(tiny), "--strategy", "er", "--output", str(out)]) == 0
    record = json.loads((out / "iamcl2r/synthetic/er/seed42/metrics.json").read_text())
    noise, matrix = record["noise"], record["compatibility_matrix"]
    assert noise["method"] == "paired_bootstrap" and noise["queries"] == record["evaluation"]["queries"]
    assert noise["pairs"] == 3 and noise["across"]["pairs"] == 2
    assert noise["AC_interval"][0] <= noise["AC_upper"] and noise["AC_outside_noise"] <= record["metrics"]["AC"] + 1e-9
    for t, row in enumerate(matrix):
        for k in range(t + 1):
            low, high = noise["entry_intervals"][t][k]
            assert low <= row[k] <= high
    for replacement in record["replacement_models"]:
        low, high = replacement["own_accuracy_interval"]
        assert 0 <= low <= replacement["own_accuracy"] <= high <= 1
    printed = capsys.readouterr().out
    assert "pairs within noise" in printed and "AC outside noise" in printed and "own accuracy (%)" in printed


def test_metrics_command_adds_binomial_noise(tmp_path, capsys):
    path = tmp_path / "m.json"
    path.write_text(json.dumps([[0.60], [0.61, 0.70], [0.20, 0.21, 0.80]]))
    assert runner.main(["metrics", str(path), "--json", "--queries", "2000", "--replacement-tasks", "2"]) == 0
    noise = json.loads(capsys.readouterr().out)["noise"]
    decisions = {tuple(d["pair"]): d["decision"] for d in noise["pair_decisions"]}
    assert decisions == {(1, 0): "within_noise", (2, 0): "incompatible", (2, 1): "incompatible"}
    assert noise["within_noise"] == 1 and noise["across"]["pairs"] == 2
    assert runner.main(["metrics", str(path), "--queries", "0"]) == 2


@pytest.mark.parametrize("args, message", [
    (["--queries", str(10**21)], "argument --queries: must be a whole number from 1 to 2147483647"),
    (["--queries", "100", "--replacement-tasks", "99", "7"], "--replacement-tasks 99 7: the matrix has 3 tasks"),
    (["--queries", "100", "--replacement-tasks", "1", "-5"],
     "argument --replacement-tasks: must be a whole number from 0 to 2147483647, not -5"),
    (["--replacement-tasks", "2"], "--replacement-tasks is read by the noise analysis: add --queries N"),
])
def test_counts_and_task_lists_are_checked_against_the_matrix_in_one_line(tmp_path, capsys, args, message):
    path = tmp_path / "m.json"
    path.write_text(json.dumps([[0.60], [0.61, 0.70], [0.20, 0.21, 0.80]]))
    assert runner.main(["metrics", str(path), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err


def test_replacement_scores_are_computed_once_per_study(tiny, tmp_path, monkeypatch):
    """Another seed with the same replacement models and evaluation set reads their own accuracy from the cache."""
    from cl2r_bench.app import run_loop as experiment
    out = tmp_path / "out"
    assert runner.main(["--config", str(tiny), "--strategy", "er", "--output", str(out)]) == 0
    scores = sorted((tmp_path / "cache" / "scores").glob("*.json"))
    assert len(scores) == 2
    calls = []
    monkeypatch.setattr(experiment.CompatibilityEvaluator, "self_test", lambda *a, **k: calls.append(1) or 0.0)
    assert runner.main(["--config", str(tiny), "--strategy", "er", "--seed", "7", "--output", str(out)]) == 0
    first, second = (json.loads((out / f"iamcl2r/synthetic/er/seed{s}/metrics.json").read_text())["replacement_models"]
                     for s in (42, 7))
    assert not calls
    assert [r["own_accuracy"] for r in first] == [r["own_accuracy"] for r in second]
    assert sorted((tmp_path / "cache" / "scores").glob("*.json")) == scores


def test_a_damaged_score_file_is_computed_again(tiny, tmp_path):
    out = tmp_path / "out"
    assert runner.main(["--config", str(tiny), "--strategy", "er", "--output", str(out)]) == 0
    first = json.loads((out / "iamcl2r/synthetic/er/seed42/metrics.json").read_text())["replacement_models"]
    for path in (tmp_path / "cache" / "scores").glob("*.json"):
        path.write_text("{not json")
    assert runner.main(["--config", str(tiny), "--strategy", "er", "--seed", "7", "--output", str(out)]) == 0
    second = json.loads((out / "iamcl2r/synthetic/er/seed7/metrics.json").read_text())["replacement_models"]
    assert [r["own_accuracy"] for r in second] == [r["own_accuracy"] for r in first]
