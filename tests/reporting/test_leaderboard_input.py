"""The leaderboard on hand-made result folders: a malformed, out-of-range or unreadable ``metrics.json`` is left
out and named on stderr with its reason; it never crashes a table nor is averaged into a row."""
import copy
import csv
import io

import pytest
from helpers.records import (
    DELETE,
    MATRIX,
    changed,
    former_update_record,
    retrieval_record,
    update_record,
    valid_record,
    write,
)

from benchmarks.metrics import all_metrics, as_matrix
from benchmarks.record import record_problem
from cl2r_bench.app import cli as runner
from cl2r_bench.reporting.experiments import collect
from cl2r_bench.reporting.leaderboard import TABLES

BAD_FILES = {
    "ac_above_one": (lambda: changed(valid_record(2), "metrics.AC", 1.7), "'metrics.AC' is 1.7"),
    "string_seed": (lambda: changed(valid_record(3), "seed", "3"), "'seed' is '3'"),
    "missing_metric": (lambda: changed(valid_record(4), "metrics.AA", DELETE), "'metrics.AA' is missing"),
    "long_row": (lambda: changed(valid_record(5), "compatibility_matrix.0", [0.5, None, None, None]),
                 "compatibility_matrix: row 0 has 4 entries"),
    "deep": (lambda: "[" * 100000, "nesting too deep"),
    "not_utf8": (lambda: b'{"scenario": "iamcl2r", "dataset": "synth\xe9tic"}', "not UTF-8"),
    "case_above_100": (lambda: changed(retrieval_record(6), "retrieval.cases.B/old.mAP", 140.0),
                       "'retrieval.cases.B/old' is"),
    "no_retrieval": (lambda: changed(retrieval_record(7), "retrieval", DELETE), "'retrieval' is missing"),
    "flip_above_one": (lambda: changed(valid_record(8), "negative_flips.cross.1", 1.5),
                       "'negative_flips.cross' is [0.1, 1.5]"),
    "flips_per_pair": (lambda: changed(valid_record(9), "negative_flips.self", [0.05]),
                       "'negative_flips.self' has 1 rates; it must have 2"),
    "study_flips_per_pair": (lambda: changed(retrieval_record(10), "retrieval.negative_flips.cross", [0.0, 0.1]),
                             "'retrieval.negative_flips.cross' has 2 rates; it must have 1"),
    "unmatched_as_text": (lambda: changed(retrieval_record(11), "retrieval.queries_without_match", "many"),
                          "'retrieval.queries_without_match' is 'many'; it must be a whole number"),
    "hits_as_number": (lambda: changed(retrieval_record(12), "retrieval.query_top1", {"B/old": 5}),
                       "'retrieval.query_top1' is {'B/old': 5}; it must be an object of per-query hits"),
}


@pytest.fixture
def results(tmp_path):
    """A results folder with one valid record and every file of ``BAD_FILES``, in the valid record's group."""
    write(tmp_path, "valid", valid_record())
    bad = {name: write(tmp_path, name, make()) for name, (make, _) in BAD_FILES.items()}
    return tmp_path, bad


def test_leaderboard_skips_and_names_bad_files(results, capsys):
    folder, bad = results
    assert runner.main(["leaderboard", "--results", str(folder), "--format", "csv", "--table", "main"]) == 0
    out, err = capsys.readouterr()
    metrics = valid_record()["metrics"]
    (header, row), = [list(csv.reader(io.StringIO(out)))]
    assert header[3:9] == ["AC_mean", "AC_std", "AA_mean", "AA_std", "ACA_mean", "ACA_std"]
    assert row[:3] == ["iamcl2r", "synthetic", "er"] and row[-1] == "1"
    assert [float(v) for v in row[3:9:2]] == pytest.approx([metrics["AC"], metrics["AA"], metrics["ACA"]])
    assert row[4:10:2] == ["", "", ""]
    assert "skipped" not in out and not any(str(path) in out for path in bad.values())
    notes = err.strip().splitlines()
    assert len(notes) == len(BAD_FILES)
    for name, path in bad.items():
        line = next(line for line in notes if line.startswith(f"skipped {path}: "))
        assert BAD_FILES[name][1] in line, line


def test_bad_values_are_never_averaged_into_any_table(results, capsys):
    folder, _ = results
    for table in TABLES:
        code = runner.main(["leaderboard", "--results", str(folder), "--format", "csv", "--table", table])
        out = capsys.readouterr().out
        if code == 2:  # a table no record has data for
            continue
        rows = list(csv.DictReader(io.StringIO(out)))
        assert rows and {row["seeds"] for row in rows} == {"1"}, table
        assert all(float(row[name]) <= 1 for row in rows for name in ("AC_mean", "AC") if row.get(name)), table
    assert runner.main(["leaderboard", "--results", str(folder), "--matrices"]) == 0
    assert "#### iamcl2r / synthetic / er (1 seed)" in capsys.readouterr().out


def test_only_bad_files_is_a_usage_error(tmp_path, capsys):
    write(tmp_path, "ac", changed(valid_record(), "metrics.AC", 1.7))
    assert runner.main(["leaderboard", "--results", str(tmp_path), "--format", "csv"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "'metrics.AC' is 1.7" in err and "no complete metrics.json" in err


def test_collect_pairs_each_skipped_path_with_its_reason(tmp_path):
    valid = write(tmp_path, "valid", valid_record())
    partial = write(tmp_path, "partial", {**valid_record(), "complete": False, "tasks_completed": 2})
    broken = write(tmp_path, "broken", '{"complete": true,')
    records, skipped = collect(tmp_path)
    assert len(records) == 1 and records[0]["seed"] == 1 and valid not in dict(skipped)
    reasons = dict(skipped)
    assert reasons[partial] == "incomplete run (2 of 3 tasks)" and reasons[broken].startswith("not valid JSON")


@pytest.mark.parametrize("record", [valid_record(), update_record(),
                                    {"complete": True, "scenario": "cl2r", "dataset": "synthetic", "strategy": "er",
                                     "seed": 0, "metrics": {"AC": 1.0, "AA": 50, "ACA": None}}])
def test_well_formed_records_pass(record):
    assert record_problem(record) is None


@pytest.mark.parametrize("record, fragment", [
    ([1, 2], "not a JSON object"),
    ({"complete": "yes"}, "'complete' is 'yes'"),
    ({"complete": False}, "incomplete run (? of ? tasks)"),
    (changed(valid_record(), "scenario", ""), "'scenario' is ''"),
    (changed(valid_record(), "method", None), "'method' is None"),
    (changed(valid_record(), "seed", True), "'seed' is True"),
    (changed(valid_record(), "num_tasks", 3.5), "'num_tasks' is 3.5"),
    (changed(valid_record(), "tasks_completed", 2), "tasks_completed is 2 of num_tasks 3"),
    (changed(valid_record(), "metrics", [0.5]), "'metrics' is [0.5]"),
    (changed(valid_record(), "metrics.AC", float("nan")), "'metrics.AC' is nan"),
    (changed(valid_record(), "metrics.AA", 101.0), "'metrics.AA' is 101.0"),
    (changed(valid_record(), "metrics.ACA", "30"), "'metrics.ACA' is '30'"),
    (changed(valid_record(), "metrics.BC", float("inf")), "'metrics.BC' is inf"),
    (changed(valid_record(), "compatibility_matrix.2.0", 58.0), "looks like a percent"),
    (changed(valid_record(), "compatibility_matrix", [[0.5, None], [0.55, 0.6]]), "2 rows but num_tasks is 3"),
    (changed(valid_record(), "replacement_tasks", [0, "2"]), "'replacement_tasks' is [0, '2']"),
    (changed(valid_record(), "config", "er"), "'config' is 'er'"),
    (changed(valid_record(), "config.adapter", "none"), "'config.adapter' is 'none'"),
    (changed(valid_record(), "noise", [0.5]), "'noise' is [0.5]"),
    (changed(valid_record(), "noise.AC_interval", [0.2]), "'noise.AC_interval' is [0.2]"),
    (changed(valid_record(), "noise.across", None), "'noise.across' is None"),
    (changed(valid_record(), "noise.across.AC_upper", 2), "'noise.across.AC_upper' is 2"),
    (changed(valid_record(), "noise.queries", DELETE), "'noise.queries' is missing"),
    (changed(valid_record(), "replacement_models", None), "'replacement_models' is None"),
    (changed(valid_record(), "replacement_models.1.own_accuracy", 45.0), "'replacement_models[1].own_accuracy'"),
    (changed(valid_record(), "replacement_models.0.classes", [3]), "'replacement_models[0].classes' is [3]"),
    (changed(valid_record(), "timings", None), "'timings' is None"),
    (changed(valid_record(), "timings.tasks.1", {"seconds": 2.0, "iterations": "100"}),
     "'timings.tasks[1].iterations' is '100'"),
    (changed(update_record(), "retrieval.cases.B/old.top1", 145.0), "'retrieval.cases.B/old' is"),
    (changed(update_record(), "retrieval.backfilling.auc", None), "'retrieval.backfilling.auc' is None"),
    (changed(update_record(), "retrieval.backfilling.auc.random.top1_auc", -0.1),
     "'retrieval.backfilling.auc.random' is"),
    (changed(update_record(), "retrieval", DELETE), "'retrieval' is missing"),
    (changed(update_record(), "adapter.fits", None), "'adapter' is"),
    (changed(update_record(), "adapter.fits.0.f_W", "0.02"), "'adapter.fits[0].f_W' is '0.02'"),
    (former_update_record(), "a model_update record of the former layout (top-level 'cases', top-1 only)"),
])
def test_record_problem_names_the_field(record, fragment):
    problem = record_problem(record)
    assert problem is not None and fragment in problem and "\n" not in problem, problem


def test_deeply_nested_config_is_a_problem_not_a_crash():
    record = valid_record()
    deep: dict = {}
    for _ in range(2000):
        deep = {"x": deep}
    record["config"]["model"] = deep
    assert "nested too deeply" in record_problem(record)


def test_matrices_of_different_sizes_in_one_group_do_not_crash(tmp_path, capsys):
    short = valid_record(2)
    for key in ("config", "num_tasks", "tasks_completed", "noise", "replacement_models", "negative_flips"):
        del short[key]
    short["compatibility_matrix"] = [[0.5, None], [0.55, 0.6]]
    short["metrics"] = all_metrics(as_matrix(short["compatibility_matrix"]))
    long = copy.deepcopy(short)
    long["compatibility_matrix"], long["metrics"] = MATRIX, all_metrics(as_matrix(MATRIX))
    write(tmp_path, "short", short)
    write(tmp_path, "long", long)
    assert runner.main(["leaderboard", "--results", str(tmp_path), "--matrices"]) == 0
    out = capsys.readouterr().out
    assert "#### iamcl2r / synthetic / er [2 tasks] (1 seed)" in out and "er [3 tasks] (1 seed)" in out


def test_fifos_device_links_and_copies_are_named_never_read_or_counted_twice(tmp_path, capsys):
    """A metrics.json that is a FIFO or a link to /dev/zero would hang or fill memory: it is skipped with
    its reason; a copy of a record is counted once, not as a second seed."""
    import os

    write(tmp_path, "run", valid_record(1))
    (tmp_path / "copy").mkdir()
    (tmp_path / "copy" / "metrics.json").write_bytes((tmp_path / "run" / "metrics.json").read_bytes())
    (tmp_path / "fifo").mkdir()
    os.mkfifo(tmp_path / "fifo" / "metrics.json")
    (tmp_path / "zero").mkdir()
    (tmp_path / "zero" / "metrics.json").symlink_to("/dev/zero")
    assert runner.main(["leaderboard", "--results", str(tmp_path), "--format", "csv", "--table", "main"]) == 0
    out, err = capsys.readouterr()
    assert list(csv.DictReader(io.StringIO(out)))[0]["seeds"] == "1"
    assert err.count("not a regular file") == 2 and "a copy of" in err
