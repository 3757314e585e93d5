"""``runner.py adapt`` at scale: a seeded sample of queries, test splits streamed from memory-mapped files, the
screened ranking, progress bars, and studies shared by torchrun processes (docs/scale-out.md), each against the
in-memory, one-process records."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import yaml
from helpers.adapt_inputs import ROOT, adapt, arrays, write_folder
from helpers.launching import launched, torchrun
from helpers.progress_bars import RecordedBar

from benchmarks.ranking import in_memory as ranking_in_memory
from benchmarks.ranking import screen as ranking_screen
from cl2r_bench.app.cli import main


def test_a_sample_of_queries_is_the_same_for_every_adapter_and_seed_and_says_so(rotated, tmp_path, capsys):
    """--queries 40 of 120: every record ranks the same 40 queries against all 120 items (paired), each query's
    top-1 hit the one it has when every query is ranked, says so, and carries each case's sampling interval; the
    summary says the figures come from a sample."""
    from benchmarks.adapted_cases import Scoring
    from benchmarks.record import unpack_hits

    train, test = rotated
    code, out = adapt("--train", train, "--test", test, "--adapter", "none", "procrustes", "--seeds", 0, 1,
                      "--queries", 40, "--output", tmp_path, capsys=capsys)
    assert code == 0, out.err
    records = [json.loads(p.read_text()) for p in sorted(tmp_path.rglob("metrics.json"))]
    assert len(records) == 4
    for record in records:
        retrieval = record["retrieval"]
        assert retrieval["queries"] == 40 and retrieval["sampled_queries"] == {"count": 40, "of": 120, "seed": 0}
        low, high = retrieval["sampling_interval"]["old/old"]["top1"]
        assert low < retrieval["cases"]["old/old"]["top1"] < high or low == high == 100.0
    assert len({r["retrieval"]["query_top1"]["old/old"] for r in records}) == 1
    assert "a seeded sample of 40 of 120 queries ranked the whole gallery" in out.out
    code, out = adapt("--train", train, "--test", test, "--adapter", "procrustes", "--output", tmp_path / "all",
                      capsys=capsys)
    every = json.loads(next((tmp_path / "all").rglob("metrics.json")).read_text())["retrieval"]["query_top1"]
    sample = Scoring("miss", per_class_cmc=False, queries=40).sample(120).numpy()
    procrustes = next(r for r in records if r["method"] == "procrustes")["retrieval"]["query_top1"]
    for case in ("old/old", "B/old"):
        assert (unpack_hits(procrustes[case], 40) == unpack_hits(every[case], 120)[sample]).all(), case
    code, out = adapt("--train", train, "--test", test, "--adapter", "none", "--queries", 0, "--output", tmp_path,
                      capsys=capsys)
    assert code == 2 and out.err.count("\n") == 1


@pytest.mark.parametrize("adapters", [["procrustes"], ["fastfill"]])
def test_a_test_split_streamed_from_memory_mapped_npy_files_gives_the_in_memory_records(rotated, tmp_path, capsys,
                                                                                        adapters):
    """``model_update.stream_rows=16``: the test folder's old.npy / new.npy stay memory-mapped and every ranking,
    adapter map and backfilling order reads 16 rows at a time (FastFill: its uncertainty order too), and the train
    folder's too (Procrustes reads its 50 anchors from it, FastFill its mini-batches); every case and every
    backfilling curve equal the run that reads both folders into memory, with and without a sample."""
    train, test = (write_folder(tmp_path / f"{path.stem}_folder", ".npy", *arrays(path)) for path in rotated)
    orders = "model_update.backfill_orders=[random,uncertainty,class_mean_distance,class_mean_cosine]"
    for sample in ([], ["--queries", 50]):
        retrievals = []
        for streamed in ([], ["--set", "model_update.stream_rows=16"]):
            output = tmp_path / f"out{len(sample)}{len(streamed)}"
            code, out = adapt("--train", train, "--test", test, "--adapter", *adapters, "--output", output,
                              "--set", orders, "--set", "adapter_params.fastfill.max_steps=30",
                              "--set", "adapter_params.procrustes.anchors=50", *streamed, *sample, capsys=capsys)
            assert code == 0, out.err
            retrievals.append(json.loads(next(output.rglob("metrics.json")).read_text())["retrieval"])
        memory, streamed_run = retrievals
        assert streamed_run["cases"] == memory["cases"]
        assert streamed_run["backfilling"] == memory["backfilling"]
        assert streamed_run["query_top1"] == memory["query_top1"]


def test_a_screened_study_ranks_the_first_places_as_the_streamed_one_and_gives_map_at_r_for_the_map(rotated, tmp_path,
                                                                                                    capsys,
                                                                                                    monkeypatch):
    """``model_update.screen``: every case's top-1, top-5 and mAP@R, every curve's top-1 and every query's hits
    equal the streamed study's; the full mAP is null, the curves and their areas are in mAP@R, and the printed lines
    say so. Screening needs a streamed gallery and a bfloat16 product that adds in float32: without either it is
    one line, exit 2, before anything is read."""
    train, test = (write_folder(tmp_path / f"{path.stem}_folder", ".npy", *arrays(path)) for path in rotated)
    retrievals, printed = [], []
    for screen in ([], ["--set", "model_update.screen=true"]):
        output = tmp_path / f"out{len(screen)}"
        code, out = adapt("--train", train, "--test", test, "--adapter", "procrustes", "--queries", 50,
                          "--output", output, "--set", "model_update.stream_rows=16", *screen, capsys=capsys)
        assert code == 0, out.err
        retrievals.append(json.loads(next(output.rglob("metrics.json")).read_text())["retrieval"])
        printed.append(out.out)
    streamed, screened = retrievals
    for case, scores in streamed["cases"].items():
        if scores is None:
            assert screened["cases"][case] is None
            continue
        assert screened["cases"][case]["mAP"] is None
        for key in ("top1", "top5", "mAP@R"):
            assert screened["cases"][case][key] == pytest.approx(scores[key], abs=1e-9), (case, key)
    assert screened["query_top1"] == streamed["query_top1"]
    curves = {order: curve for order, curve in streamed["backfilling"]["curves"].items() if curve}
    assert curves and all(screened["backfilling"]["curves"][order] is None
                          for order in streamed["backfilling"]["curves"] if order not in curves)
    for order, curve in curves.items():
        assert screened["backfilling"]["curves"][order]["top1"] == curve["top1"]
        assert set(screened["backfilling"]["curves"][order]) == {"top1", "mAP@R"}
        assert set(screened["backfilling"]["auc"][order]) == {"top1_auc", "mAP@R_auc"}
    assert "top-1/mAP@R %" in printed[1] and "top-1/mAP %" in printed[0]
    code, out = adapt("--train", train, "--test", test, "--adapter", "none", "--output", tmp_path / "memory",
                      "--set", "model_update.screen=true", capsys=capsys)
    assert code == 2 and out.err.count("\n") == 1 and "add --set model_update.stream_rows=65536" in out.err
    monkeypatch.setattr(ranking_screen, "bfloat16_adds_in_float32", lambda: False)
    code, out = adapt("--train", train, "--test", test, "--adapter", "none", "--output", tmp_path / "refused",
                      "--set", "model_update.stream_rows=16", "--set", "model_update.screen=true", capsys=capsys)
    assert code == 2 and out.err.count("\n") == 1 and "does not add in float32" in out.err
    assert not (tmp_path / "refused").exists()


@pytest.mark.parametrize("streamed", [[], ["--set", "model_update.stream_rows=16"]])
def test_each_ranking_of_a_study_has_a_progress_bar_named_after_it_unless_told_not_to(rotated, tmp_path, monkeypatch,
                                                                                     capsys, streamed):
    """In memory and streamed, each ranking of a study has a bar named after what it ranks, counting every pair of
    the sampled queries and the gallery: the backfilling curves first (their two ends are new/new and new/F, not
    ranked again), then each other case; ``--no-progress`` disables them all."""

    made: list[RecordedBar] = []
    monkeypatch.setattr(ranking_in_memory, "tqdm", lambda **kwargs: RecordedBar(made, **kwargs))
    train, test = (write_folder(tmp_path / f"{path.stem}_folder", ".npy", *arrays(path)) for path in rotated)
    for quiet in ([], ["--no-progress"]):
        code, out = adapt("--train", train, "--test", test, "--adapter", "procrustes", "--queries", 50,
                          "--output", tmp_path / f"out{len(quiet)}", *streamed, *quiet, capsys=capsys)
        assert code == 0, out.err
    pairs = 50 * len(np.load(test / "labels.npy"))
    bars = [(bar.desc, bar.total, bar.done, bar.disable, bar.closed) for bar in made]
    named = ["rank backfilling curves", "rank old/old", "rank new/old", "rank F/F", "rank B/old", "rank B/B"]
    assert bars == [(desc, pairs, pairs, None, True) for desc in named] + [(None, pairs, pairs, True, True)] * 6


SHARED_STUDY = ["--adapter", "none", "procrustes", "fastfill", "--queries", 50,
                "--set", "model_update.backfill_orders=[random,uncertainty,class_mean_distance]",
                "--set", "adapter_params.fastfill.max_steps=30", "--set", "adapter_params.procrustes.anchors=50"]


@pytest.mark.parametrize("stream_rows, screen", [(16, False), (120, False), (16, True)])
def test_two_torchrun_processes_share_a_streamed_study_and_write_the_one_process_records(rotated, tmp_path,
                                                                                        stream_rows, screen):
    """Each of two gloo processes ranks, orders and maps its share of the test folder's chunks (and checks and sums
    its share of the train folder's); rank 0 fits each adapter and writes. Every case, curve, per-query hit and fit
    equals the one-process run's (both on one thread per process, as a learned fit's rounding depends on the
    threads); the summary is printed once. In chunks of 16 rows each process has 4 of the 8; in one chunk of 120,
    the second process has none and takes part all the same. Screened, each process screens its share."""

    train, test = (write_folder(tmp_path / f"{path.stem}_folder", ".npy", *arrays(path)) for path in rotated)
    arguments = ["adapt", "--train", train, "--test", test, *SHARED_STUDY, "--device", "cpu",
                 "--set", f"model_update.stream_rows={stream_rows}", "--set", f"model_update.screen={screen}"]
    alone = subprocess.run([sys.executable, str(ROOT / "runner.py"), *map(str, arguments), "--output",
                            str(tmp_path / "one")], capture_output=True, text=True, timeout=300,
                           env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert alone.returncode == 0, alone.stderr[-3000:]
    shared = torchrun(str(ROOT / "runner.py"), *map(str, arguments), "--output", str(tmp_path / "two"))
    assert shared.returncode == 0, shared.stderr[-3000:]
    assert shared.stdout.count("records: ") == 1 and shared.stdout.count("procrustes seed 42") == 1
    for method in ("none", "procrustes", "fastfill"):
        one, two = (json.loads((tmp_path / run / "adapt" / "train_folder" / method / "seed42" / "metrics.json")
                               .read_text()) for run in ("one", "two"))
        for part in ("cases", "backfilling", "query_top1", "sampling_interval"):
            assert two["retrieval"][part] == one["retrieval"][part], (method, part)
        if method != "none":
            fits = [{k: v for k, v in record["adapter"]["fits"][0].items() if k != "seconds"} for record in (one, two)]
            assert fits[1] == fits[0], method
        assert (one["timings"]["evaluation_processes"], two["timings"]["evaluation_processes"]) == (1, 2)


def test_a_shared_study_refuses_bad_input_on_every_process_in_one_line(rotated, tmp_path, monkeypatch, capsys):
    """A NaN in the second process's share is found there and refused by both (each prints the line; torchrun
    interleaves their output); a study that does not stream is refused before anything is read."""

    train, test = (write_folder(tmp_path / f"{path.stem}_folder", ".npy", *arrays(path)) for path in rotated)
    old = np.load(test / "old.npy")
    old[100, 3] = np.nan
    np.save(test / "old.npy", old)
    arguments = ["adapt", "--train", train, "--test", test, "--adapter", "none", "--output", tmp_path / "out"]
    done = torchrun(str(ROOT / "runner.py"), *map(str, arguments), "--set", "model_update.stream_rows=16")
    assert done.returncode != 0 and not list(tmp_path.rglob("metrics.json"))
    assert done.stderr.count(f"error: {test}: old has 1 row(s) with NaN or inf (first: row 100); drop or re-embed "
                             "those items") == 2
    launched(monkeypatch)
    code, out = adapt(*arguments[1:], capsys=capsys)
    assert code == 2 and out.err.count("\n") == 1 and "add --set model_update.stream_rows=65536" in out.err


FAILING_FIT = """import os, sys
import cl2r_bench.adapter_study.study
from cl2r_bench.app.cli import main


def failing_fit(*args, **kwargs):
    if os.environ["RANK"] != "0":
        raise RuntimeError("a rank other than 0 fitted")
    raise RuntimeError("the fit failed on purpose")


cl2r_bench.adapter_study.study.fit_adapter = failing_fit
try:
    code = main()
except RuntimeError as failure:
    print(f"rank {os.environ['RANK']} raised: {failure}", file=sys.stderr, flush=True)
    code = 1
sys.exit(code)
"""


def test_a_fit_that_fails_on_rank_0_is_raised_on_every_process(rotated, tmp_path):
    """In a shared study only rank 0 fits; when that fit raises, the other process raises the same error instead of
    waiting for weights that never come, and nothing is written. Rank 1's fit would raise another message, so rank
    1's line can only come from rank 0's error."""

    train, test = (write_folder(tmp_path / f"{path.stem}_folder", ".npy", *arrays(path)) for path in rotated)
    script = tmp_path / "failing_fit.py"
    script.write_text(FAILING_FIT)
    done = torchrun(str(script), "adapt", "--train", str(train), "--test", str(test), "--adapter", "procrustes",
                    "--device", "cpu", "--output", str(tmp_path / "out"), "--set", "model_update.stream_rows=16",
                    cwd=ROOT)
    assert done.returncode != 0 and not list(tmp_path.rglob("metrics.json"))
    for rank in (0, 1):
        assert f"rank {rank} raised: the fit failed on purpose" in done.stderr, done.stderr[-3000:]


def test_a_shared_study_resumes_on_every_process_alike(rotated, tmp_path, capsys):
    """Under torchrun, ``--resume`` is decided on rank 0 and followed by both processes: the record an earlier
    one-process run finished is kept, the missing one is measured by the two together, and its record equals the
    one-process record (a process that skipped what the other measured would wait for it forever)."""

    train, test = (write_folder(tmp_path / f"{path.stem}_folder", ".npy", *arrays(path)) for path in rotated)
    study = ["adapt", "--train", train, "--test", test, "--adapter", "none", "procrustes", "--device", "cpu",
             "--output", tmp_path / "out", "--set", "model_update.stream_rows=16"]
    code, out = main(list(map(str, study))), capsys.readouterr()
    assert code == 0, out.err
    records = tmp_path / "out" / "adapt" / "train_folder"
    alone = json.loads((records / "procrustes" / "seed42" / "metrics.json").read_text())
    kept = (records / "none" / "seed42" / "metrics.json").read_bytes()
    (records / "procrustes" / "seed42" / "metrics.json").unlink()
    done = torchrun(str(ROOT / "runner.py"), *map(str, study), "--resume")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("kept: measured by an earlier run") == 1
    shared = json.loads((records / "procrustes" / "seed42" / "metrics.json").read_text())
    assert shared["retrieval"]["cases"] == alone["retrieval"]["cases"]
    assert (records / "none" / "seed42" / "metrics.json").read_bytes() == kept


def test_streaming_needs_a_folder_of_npy_files_and_a_positive_row_count(rotated, tmp_path, capsys):
    train, test = rotated
    code, out = adapt("--train", train, "--test", test, "--adapter", "none", "--output", tmp_path,
                      "--set", "model_update.stream_rows=16", capsys=capsys)
    assert code == 2 and "model_update.stream_rows reads a folder holding old.npy, new.npy and labels.npy" in out.err
    code, out = adapt("--train", train, "--test", test, "--adapter", "none", "--output", tmp_path,
                      "--set", "model_update.stream_rows=0", capsys=capsys)
    assert code == 2 and out.err.count("\n") == 1 and "stream_rows" in out.err


def test_a_folder_above_the_auto_size_streams_by_default_and_null_or_a_count_still_force_either_way(
        rotated, tmp_path, capsys, monkeypatch):
    """model_update.stream_rows=auto (the default): a folder of .npy files whose old and new arrays exceed the
    size streams 65,536 rows at a time, and says so; under the size, a .npz file, an open-set study or null read
    into memory; the record's config keeps the choice made."""
    from cl2r_bench.adapter_study import embeddings

    train, test = (write_folder(tmp_path / f"{path.stem}_folder", ".npy", *arrays(path)) for path in rotated)
    size = sum((test / f"{name}.npy").stat().st_size for name in ("old", "new"))
    monkeypatch.setattr(embeddings, "AUTO_STREAM_BYTES", size - 1)

    def streamed(*extra):
        output = tmp_path / f"out{len(list(tmp_path.iterdir()))}"
        code, out = adapt("--train", train, "--test", test, "--adapter", "none", "--output", output, *extra,
                          capsys=capsys)
        assert code == 0, out.err
        config = yaml.safe_load(next(output.rglob("config.yaml")).read_text())
        return config["model_update"]["stream_rows"], out.out

    rows, printed = streamed()
    assert rows == 65536 and "exceed 0 MiB, so they are streamed 65536 rows at a time" in printed
    assert streamed("--set", "model_update.stream_rows=null")[0] is None
    assert streamed("--set", "model_update.stream_rows=16")[0] == 16
    assert streamed("--set", "model_update.unseen_classes=0.5")[0] is None
    monkeypatch.setattr(embeddings, "AUTO_STREAM_BYTES", size)
    rows, printed = streamed()
    assert rows is None and "streamed" not in printed
