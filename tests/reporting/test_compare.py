"""``runner.py compare`` (cl2r_bench/reporting/compare.py) and the leaderboard's intervals over seeds: figures from
the records' per-query hits, paired seeds with the query bootstrap inside each, t-intervals and Welch's, checked
against values computed by hand."""
import json
import math

import numpy as np
import pytest
from helpers.records import valid_record

from benchmarks.flips import negative_flips
from benchmarks.metrics import all_metrics, as_matrix
from benchmarks.noise import bootstrap_accuracies, t_interval, t_quantile
from benchmarks.record import pack_hits
from cl2r_bench.app.cli import main
from cl2r_bench.reporting.compare import (
    against_best,
    against_variants,
    compare,
    matrix_figures,
    two_model_figures,
    verdict_line,
)
from cl2r_bench.reporting.leaderboard import interval_rows


def record(entries: list[list[int]], *, seed: int = 0, method: str = "er", queries: str = "q") -> dict:
    """A complete record whose matrix entries (row order) have these per-query hits, scored on the query set named
    ``queries`` (its digest)."""
    hits = [np.array(h, dtype=bool) for h in entries]
    size = int((math.isqrt(8 * len(hits) + 1) - 1) // 2)
    rows, hit_rows, start = [], [], 0
    for t in range(size):
        hit_rows.append(hits[start:start + t + 1])
        rows.append([float(h.mean()) for h in hit_rows[-1]] + [None] * (size - t - 1))
        start += t + 1
    out = valid_record(seed)
    out.update(strategy=method, method=method, num_tasks=size, tasks_completed=size, compatibility_matrix=rows,
               metrics=all_metrics(as_matrix(rows)), replacement_tasks=[], query_hits=[pack_hits(h) for h in hits],
               negative_flips=negative_flips(hit_rows))
    out["config"] = dict(out["config"], strategy=method)
    out["evaluation"] = dict(out["evaluation"], queries=len(hits[0]), query_sha256=queries, gallery_sha256="g")
    out["stream"] = dict(out["stream"], classes_per_task=[4] * size)
    out.pop("noise")
    return out


def accuracy(correct: int, n: int = 100) -> list[int]:
    return [1] * correct + [0] * (n - correct)


def test_the_figures_of_a_record_are_computed_from_its_query_hits():
    figures = matrix_figures(record([[1, 1, 0, 0], [1, 1, 1, 0], [1, 0, 1, 0]])).values()
    # M = [[0.5], [0.75, 0.5]]: AA (0.5 + 0.75 + 0.5) / 3, ACA 0.75, AC 1 (0.75 > 0.5); NFR self: query 1 (hit by
    # M00, missed by M11) of 4; NFR cross: none (M10 hits every query M00 hits)
    assert figures == pytest.approx({"AA": 175 / 3, "ACA": 75.0, "AC": 1.0, "NFR self": 25.0, "NFR cross": 0.0})


def test_the_two_model_figures_come_from_its_query_hits():
    upgrade = valid_record()
    upgrade["two_model"] = {"queries": 5, "queries_without_match": 0, "unmatched_queries": "miss", "query_top1": {
        "old/old": pack_hits(np.array([1, 1, 1, 0, 0], bool)), "new/old": pack_hits(np.array([1, 0, 1, 1, 0], bool)),
        "new/new": pack_hits(np.array([0, 1, 1, 1, 1], bool))}}
    # new/old 3 of 5, new/new 4 of 5; old/old's hits lost by new/new: query 0; by new/old: query 1
    assert two_model_figures(upgrade).values() == pytest.approx(
        {"new/old top-1": 60.0, "new/new top-1": 80.0, "two-model NFR self": 20.0, "two-model NFR cross": 20.0})


def test_paired_seeds_on_their_own_queries_give_the_t_interval_of_the_differences():
    # 1,000 queries a seed: the queries' noise (paired-bootstrap variance about 0.4 points^2 a seed) is below the
    # seeds' spread, so the interval is the seeds' t-interval alone
    a = [record([accuracy(c, 1000)], seed=s, method="a", queries=f"q{s}") for s, c in enumerate((530, 640, 750))]
    b = [record([accuracy(c, 1000)], seed=s, method="b", queries=f"q{s}") for s, c in enumerate((500, 600, 700))]
    (aa,) = compare(a, b)
    half = 4.302652729911275 * 1.0 / math.sqrt(3)  # t(0.975, 2) * sd([3, 4, 5]) / sqrt(3)
    assert (aa.figure, aa.difference) == ("AA", pytest.approx(4.0))
    assert aa.interval == pytest.approx((4.0 - half, 4.0 + half))
    assert aa.verdict == "A" and aa.method == "3 paired seeds, t-interval"
    wide = [record([accuracy(c, 1000)], seed=s, method="b", queries=f"q{s}") for s, c in enumerate((510, 600, 690))]
    assert compare(a, wide)[0].verdict == "noise"  # differences 2, 4, 6: t * 2 / sqrt(3) = 4.97 > 4


def test_seeds_that_agree_exactly_on_their_own_queries_are_judged_by_the_queries_noise_at_least():
    # every seed: A 55 and B 50 of 100 queries, B's hits a subset of A's, so the per-query differences are 5 ones
    # and 95 zeros, the paired bootstrap's variance of the mean 100^2 * 0.05 * 0.95 / 100 = 4.75 points^2 a seed;
    # the seeds' spread is 0, the floor 4.75 / 3, the half-width t(0.975, 2) * sqrt(4.75 / 3) = 5.41 > 5
    a = [record([accuracy(55)], seed=s, method="a", queries=f"q{s}") for s in range(3)]
    b = [record([accuracy(50)], seed=s, method="b", queries=f"q{s}") for s in range(3)]
    (aa,) = compare(a, b)
    half = 4.302652729911275 * math.sqrt(4.75 / 3)
    assert aa.difference == pytest.approx(5.0) and aa.method == "3 paired seeds, t-interval, query-noise floor"
    assert aa.interval == pytest.approx((5.0 - half, 5.0 + half), abs=0.3)  # 1,000 bootstrap draws
    assert aa.verdict == "noise", "a spread of 0 over seeds is not an absence of noise"


def test_seeds_scored_on_the_same_queries_add_the_shared_query_noise():
    a = [record([accuracy(c)], seed=s, method="a") for s, c in enumerate((53, 64, 75))]
    b = [record([accuracy(c)], seed=s, method="b") for s, c in enumerate((50, 60, 70))]
    (aa,) = compare(a, b, resamples=500, seed=3)
    drawn = np.mean([bootstrap_accuracies(np.array([accuracy(ca)], bool), 500, 3)[0]
                     - bootstrap_accuracies(np.array([accuracy(cb)], bool), 500, 3)[0]
                     for ca, cb in ((53, 50), (64, 60), (75, 70))], axis=0) * 100
    half = 4.302652729911275 * math.sqrt(1.0 / 3 + np.var(drawn, ddof=1))
    assert aa.interval == pytest.approx((4.0 - half, 4.0 + half))
    assert aa.method == "3 paired seeds, t-interval + shared-query bootstrap"


def test_one_seed_is_judged_by_the_paired_query_bootstrap_alone():
    a = [record([accuracy(60)], method="a")]
    same = [record([accuracy(60)], method="b")]
    worse = [record([accuracy(50)], method="b")]
    (tie,) = compare(a, same)
    assert tie.interval == (0.0, 0.0) and tie.verdict == "noise"
    (won,) = compare(a, worse)
    assert won.interval[0] > 0 and won.verdict == "A" and "training noise not measured" in won.method


def test_runs_without_a_shared_split_are_compared_by_welch():
    # 1,000 queries a run: each mean's query noise (about 2.5 / 3 points^2) is below its seeds' spread (4 / 3)
    a = [record([accuracy(c, 1000)], seed=s, method="a", queries=f"a{s}") for s, c in ((1, 500), (2, 520), (3, 540))]
    b = [record([accuracy(c, 1000)], seed=s, method="b", queries=f"b{s}") for s, c in ((4, 400), (5, 420), (6, 440))]
    (aa,) = compare(a, b)
    variance = 4 / 3 + 4 / 3
    df = variance ** 2 / ((4 / 3) ** 2 / 2 + (4 / 3) ** 2 / 2)  # 4
    half = t_quantile(0.975, df) * math.sqrt(variance)
    assert df == pytest.approx(4.0) and aa.difference == pytest.approx(10.0)
    assert aa.interval == pytest.approx((10 - half, 10 + half)) and aa.verdict == "A"
    assert aa.method == "unpaired (3 and 3 seeds), Welch"


def test_a_lower_negative_flip_rate_is_the_better_one():
    old = [1] * 50 + [0] * 50
    a = [record([old, old, old], seed=s, method="a", queries=f"q{s}") for s in range(3)]
    flips = [[old, old, [0] * (5 + s) + [1] * (45 - s) + [0] * 50] for s in range(3)]
    b = [record(f, seed=s, method="b", queries=f"q{s}") for s, f in enumerate(flips)]
    found = {d.figure: d for d in compare(a, b)}
    assert found["NFR self"].difference == pytest.approx(-6.0) and found["NFR self"].verdict == "A"
    line = verdict_line("a", "b", list(found.values()))
    # AA: 50 against 48.33, 48 and 47.67
    assert line.startswith("a beats b beyond noise on AA (+2 points), NFR self (-6 points)")


def test_t_quantiles_are_scipys():
    stats = pytest.importorskip("scipy.stats")
    for df in (1, 2, 2.941, 4, 9, 29, 1000):
        for p in (0.9, 0.975, 0.995):
            assert t_quantile(p, df) == pytest.approx(stats.t.ppf(p, df), abs=1e-8)


def test_the_leaderboard_gives_each_figure_its_t_interval_over_seeds():
    runs = [record([accuracy(c)], seed=s, queries=f"q{s}") for s, c in enumerate((50, 52, 54))]
    (row,) = interval_rows(runs)
    half = 4.302652729911275 * 2 / math.sqrt(3)
    assert row[4] == pytest.approx((52 - half, 52 + half)) and row[-1] == 3
    assert t_interval([1.0]) is None and t_interval([2.0, 2.0]) is None


def test_the_leaderboards_intervals_stay_within_each_figures_range():
    # AC 1, 1, 0 over three seeds: 2/3 ± t(0.975, 2) * 0.577 / sqrt(3) = [-0.77, 2.10], shown as [0, 1]
    runs = [record([accuracy(50), accuracy(cross), accuracy(60)], seed=s, queries=f"q{s}")
            for s, cross in enumerate((60, 60, 40))]
    assert [r["metrics"]["AC"] for r in runs] == [1.0, 1.0, 0.0]
    (row,) = interval_rows(runs)
    assert row[3] == (0.0, 1.0)


def test_the_compare_command_prints_a_table_and_a_verdict_line(tmp_path, capsys):
    for method, counts in (("a", (530, 640, 750)), ("b", (500, 600, 700))):
        for s, c in enumerate(counts):
            folder = tmp_path / method / f"seed{s}"
            folder.mkdir(parents=True)
            (folder / "metrics.json").write_text(json.dumps(record([accuracy(c, 1000)], seed=s, method=method,
                                                                   queries=f"q{s}")))
    assert main(["compare", str(tmp_path), "a", "b"]) == 0
    out = capsys.readouterr().out
    assert "| AA " in out and "a better" in out
    assert out.strip().splitlines()[-1].startswith("a beats b beyond noise on AA (+4 points)")
    assert main(["compare", str(tmp_path), "a", "c"]) == 2
    assert "no experiment 'c' in these results; the experiments: a, b" in capsys.readouterr().err
    assert main(["compare", str(tmp_path), "--against-best", "AA"]) == 0
    assert "| iamcl2r    | synthetic | a " in capsys.readouterr().out


def test_against_best_reads_each_experiment_from_the_records_that_hold_the_figure():
    def upgrade(seed: int, method: str, cross: int, *, with_new: bool = True) -> dict:
        out = record([accuracy(50)], seed=seed, method=method, queries=f"q{seed}")
        hits = {"old/old": accuracy(50), "new/old": accuracy(cross)}
        if with_new:
            hits["new/new"] = accuracy(60)
        out["two_model"] = {"queries": 100, "queries_without_match": 0, "unmatched_queries": "miss",
                            "query_top1": {case: pack_hits(np.array(h, bool)) for case, h in hits.items()}}
        return out

    # a's seed 0 predates the new/new hits: a is read from seeds 1 and 2 only (new/old 44 and 46), b from all three
    a = [upgrade(0, "a", 90, with_new=False), upgrade(1, "a", 44), upgrade(2, "a", 46)]
    b = [upgrade(0, "b", 40), upgrade(1, "b", 41), upgrade(2, "b", 42)]
    table = against_best({("iamcl2r", "synthetic", "a"): a, ("iamcl2r", "synthetic", "b"): b}, "new/old top-1")
    (row,) = table.rows
    # paired on seeds 1 and 2: differences 3 and 4, mean 3.5; b's three records were read
    assert row[2:7] == ["a", "b", pytest.approx(45.0), pytest.approx(41.5), pytest.approx(3.5)]
    assert row[8] == 3


def test_against_best_shows_experiments_with_equal_records_as_one_row_as_the_leaderboard_does(tmp_path, capsys):
    for method, counts in (("a", (53, 64, 75)), ("b", (50, 60, 70)), ("b_twin", (50, 60, 70))):
        for s, c in enumerate(counts):
            folder = tmp_path / method / f"seed{s}"
            folder.mkdir(parents=True)
            twin = record([accuracy(c)], seed=s, method=method, queries=f"q{s}")
            (folder / "metrics.json").write_text(json.dumps(twin))
    assert main(["compare", str(tmp_path), "--against-best", "AA", "--format", "csv"]) == 0
    rows = [line.split(",") for line in capsys.readouterr().out.strip().splitlines()[1:]]
    assert [(row[2], row[3]) for row in rows] == [("a", "b = b_twin")], "twins are one result, not two rows"
    assert main(["compare", str(tmp_path), "a", "b_twin"]) == 0, "A and B still name single experiments"


def test_variants_are_compared_with_their_experiment_pair_by_pair():
    """bct.incoming against bct (differences 3, 4, 5 over paired seeds: variant worse by 4 on AA, beyond noise at
    1,000 queries a seed), lce.authors against lce (equal: within noise); er has no variant, x.incoming no base."""
    def runs(method: str, counts: tuple[int, ...]) -> list[dict]:
        return [record([accuracy(c, 1000)], seed=s, method=method, queries=f"q{s}") for s, c in enumerate(counts)]

    groups = {("iamcl2r", "synthetic", name): runs(name, counts) for name, counts in (
        ("bct", (530, 640, 750)), ("bct.incoming", (500, 600, 700)), ("lce", (500, 600, 700)),
        ("lce.authors", (500, 600, 700)), ("er", (400, 400, 400)), ("x.incoming", (400, 400, 400)))}
    table = against_variants(groups, "AA")
    assert [row[2:4] for row in table.rows] == [["bct", "bct.incoming"], ["lce", "lce.authors"]]
    bct, lce = table.rows
    assert bct[4:7] == [pytest.approx(64.0), pytest.approx(60.0), pytest.approx(-4.0)]
    assert bct[7][1] < 0 and bct[9] == "AA -"
    assert lce[6] == pytest.approx(0.0) and lce[9] == "AA ="
