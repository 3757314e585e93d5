import json
import math

import numpy as np
import pytest
from helpers.runs import ER_REFERENCE_ROWS as ER_ROWS
from helpers.runs import HOC_REFERENCE_ROWS as HOC_ROWS

from benchmarks.metrics import (
    MatrixError,
    across_replacements,
    all_metrics,
    as_matrix,
    average_accuracy,
    average_compatibility,
    average_cross_model_accuracy,
    backward_compatibility,
    forward_compatibility,
    load_matrix,
    margin_parts,
    replacement_pairs,
)
from cl2r_bench.app import cli as runner

# Hand-built 3x3 (fractions). Pair (1,0): 0.5 vs M[0][0]=0.5 is a tie; (2,0): 0.6 > 0.5; (2,1): 0.4 < 0.6.
TIE_ROWS = [
    [0.5],
    [0.5, 0.6],
    [0.6, 0.4, 0.7],
]


def test_hoc_reference_matrix_metrics():
    metrics = all_metrics(as_matrix(HOC_ROWS))
    assert metrics["AC"] == pytest.approx(20 / 21)
    assert round(metrics["AC"], 3) == 0.952
    assert round(metrics["AA"], 2) == 68.90
    assert metrics["violations"] == [[4, 3]]


def test_er_reference_matrix_metrics():
    metrics = all_metrics(as_matrix(ER_ROWS))
    assert metrics["AC"] == 0.0
    assert round(metrics["AA"], 2) == 35.18
    assert len(metrics["violations"]) == 21


def test_as_matrix_converts_percent_to_fractions():
    matrix = as_matrix(HOC_ROWS)
    assert matrix.shape == (7, 7)
    assert matrix[0, 0] == pytest.approx(0.5889)
    assert matrix[6, 6] == pytest.approx(0.7716)
    assert matrix[4, 3] == pytest.approx(0.7211)
    assert np.isnan(matrix[np.triu_indices(7, k=1)]).all()


@pytest.mark.parametrize("rows", [HOC_ROWS, ER_ROWS])
def test_fraction_input_gives_identical_metrics(rows):
    fractions = [[v / 100 for v in row] for row in rows]
    np.testing.assert_array_equal(as_matrix(fractions), as_matrix(rows))
    assert all_metrics(as_matrix(fractions)) == all_metrics(as_matrix(rows))


def test_strict_tie_rule_does_not_count_ties():
    matrix = as_matrix(TIE_ROWS)
    # compatible pairs: only (2,0) -> 1 of 3
    assert average_compatibility(matrix) == pytest.approx(1 / 3)
    assert all_metrics(matrix)["violations"] == [[1, 0], [2, 1]]


def test_inclusive_tie_rule_counts_ties():
    matrix = as_matrix(TIE_ROWS)
    # compatible pairs: (1,0) tie and (2,0) -> 2 of 3
    assert average_compatibility(matrix, "inclusive") == pytest.approx(2 / 3)
    assert all_metrics(matrix, "inclusive")["violations"] == [[2, 1]]


def test_unknown_tie_rule_raises():
    with pytest.raises(ValueError):
        average_compatibility(as_matrix(TIE_ROWS), "loose")


def test_hand_computed_accuracy_metrics():
    matrix = as_matrix(TIE_ROWS)
    # AA = (0.5+0.5+0.6+0.6+0.4+0.7)/6 = 0.55
    assert average_accuracy(matrix) == pytest.approx(55.0)
    # ACA = (0.5+0.6+0.4)/3 = 0.5
    assert average_cross_model_accuracy(matrix) == pytest.approx(50.0)
    # BC = mean(0.6-0.5, 0.4-0.6) = -0.05
    assert backward_compatibility(matrix) == pytest.approx(-5.0)
    # FC = mean(0.5-0.6, 0.4-0.7) = -0.2
    assert forward_compatibility(matrix) == pytest.approx(-20.0)


def test_per_task_lists():
    metrics = all_metrics(as_matrix(TIE_ROWS))
    # AC_t: [T=1 -> 1, (1,0) tie -> 0, 1 of 3]
    assert metrics["AC_per_task"] == pytest.approx([1.0, 0.0, 1 / 3])
    # AA_t: [0.5, (0.5+0.5+0.6)/3, 0.55]
    assert metrics["AA_per_task"] == pytest.approx([50.0, 160 / 3, 55.0])
    inclusive = all_metrics(as_matrix(TIE_ROWS), "inclusive")
    assert inclusive["AC_per_task"] == pytest.approx([1.0, 1.0, 2 / 3])


def test_single_task_matrix():
    metrics = all_metrics(as_matrix([[0.7]]))
    assert metrics["AC"] == 1.0
    assert metrics["AA"] == pytest.approx(70.0)
    assert metrics["ACA"] is None
    assert metrics["BC"] is None
    assert metrics["FC"] is None
    assert metrics["violations"] == []


def test_genuine_zero_accuracy_is_counted():
    metrics = all_metrics(as_matrix([[0.5], [0.0, 0.5]]))
    # AA = (0.5+0.0+0.5)/3
    assert round(metrics["AA"], 2) == 33.33
    assert metrics["ACA"] == 0.0
    assert metrics["AC"] == 0.0
    assert metrics["BC"] == pytest.approx(-50.0)


def test_load_matrix_list_of_rows(tmp_path):
    path = tmp_path / "m.json"
    path.write_text(json.dumps(HOC_ROWS))
    np.testing.assert_array_equal(load_matrix(path), as_matrix(HOC_ROWS))


def test_load_matrix_object_with_nulls(tmp_path):
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"compatibility_matrix": [[0.5, None], [0.4, 0.6]], "other": 1}))
    matrix = load_matrix(path)
    assert matrix[0, 0] == 0.5
    assert matrix[1, 0] == 0.4
    assert matrix[1, 1] == 0.6
    assert math.isnan(matrix[0, 1])


@pytest.mark.parametrize("text", [
    json.dumps({"matrix": [[0.5]]}),
    json.dumps({"compatibility_matrix": "0.5"}),
    json.dumps(42),
    json.dumps([]),
    json.dumps([[0.5], [0.4, None]]),
    json.dumps([[0.5], [None, 0.6]]),
    json.dumps([[0.5], ["0.4", 0.6]]),
    json.dumps([[50.0], [101.0, 60.0]]),
    json.dumps([[0.5], [-0.1, 0.6]]),
    "[[0.5], [0.4, 0.6]",
])
def test_load_matrix_rejects_malformed(tmp_path, text):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(MatrixError):
        load_matrix(path)


def test_load_matrix_missing_file(tmp_path):
    with pytest.raises(MatrixError, match="does not exist"):
        load_matrix(tmp_path / "absent.json")


def test_across_replacements_on_the_reference_matrices():
    # replacements at 2 and 4: pairs (t >= 2, k < 2) and (t >= 4, k < 4) -> 10 + 6 = 16 of the 21 pairs
    pairs = replacement_pairs(7, [0, 2, 4])
    assert pairs.sum() == 16 and pairs[2, 1] and pairs[4, 3] and not pairs[3, 2] and not pairs[1, 0]
    hoc = across_replacements(as_matrix(HOC_ROWS), [0, 2, 4])
    assert hoc["pairs_across"] == 16 and hoc["AC_across"] == pytest.approx(15 / 16)     # only (4, 3) fails
    er = across_replacements(as_matrix(ER_ROWS), [0, 2, 4])
    across_entries = [ER_ROWS[t][k] for t in range(7) for k in range(t) if k < 2 <= t or k < 4 <= t]
    assert er["AC_across"] == 0.0 and er["ACA_across"] == pytest.approx(np.mean(across_entries))
    assert across_replacements(as_matrix(ER_ROWS), [0]) == {"AC_across": None, "ACA_across": None,
                                                             "pairs_across": 0}


def test_margin_parts_split_each_pair_groups_mean_margin_into_own_gain_less_cross_gap():
    """TIE_ROWS with a replacement at 2. Within, (1, 0): margin 50 - 50 = 0, own gain 60 - 50 = 10, cross gap
    60 - 50 = 10. Across, (2, 0): margin 60 - 50 = 10, own gain 70 - 50 = 20, cross gap 70 - 60 = 10; (2, 1): margin
    40 - 60 = -20, own gain 70 - 60 = 10, cross gap 70 - 40 = 30; means -5, 15 and 20."""
    parts = margin_parts(as_matrix(TIE_ROWS), [0, 2])
    assert parts["within"] == pytest.approx({"margin": 0.0, "own_gain": 10.0, "cross_gap": 10.0, "pairs": 1})
    assert parts["across"] == pytest.approx({"margin": -5.0, "own_gain": 15.0, "cross_gap": 20.0, "pairs": 2})
    assert margin_parts(as_matrix(TIE_ROWS), [0])["across"] == {"margin": None, "own_gain": None,
                                                                "cross_gap": None, "pairs": 0}


@pytest.mark.parametrize("rows", [HOC_ROWS, ER_ROWS], ids=["hoc", "er"])
def test_margin_parts_of_the_reference_matrices_add_up_and_count_the_across_tables_pairs(rows):
    parts = margin_parts(as_matrix(rows), [0, 2, 4])
    assert (parts["within"]["pairs"], parts["across"]["pairs"]) == (5, 16)
    for group in parts.values():
        assert group["margin"] == pytest.approx(group["own_gain"] - group["cross_gap"])


MIXED_ROWS = [[50.0], [0.5, 60.0]]


def test_auto_scale_refuses_a_matrix_mixing_fractions_and_percent():
    with pytest.raises(MatrixError) as caught:
        as_matrix(MIXED_ROWS)
    message = str(caught.value)
    assert "entry [1][0] = 0.5 looks like a fraction" in message and "entry [0][0] = 50 looks like a percent" in message
    assert "--scale percent" in message and "\n" not in message


def test_auto_scale_reads_pure_percent_and_pure_fractions():
    np.testing.assert_allclose(as_matrix([[50.0], [0.0, 60.0]]), [[0.5, np.nan], [0.0, 0.6]])
    np.testing.assert_array_equal(as_matrix([[1.0], [0.0, 1.0]]), [[1.0, np.nan], [0.0, 1.0]])
    np.testing.assert_array_equal(as_matrix(HOC_ROWS, scale="auto"), as_matrix(HOC_ROWS, scale="percent"))


def test_explicit_scales():
    np.testing.assert_allclose(as_matrix(MIXED_ROWS, scale="percent"), [[0.5, np.nan], [0.005, 0.6]])
    np.testing.assert_array_equal(as_matrix(TIE_ROWS, scale="fraction"), as_matrix(TIE_ROWS))
    with pytest.raises(MatrixError, match=r"entry \[0\]\[0\] is 50.0; accuracies must be fractions in \[0, 1\]"):
        as_matrix(MIXED_ROWS, scale="fraction")
    with pytest.raises(MatrixError, match=r"entry \[1\]\[0\] is 100.5; accuracies must be percent in \[0, 100\]"):
        as_matrix([[50.0], [100.5, 60.0]], scale="percent")
    with pytest.raises(MatrixError, match="unknown scale 'percentage'"):
        as_matrix(TIE_ROWS, scale="percentage")


def test_load_matrix_passes_the_scale(tmp_path):
    path = tmp_path / "mixed.json"
    path.write_text(json.dumps({"compatibility_matrix": MIXED_ROWS}))
    with pytest.raises(MatrixError, match="looks like a percent"):
        load_matrix(path)
    assert load_matrix(path, scale="percent")[1, 0] == pytest.approx(0.005)


def test_metrics_command_scale_option(tmp_path, capsys):
    path = tmp_path / "mixed.json"
    path.write_text(json.dumps(MIXED_ROWS))
    assert runner.main(["metrics", str(path), "--json"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--scale percent" in err
    assert runner.main(["metrics", str(path), "--json", "--scale", "percent"]) == 0
    assert json.loads(capsys.readouterr().out)["AA"] == pytest.approx((50.0 + 0.5 + 60.0) / 3)


def test_deeply_nested_json_is_one_line_exit_2(tmp_path, capsys):
    path = tmp_path / "deep.json"
    path.write_text("[" * 100000)
    with pytest.raises(MatrixError, match="nesting too deep"):
        load_matrix(path)
    assert runner.main(["metrics", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1 and "nesting too deep" in err and "Traceback" not in err
