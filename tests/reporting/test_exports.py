"""Paper-ready exports of ``runner.py leaderboard``: a csv output is one table of plain numbers (mean and std in
their own columns, counts as integers), latex is a booktabs tabular ready to paste, and ``--matrices`` follows
``--format``. The results folders are written by hand so that every expected number is computed here."""
import csv
import io
import math

import pytest
from helpers.records import retrieval_record, update_record, valid_record, write

from cl2r_bench.app import cli as runner
from cl2r_bench.reporting.leaderboard import TABLES
from cl2r_bench.reporting.tables import Column, Kind, Table, render

HOC = {1: {"AC": 0.5, "AA": 40.0, "ACA": 30.0}, 2: {"AC": 1.0, "AA": 43.0, "ACA": 31.0}}
MATRICES = {1: [[0.5, None, None], [0.55, 0.6, None], [0.58, 0.62, 0.7]],
            2: [[0.4, None, None], [0.45, 0.5, None], [0.48, 0.52, 0.6]]}
MAIN_HEADER = ["scenario", "dataset", "strategy", "AC_mean", "AC_std", "AA_mean", "AA_std", "ACA_mean", "ACA_std",
               "NFR_self_mean", "NFR_self_std", "NFR_cross_mean", "NFR_cross_std", "starting_models", "seeds"]
MATRIX_HEADER = ["scenario", "dataset", "strategy", "t", "k", "mean", "std", "seeds"]
COUNTS = {"seeds", "queries", "pairs", "classes", "replacement_task", "t", "k", "pairs_within_noise",
          "across_pairs_within_noise"}


def sample_std(a: float, b: float) -> float:
    """The sample standard deviation (ddof = 1) of two values: |a - b| / sqrt(2)."""
    return abs(a - b) / math.sqrt(2)


def upgrade_record() -> dict:
    """A complete ``upgrade`` run (the BCT line's two-model protocol) with its ``two_model`` cases and flips."""
    record = valid_record(1)
    record.update(scenario="upgrade", strategy="bct", method="bct", num_tasks=2, tasks_completed=2,
                  replacement_tasks=[0], compatibility_matrix=[[0.5, None], [0.4, 0.6]],
                  negative_flips={"self": [0.1], "cross": [0.2], "mean_self": 0.1, "mean_cross": 0.2})
    record["config"] = {**record["config"], "scenario": "upgrade", "strategy": "bct"}
    record["timings"] = {**record["timings"], "tasks": record["timings"]["tasks"][:2]}
    scores = {"top1": 50.0, "top5": 70.0, "mAP": 30.0}
    record["two_model"] = {"cases": {"old/old": scores, "new/old": scores, "new/new": scores},
                           "negative_flips": {"self": [0.1], "cross": [0.3], "mean_self": 0.1, "mean_cross": 0.3},
                           "query_top1": {}, "cmc": {}, "queries": 10, "queries_without_match": 0,
                           "unmatched_queries": "miss"}
    return record


def hoc_record(seed: int) -> dict:
    """A complete dsimplex_hoc run of seed 1 or 2, with the metrics of ``HOC`` and the matrix of ``MATRICES``."""
    record = valid_record(seed)
    record["strategy"] = record["method"] = record["config"]["strategy"] = "dsimplex_hoc"
    record["config"]["strategy_params"] = {"dsimplex_hoc": {}}
    record["metrics"].update(HOC[seed])
    record["compatibility_matrix"] = MATRICES[seed]
    terms = {"classification": [0.3, 0.2], "hoc": [2.0, 1.5]}
    record["timings"] = {**record["timings"], "tasks": [{**task, "loss_terms": terms}
                                                        for task in record["timings"]["tasks"]]}
    return record


@pytest.fixture
def results(tmp_path):
    """Two seeds of dsimplex_hoc (with noise, replacement models, timings and matrices), one model_update run and one
    leave-one-out run of ``runner.py adapt``."""
    for seed in HOC:
        write(tmp_path, f"hoc{seed}", hoc_record(seed))
    write(tmp_path, "update", update_record())
    write(tmp_path, "adapt", retrieval_record())
    write(tmp_path, "upgrade", upgrade_record())
    return tmp_path


def leaderboard(capsys, folder, *args: str) -> tuple[int, str, str]:
    code = runner.main(["leaderboard", "--results", str(folder), *args])
    out, err = capsys.readouterr()
    return code, out, err


def csv_rows(text: str) -> tuple[list[str], list[dict[str, str]]]:
    """The header and the rows of a csv text, each row checked to have one field per header name."""
    lines = list(csv.reader(io.StringIO(text)))
    assert all(len(line) == len(lines[0]) for line in lines), text
    return lines[0], [dict(zip(lines[0], line, strict=True)) for line in lines[1:]]


def test_csv_main_table_has_mean_and_std_columns_of_plain_numbers(results, capsys):
    code, out, err = leaderboard(capsys, results, "--format", "csv")
    assert code == 0 and "±" not in out
    header, rows = csv_rows(out)
    assert header == MAIN_HEADER
    hoc = next(row for row in rows if row["strategy"] == "dsimplex_hoc")
    for metric in ("AC", "AA", "ACA"):
        a, b = HOC[1][metric], HOC[2][metric]
        assert float(hoc[f"{metric}_mean"]) == pytest.approx((a + b) / 2)
        assert float(hoc[f"{metric}_std"]) == pytest.approx(sample_std(a, b))
    assert hoc["seeds"] == "2"
    note = err.strip().splitlines()
    assert len(note) == 1 and "noise" in note[0] and "matrices" in note[0] and "--table NAME" in note[0]


@pytest.mark.parametrize("table", TABLES)
def test_every_table_in_csv_is_one_table_with_integer_counts(results, capsys, table):
    code, out, _ = leaderboard(capsys, results, "--format", "csv", "--table", table)
    assert code == 0 and "±" not in out and "\n\n" not in out
    header, rows = csv_rows(out)
    assert rows and len(set(header)) == len(header)
    for row in rows:
        for name in COUNTS & set(header):
            assert row[name] == "" or row[name].isdigit(), (name, row[name])


def test_csv_with_timing_is_the_timing_table_alone(results, capsys):
    code, out, err = leaderboard(capsys, results, "--format", "csv", "--timing")
    header, rows = csv_rows(out)
    assert code == 0 and header[3:] == ["train_ms_per_iteration", "ratio_to_baseline", "seeds"]
    assert {row["strategy"]: row["train_ms_per_iteration"] for row in rows} == {"dsimplex_hoc": "20.0", "bct": "20.0"}
    assert rows[0]["ratio_to_baseline"] == "" and "main" in err


def test_matrices_in_csv_are_long_rows_with_zero_based_tasks(results, capsys):
    code, out, err = leaderboard(capsys, results, "--matrices", "--format", "csv")
    assert code == 0 and "±" not in out
    header, rows = csv_rows(out)
    assert header == MATRIX_HEADER
    hoc = {(int(row["t"]), int(row["k"])): row for row in rows if row["strategy"] == "dsimplex_hoc"}
    assert sorted(hoc) == [(0, 0), (1, 0), (1, 1), (2, 0), (2, 1), (2, 2)]
    for (t, k), row in hoc.items():
        a, b = 100 * MATRICES[1][t][k], 100 * MATRICES[2][t][k]
        assert float(row["mean"]) == pytest.approx((a + b) / 2)
        assert float(row["std"]) == pytest.approx(sample_std(a, b)) and row["seeds"] == "2"
    assert "across" in err
    assert leaderboard(capsys, results, "--format", "csv", "--table", "matrices")[1] == out


def test_latex_is_a_booktabs_tabular_with_pm_and_escaped_names(results, capsys):
    code, out, _ = leaderboard(capsys, results, "--format", "latex", "--table", "main")
    assert code == 0 and out.count(r"\begin{tabular}") == 1
    assert out.startswith(r"\begin{tabular}{lllrrrrrlr}")
    assert all(rule in out for rule in (r"\toprule", r"\midrule", r"\bottomrule"))
    assert r"dsimplex\_hoc" in out and "dsimplex_hoc" not in out and r"AA (\%)" in out
    std = sample_std(HOC[1]["AC"], HOC[2]["AC"])
    assert f"0.750 $\\pm$ {std:.3f}" in out and "±" not in out


def test_latex_escapes_the_special_characters_of_text():
    table = Table((Column("name", "name", Kind.TEXT), Column("n", "n", Kind.INTEGER)), [["a_b & c#1 50%", 57.0]])
    out = render([table], "latex")
    assert r"a\_b \& c\#1 50\%" in out and "57" in out and "57.0" not in out
    assert out.splitlines()[0] == r"\begin{tabular}{lr}"


def test_matrices_follow_the_format(results, capsys):
    code, out, _ = leaderboard(capsys, results, "--format", "latex", "--table", "matrices")
    title = "iamcl2r / synthetic / dsimplex_hoc (2 seeds)"
    assert code == 0 and out.count(r"\begin{tabular}") == 3 and f"% {title}\n\\begin{{tabular}}{{lrrr}}" in out
    assert r"45.0 $\pm$ 7.1" in out and "±" not in out and out.count(r"\bottomrule") == 3
    code, out, _ = leaderboard(capsys, results, "--matrices")
    assert code == 0 and f"#### {title}" in out and "| 0*" in out and "45.0 ± 7.1" in out


def test_github_keeps_mean_and_std_in_one_cell_and_counts_as_integers(results, capsys):
    code, out, _ = leaderboard(capsys, results)
    assert code == 0
    std = sample_std(HOC[1]["AC"], HOC[2]["AC"])
    assert f"| 0.750 ± {std:.3f}" in out
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if "pairs within noise" in line)
    names = [cell.strip() for cell in lines[header].split("|")[1:-1]]
    row = dict(zip(names, (cell.strip() for cell in lines[header + 2].split("|")[1:-1]), strict=True))
    assert row["queries"] == "144" and row["seeds"] == "2" and row["pairs within noise"].isdigit()


@pytest.mark.parametrize("args, fragment", [
    (["--table", "nope"], "unknown table 'nope'; choose one of main, intervals, noise"),
    (["--format", "csv", "--timing", "--matrices"], "choose one with --table timing"),
])
def test_bad_table_requests_are_one_line_and_exit_code_2(results, capsys, args, fragment):
    code, out, err = leaderboard(capsys, results, *args)
    assert code == 2 and out == "" and fragment in err and len(err.strip().splitlines()) == 1


def test_a_table_without_data_is_one_line_and_exit_code_2(tmp_path, capsys):
    write(tmp_path, "update", update_record())
    code, out, err = leaderboard(capsys, tmp_path, "--format", "csv", "--table", "timing")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "has data for table timing" in err and "main" in err


def test_csv_render_refuses_several_tables():
    table = Table((Column("n", "n", Kind.INTEGER),), [[1]])
    assert render([table], "csv") == "n\n1"
    with pytest.raises(ValueError, match="one table"):
        render([table, table], "csv")
