"""The leaderboard's ``margins`` table: each pair's margin M[t][k] - M[k][k] split into the query model's own gain
M[t][t] - M[k][k] and its cross gap M[t][t] - M[t][k], within segments and across replacements, mean and
t-interval over seeds. Every expected cell is computed here by hand from the records' matrices."""
import math

import numpy as np
import pytest
from helpers.records import changed, valid_record

from cl2r_bench.reporting.leaderboard import MARGIN_COLUMNS, build, margin_rows
from cl2r_bench.reporting.tables import render

T_975_1 = math.tan(math.pi * 0.475)
"""t(0.975) with one degree of freedom (the Cauchy quantile): the factor of a two-seed 95 % t-interval, whose
half-width is then T_975_1 * |a - b| / 2."""

SECOND = [[0.5, None, None], [0.45, 0.6, None], [0.6, 0.7, 0.8]]
"""Seed 2's matrix (seed 1's is helpers.records.MATRIX: [[0.5], [0.55, 0.6], [0.58, 0.62, 0.7]]); both runs have
replacements at tasks 0 and 2, so (1, 0) is the one pair within a segment and (2, 0), (2, 1) lie across the
replacement at 2."""


def two_seeds() -> list[dict]:
    return [valid_record(1), changed(valid_record(2), "compatibility_matrix", SECOND)]


def cells(row: list) -> dict:
    return {column.name: value for column, value in zip(MARGIN_COLUMNS, row, strict=True)}


def test_each_pair_groups_margin_own_gain_and_cross_gap_are_means_over_seeds_with_their_t_interval():
    """Within, (1, 0): seed 1 margin 55 - 50 = 5, own gain 60 - 50 = 10, cross gap 60 - 55 = 5; seed 2 margin
    45 - 50 = -5, own gain 10, cross gap 60 - 45 = 15. Across, (2, 0) and (2, 1): seed 1 margins 8 and 2 (mean 5),
    own gains 20 and 10 (15), cross gaps 12 and 8 (10); seed 2 margins 10 and 10 (10), own gains 30 and 20 (25),
    cross gaps 20 and 10 (15). The own gain within is 10 in both seeds: no spread, no interval."""
    within, across = map(cells, margin_rows(two_seeds()))
    assert within["strategy"] == across["strategy"] == "er"
    assert (within["pair_group"], across["pair_group"]) == ("within segments", "across replacements")
    expected = {"within": {"margin": (0.0, 10), "own_gain": (10.0, None), "cross_gap": (10.0, 10)},
                "across": {"margin": (7.5, 5), "own_gain": (20.0, 10), "cross_gap": (12.5, 5)}}
    for row, group in ((within, "within"), (across, "across")):
        for part, (mean, seed_difference) in expected[group].items():
            assert row[part] == pytest.approx(mean), (group, part)
            if seed_difference is None:
                assert row[f"{part}_interval"] is None, (group, part)
            else:
                half = T_975_1 * seed_difference / 2
                assert row[f"{part}_interval"] == pytest.approx((mean - half, mean + half)), (group, part)
    assert (within["pairs"], across["pairs"]) == (1, 2) and within["seeds"] == across["seeds"] == 2


def random_runs(seeds: int, tasks: int, replacements: list[int]) -> list[dict]:
    rng = np.random.default_rng(0)
    runs = []
    for seed in range(seeds):
        matrix = [[float(v) for v in rng.uniform(0, 1, t + 1)] for t in range(tasks)]
        runs.append({**valid_record(seed), "compatibility_matrix": matrix, "replacement_tasks": replacements,
                     "num_tasks": tasks})
    return runs


@pytest.mark.parametrize("runs", [two_seeds(), random_runs(5, 7, [0, 2, 4])], ids=["by hand", "random"])
def test_in_every_row_the_margin_is_the_own_gain_less_the_cross_gap(runs):
    rows = list(map(cells, margin_rows(runs)))
    assert len(rows) == 2
    for row in rows:
        assert row["margin"] == pytest.approx(row["own_gain"] - row["cross_gap"], abs=1e-9)


def test_the_groups_count_the_pairs_as_the_across_table_does():
    """Seven tasks, replacements at 0, 2 and 4: the segments 0-1, 2-3 and 4-6 hold 1 + 1 + 3 = 5 pairs, the other
    16 of the 21 lie across a replacement (the across table's 16)."""
    within, across = map(cells, margin_rows(random_runs(2, 7, [0, 2, 4])))
    assert (within["pairs"], across["pairs"]) == (5, 16)


def test_a_group_without_pairs_has_no_row_and_one_seed_has_no_interval():
    """Replacement at task 0 only: every pair lies within the one segment. A replacement at every task: every pair
    lies across one."""
    (alone,) = map(cells, margin_rows([changed(valid_record(1), "replacement_tasks", [0])]))
    assert alone["pair_group"] == "within segments" and alone["pairs"] == 3 and alone["seeds"] == 1
    # pairs (1, 0), (2, 0), (2, 1): margins 5, 8, 2; own gains 10, 20, 10; cross gaps 5, 12, 8
    assert (alone["margin"], alone["own_gain"], alone["cross_gap"]) == pytest.approx((5.0, 40 / 3, 25 / 3))
    assert alone["margin_interval"] is None and alone["own_gain_interval"] is None
    (replaced,) = map(cells, margin_rows([changed(valid_record(1), "replacement_tasks", [0, 1, 2])]))
    assert replaced["pair_group"] == "across replacements" and replaced["pairs"] == 3


def test_an_interval_stays_within_the_range_of_a_difference_of_accuracies():
    """Within margins 5 and -80 (M[0][0] 0.9, M[1][0] 0.1): mean -37.5, half-width 12.7 * 42.5 = 540 points,
    shown as -100 to 100."""
    runs = [{**valid_record(seed), "compatibility_matrix": matrix, "num_tasks": 2, "replacement_tasks": [0]}
            for seed, matrix in ((1, [[0.5, None], [0.55, 0.6]]), (2, [[0.9, None], [0.1, 0.95]]))]
    (row,) = map(cells, margin_rows(runs))
    assert row["margin"] == pytest.approx(-37.5) and row["margin_interval"] == (-100.0, 100.0)


def test_the_github_table_names_each_part_in_points_beside_its_interval():
    (table,) = build(two_seeds(), names=["margins"])["margins"]
    header, _, within, across = render([table]).splitlines()
    assert [h.strip() for h in header.split("|")[4:11]] == [
        "pair group", "margin (points)", "margin 95% CI", "own gain (points)", "own gain 95% CI",
        "cross gap (points)", "cross gap 95% CI"]
    assert [c.strip() for c in within.split("|")[4:13]] == [
        "within segments", "0.00", "[-63.53, 63.53]", "10.00", "-", "10.00", "[-53.53, 73.53]", "1", "2"]
    assert [c.strip() for c in across.split("|")[4:7]] == ["across replacements", "7.50", "[-24.27, 39.27]"]
