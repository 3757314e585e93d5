"""The track's end-to-end parity driver (tools/parity/track.py, results/parity/README.md §12): its parts without a
reference, and, with the references' checkouts (``CL2R_REFERENCES``: the folder holding LCE/, AdvBCT/, BT-2/,
OpenCompatible/, OCA/, MixBCT/ and their venv/), each authors' loop driven end to end on a synthetic stand-in of
the track (timm's test EfficientNet as both frozen encoders, 12 generated classes)."""
import argparse
import importlib
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from benchmarks.record import pack_hits

track = importlib.import_module("tools.parity.track")
tables = importlib.import_module("tools.parity.tables")
REFERENCES = os.environ.get("CL2R_REFERENCES")


def test_every_strategy_of_the_bct_line_has_its_authors_code():
    sources = {strategy: track.reference_module(name).REPOSITORY
               for strategy, name in track.strategy_references().items()}
    assert sources == {"lce": "IrvingMeng/LCE", "bct": "Ashespt/AdvBCT", "advbct": "Ashespt/AdvBCT",
                       "bt2": "YifeiZhou02/BT-2", "ract": "TencentARC/OpenCompatible", "oca": "z3n0e/OCA",
                       "mixbct": "yuleung/MixBCT", "unibct": "Ashespt/AdvBCT"}


def test_the_suite_trains_the_authors_recipe_or_for_a_smoke_run_the_same_recipe_shortened():
    assert track.recipe_settings("lce", None) == ["--set", "training.recipe=authors"]
    smoke = track.recipe_settings("lce", 2)
    assert smoke[::2] == ["--set"] * 8
    assert smoke[1::2] == ['training.optimizer="adam"', "training.lr=0.00035", "training.weight_decay=0.0005",
                           "training.epochs=2", 'training.schedule="multistep"', "training.milestones=[20, 40]",
                           "training.gamma=0.1", "training.warmup_epochs=0"]


def test_a_wrong_checkout_is_one_line_and_exit_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as stopped:
        track.main(["--references", str(tmp_path), "--data-root", str(tmp_path), "--work", str(tmp_path / "w"),
                    "--strategies", "lce"])
    assert stopped.value.code == 2
    assert "is not a checkout of IrvingMeng/LCE" in capsys.readouterr().err


def test_settings_the_suite_refuses_are_one_line_and_exit_2(capsys):
    with pytest.raises(SystemExit) as stopped:
        track.assembled(["run", *track.SUITE_RUN, "--strategy", "bt2", "--data-root", "data",
                         *track.recipe_settings("bt2", 2)])
    assert stopped.value.code == 2
    assert "warmup_epochs = 5 leaves no epoch of the schedule out of 2" in capsys.readouterr().err


def test_a_variant_sets_the_strategys_own_setting_in_its_own_folder_and_row():
    args = argparse.Namespace(data_root="data", suite_output=Path("out"), epochs=None, set=[],
                              variant=["new_class_rows=none"])
    arguments = track.suite_arguments("bct", 1, args)
    assert arguments[arguments.index("--output") + 1] == str(Path("out/variants/new_class_rows-none"))
    assert arguments[-2:] == ["--set", "strategy_params.bct.new_class_rows=none"]
    assert track.record_key("bct", ["new_class_rows=none"]) == "bct [new_class_rows=none]"
    assert track.record_key("bct", []) == "bct"
    plain = track.suite_arguments("bct", 1, argparse.Namespace(**{**vars(args), "variant": []}))
    assert plain[plain.index("--output") + 1] == "out"


@pytest.mark.parametrize("variant", ["new_class_rows", "training.lr=1"])
def test_a_variant_that_is_no_setting_of_the_strategy_is_one_line_and_exit_2(tmp_path, capsys, variant):
    with pytest.raises(SystemExit) as stopped:
        track.parse(["--references", str(tmp_path), "--data-root", "data", "--work", str(tmp_path / "w"),
                     "--strategies", "bct", "--variant", variant])
    assert stopped.value.code == 2
    assert f"--variant {variant!r}" in capsys.readouterr().err


def test_runs_recorded_side_by_side_keep_each_other(tmp_path):
    """Two invocations each read the record at their start and write it after each seed: each write reads the
    record again under its lock, so the other's rows stay."""
    out = tmp_path / "track.json"
    track.record_run(out, "bct", {"epochs": 30}, 1, {"suite": {"seed": 1}})
    track.record_run(out, "bct [new_class_rows=none]", {"epochs": 30}, 1, {"suite": {"seed": 1}})
    track.record_run(out, "bct", {"epochs": 30}, 2, {"suite": {"seed": 2}})
    record = json.loads(out.read_text())
    assert set(record) == {"bct", "bct [new_class_rows=none]"}
    assert set(record["bct"]["runs"]) == {"1", "2"} and record["bct"]["epochs"] == 30
    assert not list(tmp_path.glob("*.lock"))


def test_runs_against_another_reference_are_dropped_from_the_entry(tmp_path):
    out = tmp_path / "track.json"
    track.record_run(out, "unibct", {"references": {"mixbct": {"repository": "yuleung/MixBCT"}}}, 1, {"s": 1})
    track.record_run(out, "unibct", {"references": {"mixbct": {"repository": "yuleung/MixBCT"}}}, 2, {"s": 2})
    track.record_run(out, "unibct", {"references": {"advbct": {"repository": "Ashespt/AdvBCT"}}}, 2, {"s": 3})
    entry = json.loads(out.read_text())["unibct"]
    assert entry["runs"] == {"2": {"s": 3}} and set(entry["references"]) == {"advbct"}


def test_a_suite_run_stopped_midway_is_resumed(tmp_path, monkeypatch, capsys):
    """A run folder whose record is incomplete (the run stopped after a task) is run again with ``--resume``."""
    from cl2r_bench.app import run_folder

    class ResumableFolder:
        def __init__(self, *args, **kwargs) -> None:
            pass

        def check_resumable(self, config) -> None:
            pass

    (tmp_path / "metrics.json").write_text(json.dumps({"complete": False, "tasks": [{}]}))
    monkeypatch.setattr(run_folder, "RunFolder", ResumableFolder)
    commands = []
    monkeypatch.setattr(track.subprocess, "run", lambda command, **_: commands.append(command)
                        or argparse.Namespace(returncode=1))
    parts = argparse.Namespace(directory=tmp_path, config={})
    with pytest.raises(track.ParityError):
        track.suite_run(["run", "--strategy", "bct"], parts, tmp_path)
    assert "the suite's run failed (exit 1)" in capsys.readouterr().err
    assert commands[0][-3:] == ["--strategy", "bct", "--resume"]


def run(seed: int, new_old: int, new_new: int, queries: int = 1000) -> dict:
    """A run's fields in the parity record: ``new_old`` / ``new_new`` of ``queries`` queries hit at top-1."""
    def hits(count: int) -> str:
        return pack_hits(np.arange(queries) < count)

    return {"seed": seed, "stream": {"class_order": [0, 1]}, "evaluation": {"query_sha256": f"q{seed}",
                                                                           "gallery_sha256": f"g{seed}"},
            "two_model": {"cases": {"new/old": {"top1": 100 * new_old / queries},
                                    "new/new": {"top1": 100 * new_new / queries}},
                          "query_top1": {"old/old": hits(queries), "new/old": hits(new_old), "new/new": hits(new_new)},
                          "queries": queries, "queries_without_match": 0, "unmatched_queries": "miss"},
            "commit": "abc"}


def test_the_table_gives_both_codes_and_the_paired_difference_with_compares_interval():
    record = {"lce": {"epochs": "the authors' recipe", "entry_point": "main.py main()",
                      "references": {"lce": {"repository": "IrvingMeng/LCE", "commit": "bb087e5"}},
                      "runs": {"1": {"suite": run(1, 500, 800), "reference": run(1, 700, 800)},
                               "2": {"suite": run(2, 600, 900), "reference": run(2, 800, 900)}}}}
    text = tables.track_table(record)
    row = next(line for line in text.splitlines() if line.startswith("| lce"))
    # new/old: suite 50, 60 (55 ± 5), authors 70, 80 (75 ± 5), +20 on both seeds, so the interval is the
    # queries' floor (t(0.975, 1) = 12.71 x about 0.9): beyond noise; new/new equal on both
    assert "| 55.00 ± 5.00 | 75.00 ± 5.00 | +20.00 [" in row
    low = float(row.split("+20.00 [")[1].split(",")[0])
    assert 0 < low < 20
    assert "| 85.00 ± 5.00 | 85.00 ± 5.00 | +0.00 [+0.00, +0.00] |" in row
    assert row.startswith("| lce | 2 of 2 |") and row.endswith("| **no** | – |")
    assert "`IrvingMeng/LCE` at bb087e5, main.py main()" in text and "Suite at abc." in text


def diverged(seed: int) -> dict:
    return {"seed": seed, "diverged": "task 1 diverged: non-finite loss", "commit": "abc"}


def test_the_table_pairs_the_seeds_both_codes_trained_and_names_the_seeds_each_code_diverged():
    about = {"epochs": "the authors' recipe", "entry_point": "train.py main()",
             "references": {"advbct": {"repository": "Ashespt/AdvBCT", "commit": "e3935d0"}}}
    record = {"unibct": {**about, "runs": {"1": {"suite": run(1, 500, 800), "reference": diverged(1)},
                                           "2": {"suite": diverged(2), "reference": run(2, 600, 900)},
                                           "3": {"suite": run(3, 500, 800), "reference": run(3, 500, 800)},
                                           "4": {"suite": diverged(4), "reference": diverged(4)}}},
              "bct": {**about, "runs": {"1": {"suite": diverged(1), "reference": run(1, 500, 800)}}}}
    rows = {line.split(" |")[0]: line for line in tables.track_table(record).splitlines() if line.startswith("| ")}
    # seed 3 alone is paired: 50.00 and 80.00 on both sides, no difference
    assert rows["| unibct"].startswith("| unibct | 1 of 4 | 50.00 ± 0.00 | 50.00 ± 0.00 | +0.00 [+0.00, +0.00] |")
    assert rows["| unibct"].endswith("| yes | suite 2, 4; authors 1, 4 |")
    assert rows["| bct"] == "| bct | 0 of 1 | – | – | – | – | – | – | – | suite 1 |"


def test_a_diverged_suite_run_is_recorded_once_with_its_one_line_error(tmp_path, monkeypatch):
    from cl2r_bench.app.cli import EXIT_DIVERGED

    def diverging(command, **options):
        if "runner.py" not in str(command):
            return plain(command, **options)
        calls.append(command)
        options["stdout"].write("task 0: trained\nerror: task 1 diverged: non-finite loss at iteration 60; tasks "
                                "0-0 are kept in /somewhere/run, and the run is not complete; lower training.lr\n")
        return argparse.Namespace(returncode=EXIT_DIVERGED)

    calls, plain = [], track.subprocess.run
    monkeypatch.setattr(track.subprocess, "run", diverging)
    parts = argparse.Namespace(directory=tmp_path / "run", config={}, settings=argparse.Namespace(seed=2))
    first = track.suite_run(["run"], parts, tmp_path, "suite-refinement-none")
    assert first["seed"] == 2 and first["diverged"] == "task 1 diverged: non-finite loss at iteration 60"
    assert track.suite_run(["run"], parts, tmp_path, "suite-refinement-none") == first and len(calls) == 1
    assert (tmp_path / "suite-refinement-none.log").is_file()


def test_an_authors_model_with_non_finite_features_is_recorded_as_diverged_and_not_scored():
    features = torch.ones(4, 3)
    features[2, 1] = float("nan")
    parts = argparse.Namespace(settings=argparse.Namespace(seed=3))
    outcome = track.evaluated(parts, {}, {"test_features": features, "train_seconds": 9.0, "device": "cpu"}, "abc")
    assert outcome["seed"] == 3 and "not finite" in outcome["diverged"] and "two_model" not in outcome
    assert outcome["commit"] == "abc" and outcome["train_seconds"] == 9.0


def test_a_batch_moved_to_a_gpu_stays_where_it_is_without_one():
    import sys
    sys.path.insert(0, str(Path(track.__file__).parent))
    try:
        reference = importlib.import_module("track_reference")
    finally:
        sys.path.pop(0)
    to = reference.staying(torch.Tensor.to)
    x = torch.ones(2)
    assert to(x, 0) is x and to(x, "cuda:0") is x and to(x, torch.device("cuda")) is x
    assert to(x, torch.float64).dtype == torch.float64


@pytest.fixture(scope="module")
def stand_in(tmp_path_factory):
    """The ``--set`` options of the synthetic stand-in: two weight files of timm's test EfficientNet as the old and
    the new encoder, 12 generated classes (6 old), 24 items a class, small embedding networks."""
    import timm

    folder = tmp_path_factory.mktemp("stand_in")
    encoders = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        torch.save(timm.create_model("test_efficientnet", pretrained=False).state_dict(), folder / f"e{seed}.pth")
        encoders.append(f"timm:test_efficientnet@{folder / f'e{seed}.pth'}")
    settings = ["dataset=synthetic", "device=cpu", f"model.encoders=[{','.join(encoders)}]",
                "model.embedding_width=32", "model.embedding_dim=16", "data.synthetic_classes=12",
                "data.synthetic_train_per_class=24", "data.synthetic_test_per_class=6", "data.synthetic_noise=0.08",
                "data.synthetic_similarity=0.0", "stream.initial_classes=6", "stream.increment=6",
                "stream.images_per_class=24", "replacement.pretrain.epochs=2", "evaluation.plots=false",
                f"replacement.pretrain.cache_dir={folder / 'models'}", f"model_update.feature_cache={folder / 'f'}"]
    return folder, [option for setting in settings for option in ("--set", setting)]


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["lce", "bct", "advbct", "bt2", "ract", "oca", "mixbct", "unibct"])
def test_the_authors_loop_trains_on_the_stand_in_and_is_scored_by_the_suites_protocol(strategy, stand_in, tmp_path):
    references = Path(REFERENCES or "")
    name = track.strategy_references()[strategy]
    module = track.reference_module(name)
    checkout = references / module.REPOSITORY.split("/")[1]
    if not REFERENCES or not (checkout / module.MARKER).is_file() or not (references / "venv/bin/python").is_file():
        pytest.skip(f"set CL2R_REFERENCES to the folder holding the references' checkouts and venv/ (results/parity/"
                    f"README.md §12) to drive {module.REPOSITORY}")
    folder, settings = stand_in
    command = ["--references", str(references), "--data-root", str(folder), "--work", str(tmp_path / "work"),
               "--strategies", strategy, "--seeds", "1", "--epochs", "6", "--suite-output", str(tmp_path / "suite"),
               *settings]
    track.main(command)
    record = json.loads((tmp_path / "work" / "track.json").read_text())[strategy]
    suite, authors = record["runs"]["1"]["suite"], record["runs"]["1"]["reference"]
    assert {key: suite[key] for key in ("stream", "evaluation")} == {key: authors[key] for key in ("stream",
                                                                                                    "evaluation")}
    assert suite["two_model"]["queries"] == authors["two_model"]["queries"] == 72
    assert suite["two_model"]["cases"]["old/old"] == authors["two_model"]["cases"]["old/old"]
    assert all(0 <= authors["two_model"]["cases"][case]["top1"] <= 100 for case in ("new/old", "new/new"))
    assert record["references"][name]["repository"] == module.REPOSITORY and record["epochs"] == 6
    log = tmp_path / "work" / f"{strategy}-epochs6" / "seed1" / "reference.log"
    written = log.stat().st_mtime_ns
    track.main(command)
    assert log.stat().st_mtime_ns == written, "a finished run is kept and skipped"
    assert f"| {strategy} (smoke: 6 epochs) | 1 of 1 |" in tables.track_table(json.loads(
        (tmp_path / "work" / "track.json").read_text()))
