"""The adapter papers' protocol on the user's own embeddings (`runner.py adapt`): inputs checked in one line each,
cases against values known in advance, and the records on the leaderboard (docs/METHODS.md §7b); the export:
test_adapt_exports.py; encoder specs: test_adapt_encoders.py."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from helpers.adapt_inputs import ROOT, adapt, clustered, write_folder
from helpers.adapter_pairs import few_steps_options

from cl2r_bench.app.cli import main


def test_procrustes_recovers_a_rotation_and_the_cases_say_so(rotated, tmp_path, capsys):
    train, test = rotated
    code, out = adapt("--train", train, "--test", test, "--adapter", "procrustes", "--json", "--output",
                      tmp_path / "out", capsys=capsys)
    assert code == 0, out.err
    line, answer = map(json.loads, out.out.strip().splitlines())
    cases = line["cases"]
    assert line["adapter"] == "procrustes"
    assert answer["summary"][0]["compatible"] == "within noise" and answer["summary"][0]["top1_gain"] == 0
    assert cases["new/new"] == pytest.approx(cases["old/old"], abs=1e-9)
    assert answer["models"]["upgrade"] == "no"              # a rotation of the old space is no better model
    assert answer["classes"].startswith("closed set: all the 6 test classes")
    assert answer["recommendation"].startswith("do not upgrade")
    assert "If upgrading anyway: no adapter is compatible here" in answer["recommendation"]
    for case in ("B/old", "B/B", "new/F", "F/F"):
        for score in ("top1", "top5", "mAP"):
            assert cases[case][score] == pytest.approx(cases["old/old"][score], abs=0.01), (case, score)
    assert cases["F/old"] is None and cases["B/F"] is None
    assert cases["new/old"]["mAP"] < cases["old/old"]["mAP"] - 10
    for order, auc in line["backfilling"].items():
        if auc is not None:
            assert auc["top1_auc"] == pytest.approx(cases["new/new"]["top1"], abs=0.05), order
    assert line["backfilling"]["uncertainty"] is None


def test_without_adapter_only_the_models_own_cases_exist(rotated, tmp_path, capsys):
    train, test = rotated
    code, out = adapt("--train", train, "--test", test, "--adapter", "none", "--json", "--output", tmp_path,
                      capsys=capsys)
    cases = json.loads(out.out.strip().splitlines()[0])["cases"]
    assert [c for c, v in cases.items() if v is not None] == ["old/old", "new/old", "new/new"]


def test_a_list_of_adapters_ends_in_one_summary_table_and_a_recommendation(rotated, tmp_path, capsys):
    train, test = rotated
    code, out = adapt("--train", train, "--test", test, "--adapter", "none", "procrustes", "lambda_orth", "none",
                      "--set", "adapter_params.lambda_orth.max_steps=3", "--output", tmp_path, capsys=capsys)
    assert code == 0, out.err
    lines = out.out.splitlines()
    assert sum("seed 42: top-1/mAP" in line for line in lines) == 3           # 'none' once
    warning = [line for line in lines if line.startswith("warning:")]
    assert len(warning) == 1 and "adapter lambda_orth (seed 42) did not converge in 3 steps" in warning[0]
    assert warning[0].endswith("--set adapter_params.lambda_orth.max_steps=12")
    table = lines[lines.index(next(line for line in lines if line.startswith("adapter "))):]
    assert [row.split()[0] for row in table[2:5]] == ["none", "procrustes", "lambda_orth"]
    assert table[2].split()[1] == "no" and "new/old" in table[2].split() and table[4].split()[-1] == "NO"
    assert next(line for line in lines if line.startswith("recommendation: "))


def test_an_unknown_adapter_in_the_list_is_one_line(rotated, tmp_path, capsys):
    train, test = rotated
    code, out = adapt("--train", train, "--test", test, "--adapter", "procrustes", "orthogonal", "--output", tmp_path,
                      capsys=capsys)
    assert code == 2 and out.err.strip().count("\n") == 0 and "unknown adapter 'orthogonal'" in out.err


def test_every_adapter_runs_records_land_on_the_leaderboard_and_the_export_serves_queries(rotated, tmp_path, capsys):
    train, test = rotated
    out_dir, export = tmp_path / "results", tmp_path / "export"
    code, out = adapt("--train", train, "--test", test, "--adapter", "all", "--seeds", 1, 2, "--output", out_dir,
                      "--export", export, *few_steps_options(), "--set", "model_update.backfill_steps=4",
                      capsys=capsys)
    assert code == 0, out.err
    from cl2r_bench.adapters import list_adapters

    records = sorted((out_dir / "adapt" / "train").glob("*/seed*/metrics.json"))
    assert len(records) == 2 * (1 + len(list_adapters()))
    record = json.loads((out_dir / "adapt" / "train" / "lambda_orth" / "seed2" / "metrics.json").read_text())
    assert record["protocol"] == "leave_one_out"
    assert record["config"]["adapter_params"]["lambda_orth"]["max_steps"] == 4
    assert record["retrieval"]["backfilling"]["betas"] == [0, 0.25, 0.5, 0.75, 1.0]
    assert main(["leaderboard", "--results", str(out_dir), "--table", "retrieval", "--format", "csv"]) == 0
    rows = capsys.readouterr().out.strip().splitlines()
    assert len(rows) == 2 + len(list_adapters())
    assert all(row.split(",")[-1] == "2" for row in rows[1:])

    state = torch.load(export / "procrustes" / "adapter_state.pt", weights_only=True)
    from cl2r_bench.adapters import make_adapter

    adapter = make_adapter("procrustes", {}).restore(state)
    to_old = torch.export.load(export / "procrustes" / "backward.pt2").module()
    old_frame = torch.export.load(export / "procrustes" / "old_frame.pt2").module()
    queries = torch.nn.functional.normalize(torch.randn(4, 8), dim=1)
    expected = torch.nn.functional.normalize(adapter.backward(queries), dim=1)
    torch.testing.assert_close(to_old(queries), expected)
    torch.testing.assert_close(old_frame(queries), queries)
    assert (export / "fct" / "forward.pt2").is_file() and not (export / "fct" / "backward.pt2").exists()
    assert "torch.export.load" in (export / "procrustes" / "README.md").read_text()
    assert not list(export.rglob("*.pt")) or all(p.name == "adapter_state.pt" for p in export.rglob("*.pt"))


@pytest.mark.parametrize("suffix", [".npy", ".pt", ".pt-bf16"])
def test_folders_of_arrays_or_tensors_read_as_the_npz_does(rotated, tmp_path, suffix, capsys):
    train, test = rotated
    with np.load(train) as z:
        folder = write_folder(tmp_path / "train_folder", suffix, z["old"], z["new"], z["labels"])
    results = []
    for source in (train, folder):
        adapt("--train", source, "--test", test, "--adapter", "least_squares", "--json", "--output", tmp_path,
              capsys=None)
        results.append(json.loads(capsys.readouterr().out.strip().splitlines()[0])["cases"])
    if suffix == ".pt-bf16":
        assert results[1]["old/old"]["mAP"] == pytest.approx(results[0]["old/old"]["mAP"], abs=1.0)
    else:
        assert results[0] == results[1]


def bad_inputs(tmp_path: Path) -> list[tuple[Path, str]]:
    old, labels = clustered(4, 3, 5, 0)
    cases = []

    def npz(name: str, **arrays) -> Path:
        path = tmp_path / f"{name}.npz"
        np.savez(path, **arrays)
        return path

    cases.append((npz("missing", old=old, labels=labels), "has no array 'new'"))
    cases.append((npz("rows", old=old, new=old[:-1], labels=labels), "new has 11 rows but labels has 12"))
    nan = old.copy()
    nan[3, 1] = np.nan
    cases.append((npz("nan", old=nan, new=old, labels=labels), r"old has 1 row\(s\) with NaN or inf \(first: row 3\)"))
    cases.append((npz("text", old=old, new=old, labels=labels.astype(str)), "labels must be a 1-D array of integers"))
    cases.append((npz("flat", old=old[:, 0], new=old, labels=labels), "old must be a 2-D float array"))
    zero = old.copy()
    zero[5] = 0
    cases.append((npz("zero", old=old, new=zero, labels=labels), r"new has 1 all-zero row\(s\)"))
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    cases.append((tmp_path / "junk.npz", "is not a readable .npz file"))
    cases.append((tmp_path / "absent.npz", "is neither a .npz file nor a folder"))
    (tmp_path / "empty_folder").mkdir()
    cases.append((tmp_path / "empty_folder", "has no old.npy or old.pt"))
    return cases


def test_each_bad_input_is_one_line_and_exit_2(tmp_path, rotated, capsys):
    """The first through ``runner.py`` in its own process, the others through the same entry point in this one."""
    import re

    train, test = rotated
    for index, (path, message) in enumerate(bad_inputs(tmp_path)):
        command = ["adapt", "--train", str(path), "--test", str(test), "--adapter", "procrustes", "--output",
                   str(tmp_path / "out")]
        if index == 0:
            out = subprocess.run([sys.executable, "runner.py", *command], cwd=ROOT, capture_output=True, text=True,
                                 timeout=120)
            code, err = out.returncode, out.stderr
        else:
            code, err = main(command), capsys.readouterr().err
        assert code == 2, (path, err)
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
        assert re.search(message, err), (message, err)
    assert not (tmp_path / "out").exists()


def test_train_and_test_of_other_widths_or_a_test_without_repeats_are_one_line(tmp_path, rotated, capsys):
    train, _ = rotated
    old, labels = clustered(4, 3, 5, 0)
    narrow = tmp_path / "narrow.npz"
    np.savez(narrow, old=old, new=old, labels=labels)
    assert main(["adapt", "--train", str(train), "--test", str(narrow), "--adapter", "none"]) == 2
    assert "old has 8 dimensions in" in capsys.readouterr().err
    _, test = rotated
    with np.load(test) as z:
        unique = tmp_path / "unique.npz"
        np.savez(unique, old=z["old"][:6], new=z["new"][:6], labels=np.arange(6))
    assert main(["adapt", "--train", str(train), "--test", str(unique), "--adapter", "none"]) == 2
    assert "every label occurs once" in capsys.readouterr().err
    assert main(["adapt", "--train", str(train), "--test", str(test), "--adapter", "nope"]) == 2
    assert "nope" in capsys.readouterr().err
    assert main(["adapt", "--train", str(train), "--test", str(test), "--adapter", "fct",
                 "--set", "adapter_params.fct.layers=0"]) == 2
    assert "layers" in capsys.readouterr().err


def test_an_array_header_claiming_more_than_the_file_holds_is_refused_before_allocating(tmp_path, capsys):
    """A .npz (and a folder's .npy) whose header claims 10^6 x 10^6 floats: one line, exit 2, nothing allocated."""
    import io
    import zipfile

    header = np.lib.format.header_data_from_array_1_0(np.zeros((2, 2), np.float32))
    header["shape"] = (10**6, 10**6)
    forged = io.BytesIO()
    np.lib.format.write_array_header_1_0(forged, header)
    forged.write(b"\0" * 16)
    labels = io.BytesIO()
    np.save(labels, np.arange(4))
    archive = tmp_path / "forged.npz"
    with zipfile.ZipFile(archive, "w") as members:
        for name in ("old", "new"):
            members.writestr(f"{name}.npy", forged.getvalue())
        members.writestr("labels.npy", labels.getvalue())
    folder = tmp_path / "folder"
    folder.mkdir()
    for name in ("old", "new"):
        (folder / f"{name}.npy").write_bytes(forged.getvalue())
    (folder / "labels.npy").write_bytes(labels.getvalue())
    for path in (archive, folder):
        code, out = adapt("--train", path, "--test", path, "--adapter", "none", "--output", tmp_path / "o",
                          capsys=capsys)
        assert code == 2 and len(out.err.strip().splitlines()) == 1, out.err
        assert "header claims an array of shape (1000000, 1000000)" in out.err and "Traceback" not in out.err


@pytest.mark.parametrize("args, message", [
    (["--seeds", str(2**70)], "argument --seeds: must be a whole number from 0 to 4294967295"),
    (["--seeds", "-1"], "argument --seeds: must be a whole number from 0"),
])
def test_seeds_out_of_range_are_one_line(rotated, tmp_path, capsys, args, message):
    train, test = rotated
    code, out = adapt("--train", train, "--test", test, "--adapter", "none", *args, "--output", tmp_path, capsys=capsys)
    assert code == 2 and message in out.err and len(out.err.strip().splitlines()) == 1


def test_a_seed_free_adapter_is_fitted_and_scored_once_and_the_record_says_so(rotated, tmp_path, capsys, monkeypatch):
    """Procrustes on every fitting item (120 < its 2,048 anchors) draws nothing: seeds 1 and 2 reuse seed 0's fit
    and cases (their fit log says so), only the random backfilling order is the seed's own, the adapter-free cases
    are ranked once for the whole study, and a backfilling curve's ends are cases ranked already (no adapter:
    new/old and new/new; Procrustes: new/F). So the study ranks four cases on their own, old/old, F/F, B/old and
    B/B, where three seeds of two adapters used to rank 3 x 3 + 3 x 7. The summary counts it as one fit."""
    from benchmarks import adapted_cases

    ranked = []
    score = adapted_cases.StudySplit.score
    monkeypatch.setattr(adapted_cases.StudySplit, "score",
                        lambda self, q, g, case=None: ranked.append(case) or score(self, q, g, case))
    train, test = rotated
    code, out = adapt("--train", train, "--test", test, "--adapter", "none", "procrustes", "--seeds", 0, 1, 2,
                      "--json", "--output", tmp_path, capsys=capsys)
    assert code == 0, out.err
    lines = [json.loads(line) for line in out.out.strip().splitlines()]
    procrustes = [line for line in lines[:-1] if line["adapter"] == "procrustes"]
    assert [line["cases"] for line in procrustes[1:]] == [procrustes[0]["cases"]] * 2
    assert ranked == ["old/old", "F/F", "B/old", "B/B"]
    records = [json.loads((tmp_path / "adapt" / "train" / "procrustes" / f"seed{s}" / "metrics.json").read_text())
               for s in (0, 1, 2)]
    assert [r["adapter"]["fits"][0].get("same_as_seed") for r in records] == [None, 0, 0]
    summary = {row["adapter"]: row for row in lines[-1]["summary"]}
    assert summary["procrustes"]["seed_free"] and summary["none"]["seed_free"]  # no adapter: every seed alike


def test_a_resumed_study_keeps_what_an_earlier_run_finished_and_measures_only_the_rest(rotated, tmp_path, capsys,
                                                                                      monkeypatch):
    """An earlier study of none, Procrustes and FastFill stopped before FastFill's record was written. With
    ``--resume`` the same command measures FastFill alone, leaves the other two records as they were (byte for
    byte), says which it kept, and answers as the whole study did. Records of other settings, or cut short, are
    refused in one line before anything is fitted, and so is ``--export`` (a kept record has no fitted adapter to
    export)."""
    from cl2r_bench.adapter_study import driver

    measured = []
    evaluate = driver.evaluate_adapter
    monkeypatch.setattr(driver, "evaluate_adapter",
                        lambda study, name, **kwargs: measured.append(name) or evaluate(study, name, **kwargs))
    train, test = rotated
    study = ["--train", train, "--test", test, "--adapter", "none", "procrustes", "fastfill", "--json",
             "--set", "adapter_params.fastfill.max_steps=30", "--output", tmp_path]
    code, out = adapt(*study, capsys=capsys)
    assert code == 0, out.err
    whole = [json.loads(line) for line in out.out.splitlines()]
    folder = tmp_path / "adapt" / "train"
    written = {name: (folder / name / "seed42" / "metrics.json").read_bytes() for name in ("none", "procrustes")}
    (folder / "fastfill" / "seed42" / "metrics.json").unlink()
    measured.clear()
    code, out = adapt(*study, "--resume", capsys=capsys)
    assert code == 0, out.err
    resumed = [json.loads(line) for line in out.out.splitlines()]
    assert measured == ["fastfill"]
    assert [line.get("kept", False) for line in resumed[:-1]] == [True, True, False]
    for before, after in zip(whole[:-1], resumed[:-1], strict=True):
        assert (after["adapter"], after["cases"], after["backfilling"]) == (
            before["adapter"], before["cases"], before["backfilling"])

    def answer(line):
        return [{k: v for k, v in row.items() if "seconds" not in k} for row in line["summary"]], line["recommendation"]

    assert answer(resumed[-1]) == answer(whole[-1])
    assert {name: (folder / name / "seed42" / "metrics.json").read_bytes() for name in written} == written
    for other in (["--set", "model_update.backfill_steps=5"], ["--export", tmp_path / "exported"]):
        code, out = adapt(*study, "--resume", *other, capsys=capsys)
        assert code == 2 and out.err.count("\n") == 1 and out.out == "", out.err
        assert ("model_update.backfill_steps = 10 where this run has 5" in out.err) == (other[0] == "--set")
    for damaged in ('{"cut short', "{}"):            # "{}" once passed as finished, then a KeyError traceback
        (folder / "none" / "seed42" / "metrics.json").write_text(damaged)
        code, out = adapt(*study, "--resume", capsys=capsys)
        assert code == 2 and out.err.count("\n") == 1 and "none/seed42/metrics.json is not a finished record" in \
            out.err and "Traceback" not in out.err, out.err
    assert measured == ["fastfill"]


def test_queries_without_a_match_are_counted_and_their_convention_is_a_setting(tmp_path, capsys):
    """Two test items are the only ones of their classes: each has no other item of its class. Under the default
    they are misses in top-1 (the summary says so); with unmatched_queries=exclude top-1 is over the 118 others."""
    paths = []
    for split, seed in (("train", 1), ("test", 2)):
        old, labels = clustered(20, 6, 8, seed)
        if split == "test":
            labels = labels.copy()
            labels[:2] = [7, 8]
        path = tmp_path / f"{split}.npz"
        np.savez(path, old=old, new=old, labels=labels)
        paths.append(path)
    results = {}
    for convention in ("miss", "exclude"):
        code, out = adapt("--train", paths[0], "--test", paths[1], "--adapter", "none", "--output",
                          tmp_path / convention, "--set", f"model_update.unmatched_queries={convention}",
                          "--set", "model_update.per_class_cmc=true", capsys=capsys)
        assert code == 0, out.err
        record = json.loads((tmp_path / convention / "adapt" / "train" / "none" / "seed42" / "metrics.json")
                            .read_text())
        retrieval = record["retrieval"]
        assert (retrieval["queries_without_match"], retrieval["unmatched_queries"]) == (2, convention)
        assert len(retrieval["cmc"]["old/old"]) == 100 and retrieval["cmc"]["old/old"][0] == \
            retrieval["cases"]["old/old"]["top1"]
        results[convention] = retrieval["cases"]["old/old"]
        assert ("2 of 120 queries have no other item of their class: counted as misses" in out.out) == \
            (convention == "miss")
        per_class = retrieval["per_class_cmc"]["old/old"]
        lonely = [per_class["labels"].index(label) for label in (7, 8)]
        assert [per_class["top1"][i] for i in lonely] == ([0.0, 0.0] if convention == "miss" else [None, None])
        counted = [(q, v) for q, v in zip(per_class["queries"], per_class["top1"], strict=True) if v is not None]
        assert sum(q * v for q, v in counted) / sum(q for q, _ in counted) == pytest.approx(
            retrieval["cases"]["old/old"]["top1"]), "the counted classes add up to the whole under both conventions"
    assert results["exclude"]["top1"] == pytest.approx(results["miss"]["top1"] * 120 / 118)
    assert results["exclude"]["mAP"] == results["miss"]["mAP"]
    code, out = adapt("--train", paths[0], "--test", paths[1], "--adapter", "none", "--output", tmp_path,
                      "--set", "model_update.unmatched_queries=skip", capsys=capsys)
    assert code == 2 and "model_update.unmatched_queries = 'skip'; choose from ['miss', 'exclude']" in out.err


def test_per_class_cmc_on_request_adds_up_to_the_whole(rotated, tmp_path, capsys):
    """With model_update.per_class_cmc each case carries CMC top-1 / top-5 per query class, named by the user's
    labels (100..105, not the study's indices 0..5); weighted by the classes' queries they give the case's own
    top-1 and top-5. Without it the record has none."""
    train, test = rotated
    code, out = adapt("--train", train, "--test", test, "--adapter", "procrustes", "--output", tmp_path,
                      "--set", "model_update.per_class_cmc=true", capsys=capsys)
    assert code == 0, out.err
    retrieval = json.loads(next(tmp_path.rglob("metrics.json")).read_text())["retrieval"]
    for case, per_class in retrieval["per_class_cmc"].items():
        assert per_class["labels"] == list(range(100, 106)) and per_class["queries"] == [20] * 6
        for k in ("top1", "top5"):
            whole = sum(q * v for q, v in zip(per_class["queries"], per_class[k], strict=True)) / 120
            assert whole == pytest.approx(retrieval["cases"][case][k]), (case, k)
    code, out = adapt("--train", train, "--test", test, "--adapter", "none", "--output", tmp_path / "sampled",
                      "--queries", 30, "--set", "model_update.per_class_cmc=true", capsys=capsys)
    retrieval = json.loads(next((tmp_path / "sampled").rglob("metrics.json")).read_text())["retrieval"]
    assert code == 0 and sum(retrieval["per_class_cmc"]["old/old"]["queries"]) == 30
    code, out = adapt("--train", train, "--test", test, "--adapter", "none", "--output", tmp_path / "plain",
                      capsys=capsys)
    assert "per_class_cmc" not in json.loads(next((tmp_path / "plain").rglob("metrics.json")).read_text())[
        "retrieval"]
    code, out = adapt("--train", train, "--test", test, "--adapter", "none", "--output", tmp_path,
                      "--set", "model_update.per_class_cmc=2", capsys=capsys)
    assert code == 2 and "model_update.per_class_cmc = 2 has type int; expected bool" in out.err


def test_a_learned_fit_reports_on_stderr_unless_no_progress(rotated, tmp_path, capsys):
    train, test = rotated
    common = ["--train", train, "--test", test, "--adapter", "fct", "--set", "adapter_params.fct.max_steps=20"]
    code, out = adapt(*common, "--output", tmp_path / "a", capsys=capsys)
    assert code == 0 and "fit fct seed 42: used its whole budget after 20 steps in " in out.err
    code, out = adapt(*common, "--output", tmp_path / "b", "--no-progress", capsys=capsys)
    assert code == 0 and "fit fct" not in out.err


def test_unseen_classes_are_held_out_of_fitting_and_alone_scored(tmp_path, capsys):
    paths = []
    for split, seed in (("train", 1), ("test", 2)):
        old, labels = clustered(10, 10, 8, seed)
        np.savez(tmp_path / f"{split}.npz", old=old, new=old[:, ::-1].copy(), labels=labels)
        paths.append(tmp_path / f"{split}.npz")
    code, out = adapt("--train", paths[0], "--test", paths[1], "--adapter", "procrustes", "--json", "--output",
                      tmp_path / "out", "--set", "model_update.unseen_classes=0.4", capsys=capsys)
    assert code == 0, out.err
    answer = json.loads(out.out.strip().splitlines()[-1])
    assert answer["classes"].startswith("open set: none of the 4 test classes")
    record = json.loads(next((tmp_path / "out").rglob("metrics.json")).read_text())
    assert record["models"]["train_items"] == 6 * 10 and record["models"]["test_items"] == 4 * 10
    assert record["models"]["unseen_classes_drawn"] == 4
    code, out = adapt("--train", paths[0], "--test", paths[1], "--adapter", "none", "--output", tmp_path / "x",
                      "--set", "model_update.unseen_classes=0.95", capsys=capsys)
    assert code == 2 and "draws 10" in out.err and "Traceback" not in out.err


def test_the_report_of_an_adapt_study_has_no_stream_matrix_and_no_papers_rows(rotated, tmp_path, capsys):
    train, test = rotated
    assert adapt("--train", train, "--test", test, "--adapter", "procrustes", "--output", tmp_path / "out",
                 capsys=capsys)[0] == 0
    assert main(["report", str(tmp_path / "out"), "--out", str(tmp_path / "report.html")]) == 0
    page = (tmp_path / "report.html").read_text()
    assert "The answer" in page and "* = replacement" not in page and 'data-kind="published"' not in page


def test_unpaired_fits_only_adapters_without_pairs_each_on_different_items(rotated, tmp_path, capsys):
    """model_update.pairing=unpaired: an adapter that needs pairs is refused in one line before anything is read;
    'all' runs none and the adapters fitted without pairs, each on the old features of half the 120 fitting items
    and the new features of the other half; the record says so."""
    train, test = rotated
    unpaired = ["--set", "model_update.pairing=unpaired", *few_steps_options()]
    code, out = adapt("--train", train, "--test", test, "--adapter", "procrustes", "--output", tmp_path / "refused",
                      *unpaired, capsys=capsys)
    assert code == 2 and "'procrustes' needs the same items" in out.err and "mini_vec2vec" in out.err, out.err
    assert not (tmp_path / "refused").exists()
    code, out = adapt("--train", train, "--test", test, "--adapter", "all", "--output", tmp_path / "out", *unpaired,
                      capsys=capsys)
    assert code == 0, out.err
    records = {p.parent.parent.name: json.loads(p.read_text()) for p in (tmp_path / "out").rglob("metrics.json")}
    from cl2r_bench.adapters import unpaired_adapters
    assert set(records) == {"none", *unpaired_adapters()} and "mini_vec2vec" in records
    fit = records["mini_vec2vec"]["adapter"]["fits"][0]
    assert fit["pairing"] == "unpaired" and fit["new_items"] == fit["old_items"] == 60 and fit["items"] == 120
    assert records["mini_vec2vec"]["config"]["model_update"]["pairing"] == "unpaired"


def test_resume_keeps_a_record_written_before_a_setting_existed_when_it_is_at_its_default(rotated, tmp_path, capsys):
    """A record whose config.yaml predates model_update.pairing is the same study as one with pairing: paired
    (the default), and is kept; with pairing set otherwise it is not."""
    train, test = rotated
    out = tmp_path / "out"
    assert adapt("--train", train, "--test", test, "--adapter", "none", "--output", out, capsys=capsys)[0] == 0
    config = next(out.rglob("config.yaml"))
    saved = yaml.safe_load(config.read_text())
    del saved["model_update"]["pairing"]
    config.write_text(yaml.safe_dump(saved))
    code, printed = adapt("--train", train, "--test", test, "--adapter", "none", "--output", out, "--resume",
                          capsys=capsys)
    assert code == 0 and "kept: measured by an earlier run" in printed.out, printed.out
    code, printed = adapt("--train", train, "--test", test, "--adapter", "none", "--output", out, "--resume", "--set",
                          "model_update.pairing=unpaired", capsys=capsys)
    assert code == 2 and "model_update.pairing = None where this run has 'unpaired'" in printed.err, printed.err


def test_the_old_and_new_embeddings_of_different_items_fit_without_pairs_as_given(rotated, tmp_path, capsys):
    """--train-old / --train-new: the old model's embeddings of 70 items and the new model's of 50 others, no
    labels; only adapters fitted without pairs run, each on exactly those rows; the test split is scored as
    always. An incomplete pair of files, or an adapter that needs pairs, is one line before anything is fitted."""
    train, test = rotated
    with np.load(train) as z:
        np.save(tmp_path / "old_items.npy", z["old"][:70])
        np.save(tmp_path / "new_items.npy", z["new"][70:])
    given = ["--train-old", tmp_path / "old_items.npy", "--train-new", tmp_path / "new_items.npy", "--test", test]
    code, out = adapt("--train-old", tmp_path / "old_items.npy", "--test", test, "--adapter", "none", capsys=capsys)
    assert code == 2 and "--train-old needs --train-new" in out.err
    code, out = adapt(*given, "--adapter", "procrustes", "--output", tmp_path / "refused", capsys=capsys)
    assert code == 2 and "'procrustes' needs the same items" in out.err and not (tmp_path / "refused").exists()
    code, out = adapt(*given, "--adapter", "all", "--output", tmp_path / "out", *few_steps_options(), capsys=capsys)
    assert code == 0, out.err
    records = {p.parent.parent.name: json.loads(p.read_text()) for p in (tmp_path / "out").rglob("metrics.json")}
    from cl2r_bench.adapters import unpaired_adapters
    assert set(records) == {"none", *unpaired_adapters()}
    fit = records["mini_vec2vec"]["adapter"]["fits"][0]
    assert (fit["old_items"], fit["new_items"], fit["items"]) == (70, 50, 120) and fit["pairing"] == "unpaired"
    assert records["mini_vec2vec"]["retrieval"]["fitting_items"] == 120
    config = records["mini_vec2vec"]["config"]
    assert config["train_old"].endswith("old_items.npy") and "train" not in config
    assert records["mini_vec2vec"]["retrieval"]["cases"]["B/old"] is not None
    assert "open set" not in out.out and "closed set" not in out.out
