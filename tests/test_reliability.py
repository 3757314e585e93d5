"""Issue 16: hostile files, diverged runs, unsafe names, concurrent runs, damaged run folders, late errors."""
import contextlib
import dataclasses
import json
import os
import pickle
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from test_data import write_cifar10

from cl2r_bench import cli as runner
from cl2r_bench.data.datasets import DataError, read_cifar
from cl2r_bench.files import atomic_write, atomic_write_json, exclusive


class Payload:
    """Unpickling this object runs ``os.system`` (the classic pickle exploit)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.mark.parametrize("verify", ["warn", "off"])
def test_a_cifar_pickle_cannot_run_code(tmp_path, verify):
    write_cifar10(tmp_path)
    marker = tmp_path / "payload-ran"
    with open(tmp_path / "cifar-10-batches-py" / "data_batch_3", "wb") as f:
        pickle.dump({b"labels": [0], b"data": np.zeros((1, 3072), np.uint8), b"extra": Payload(marker)}, f)
    with pytest.warns(UserWarning) if verify == "warn" else contextlib.nullcontext(), pytest.raises(DataError) as error:
        read_cifar("cifar10", tmp_path, verify=verify)
    assert "posix.system" in str(error.value) and "data_batch_3" in str(error.value)
    assert not marker.exists()


def test_pickled_numpy_arrays_of_every_protocol_are_read(tmp_path):
    write_cifar10(tmp_path)
    for protocol in range(2, pickle.HIGHEST_PROTOCOL + 1):
        with open(tmp_path / "cifar-10-batches-py" / "data_batch_2", "wb") as f:
            pickle.dump({"labels": [3, 4], "data": np.arange(2 * 3072).astype(np.uint8).reshape(2, 3072)}, f,
                        protocol=protocol)
        data = read_cifar("cifar10", tmp_path, verify="off")
        assert data.train.labels.tolist()[30:32] == [3, 4]


def run_cli(*args):
    return runner.main([str(a) for a in args])


def strict_load(path):
    """JSON as a strict parser reads it: a NaN or Infinity token is an error."""
    def refuse(token):
        raise ValueError(f"non-standard JSON token {token}")
    return json.loads(path.read_text(), parse_constant=refuse)


def test_a_diverged_task_stops_the_run_keeps_earlier_tasks_and_is_never_complete(tiny, tmp_path, capsys,
                                                                                    monkeypatch):
    from cl2r_bench.training import trainers
    original = trainers.train_task

    def lr_explodes_at_task_1(model, strategy, new, memory, settings, **kw):
        if kw["description"].startswith("task 1/"):
            settings = dataclasses.replace(settings, lr=1e9)
        return original(model, strategy, new, memory, settings, **kw)

    monkeypatch.setattr(trainers, "train_task", lr_explodes_at_task_1)
    out = tmp_path / "out"
    assert run_cli("--config", tiny, "--scenario", "cl2r", "--set", "replacement.tasks=[]", "--strategy", "er",
                   "--output", out) == runner.EXIT_DIVERGED
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "task 1 diverged" in err and "iteration" in err and "Traceback" not in err
    record = strict_load(out / "cl2r/synthetic/er/seed42/metrics.json")
    assert record["tasks_completed"] == 1 and not record["complete"]
    assert not (out / "cl2r/synthetic/er/seed42/checkpoints/task1.pt").exists()
    assert run_cli("leaderboard", "--results", out) == 2  # an incomplete run is never a leaderboard row


def test_a_diverged_first_task_writes_no_result(tiny, tmp_path, capsys):
    out = tmp_path / "out"
    assert run_cli("--config", tiny, "--scenario", "cl2r", "--set", "replacement.tasks=[]", "--strategy", "er",
                   "--output", out, "--set", "training.lr=1e9") == runner.EXIT_DIVERGED
    assert "task 0 diverged" in capsys.readouterr().err
    assert not (out / "cl2r/synthetic/er/seed42/metrics.json").exists()


def test_result_json_is_strict_and_says_why_a_value_is_null(tmp_path):
    atomic_write_json(tmp_path / "r.json", {"metrics": {"BC": float("nan"), "AA": 50.0}, "m": [[1.0, float("-inf")]]})
    record = strict_load(tmp_path / "r.json")
    assert record["metrics"] == {"BC": None, "AA": 50.0} and record["m"] == [[1.0, None]]
    assert record["non_finite_values"] == {"metrics.BC": "nan", "m[0][1]": "-inf"}


def test_a_failed_write_leaves_the_old_file_and_no_temporary_file(tmp_path):
    target = tmp_path / "metrics.json"
    atomic_write_json(target, {"complete": True})

    def crash(f):
        f.write(b"{half")
        raise OSError("disk full")

    with pytest.raises(OSError):
        atomic_write(target, crash)
    assert strict_load(target) == {"complete": True} and [p.name for p in tmp_path.iterdir()] == ["metrics.json"]


@pytest.mark.parametrize("label", ["../../../../../victim", "a/b", "..", ".hidden", "x" * 101])
def test_a_label_never_leads_outside_the_output_folder(label, tiny, tmp_path, capsys):
    victim = tmp_path / "victim"
    (victim / "seed42").mkdir(parents=True)
    (victim / "seed42" / "precious.txt").write_text("keep me")
    out = tmp_path / "a" / "b" / "out"
    code = run_cli("--config", tiny, "--scenario", "cl2r", "--set", "replacement.tasks=[]", "--strategy", "er",
                   "--output", out, "--overwrite",
                   "--set", f"adapter.label={label}",
                   "--set", "adapter.name=procrustes")
    err = capsys.readouterr().err.strip()
    assert code == 2 and "adapter.label" in err and len(err.splitlines()) == 1
    assert (victim / "seed42" / "precious.txt").read_text() == "keep me"


def test_overwrite_deletes_only_a_folder_the_suite_made(tiny, tmp_path, capsys):
    out = tmp_path / "out"
    foreign = out / "cl2r/synthetic/er/seed42"
    foreign.mkdir(parents=True)
    (foreign / "notes.txt").write_text("mine")
    assert run_cli("--config", tiny, "--scenario", "cl2r", "--set", "replacement.tasks=[]", "--strategy", "er",
                   "--output", out, "--overwrite") == 2
    assert "did not write" in capsys.readouterr().err and (foreign / "notes.txt").exists()


def test_resume_and_overwrite_together_is_a_usage_error(tiny, tmp_path, capsys):
    assert run_cli("--config", tiny, "--output", tmp_path, "--resume", "--overwrite") == 2
    assert "--resume" in capsys.readouterr().err


def test_a_second_run_on_a_folder_in_use_is_refused_and_a_stale_lock_is_taken_over(tiny, tmp_path, capsys):
    out = tmp_path / "out"
    run_dir = out / "cl2r/synthetic/er/seed42"
    args = ("--config", tiny, "--scenario", "cl2r", "--set", "replacement.tasks=[]", "--strategy", "er",
            "--output", out)
    with exclusive(run_dir.with_name("seed42.lock"), "test"):
        assert run_cli(*args) == 2
    err = capsys.readouterr().err
    assert f"pid {os.getpid()} on host {socket.gethostname()}" in err and "seed42.lock" in err
    holder = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    run_dir.with_name("seed42.lock").write_text(f"{holder.stdout.strip()}\n{socket.gethostname()}\n")
    assert run_cli(*args) == 0 and not run_dir.with_name("seed42.lock").exists()


@pytest.mark.parametrize("setting, fragment", [
    ("evaluation.tie_rule=loose", "evaluation.tie_rule = 'loose'; choose from ['strict', 'inclusive']"),
    ("evaluation.mode=pixels", "evaluation.mode = 'pixels'"),
    ("model.backbone=vit", "model.backbone = 'vit'"),
    ("device=gpu", "device = 'gpu'"),
    ("evaluation.confidence=1.5", "evaluation.confidence = 1.5 must be between 0 and 1"),
    ("training.batch_size=0", "training.batch_size = 0 must be at least 1"),
    ("training.lr=0", "training.lr = 0.0 must be above 0"),
    ("training.lr=-1e-3", "training.lr = -0.001 must be above 0"),
    ("training.epochs=-2", "training.epochs = -2 must be at least 1"),
    ("stream.num_tasks=0", "stream.num_tasks = 0 must be at least 1"),
    ("stream.class_order=[3,3,1]", "stream.class_order = [3, 3, 1]"),
    ("stream.class_order=[a,b]", "stream.class_order = ['a', 'b']"),
    ("replacement.tasks=[0,5]", "replacement.tasks = [0, 5] must list distinct task numbers in 0..2"),
    ("replacement.tasks=[x]", "replacement.tasks = ['x']"),
    ("replacement.pretrain.class_counts=[3]", "one positive class count per replacement task (2)"),
    ("stream.num_tasks=9", "the stream needs 36 classes (4 + 4 x 8) + 6 held out; synthetic has 24; e.g. "
                           "--set stream.num_tasks=4"),
    ("training.lr_min=0.5", "training.lr_min = 0.5 is above training.lr"),
    ("adapter.at=sometimes", "adapter.at = 'sometimes'"),
    ("data.verify=maybe", "data.verify = 'maybe'"),
])
def test_every_bad_setting_is_one_line_before_anything_runs(setting, fragment, tiny, tmp_path, capsys):
    out = tmp_path / "out"
    assert run_cli("--config", tiny, "--scenario", "iamcl2r", "--strategy", "er", "--output", out,
                   "--set", setting) == 2
    err = capsys.readouterr().err.strip()
    assert fragment in err and len(err.splitlines()) == 1 and "Traceback" not in err
    assert not out.exists() and not (tmp_path / "cache").exists()


def test_scientific_notation_is_a_float_in_files_and_on_the_command_line(tmp_path):
    from cl2r_bench.config import resolve

    config = resolve([("file", yaml.safe_load("training: {lr: 1e-3, lr_min: 5E-6}")),
                      ("command line", {"replacement": {"pretrain": {"lr": "2.5e-2"}}})])
    assert (config["training"]["lr"], config["training"]["lr_min"]) == (0.001, 5e-6)
    assert config["replacement"]["pretrain"]["lr"] == 0.025


@pytest.fixture
def finished_run(tiny, tmp_path):
    """A finished 3-task CL2R run: ``(command-line arguments, run folder)``."""
    args = ("--config", tiny, "--scenario", "cl2r", "--set", "replacement.tasks=[]", "--strategy", "er",
            "--output", tmp_path / "out")
    assert run_cli(*args) == 0
    return args, tmp_path / "out/cl2r/synthetic/er/seed42"


@pytest.mark.parametrize("damage, fragment", [
    (lambda d: (d / "state.pt").write_bytes(b""), "state.pt is damaged"),
    (lambda d: (d / "state.pt").write_bytes(pickle.dumps({"next_task": 1})), "state.pt is damaged"),
    (lambda d: torch.save({"weights": torch.zeros(2)}, d / "state.pt"), "state.pt is damaged"),
    (lambda d: (d / "config.yaml").unlink(), "config.yaml is missing, empty or damaged"),
    (lambda d: (d / "config.yaml").write_text(""), "config.yaml is missing, empty or damaged"),
    (lambda d: _truncate(d / "checkpoints/task1.pt"), "task1.pt is damaged"),
])
def test_a_damaged_run_folder_is_one_line_naming_the_file_and_the_fix(damage, fragment, finished_run, capsys):
    args, run_dir = finished_run
    state = torch.load(run_dir / "state.pt", weights_only=True)
    state["next_task"] = 2  # resume after task 1, which reads checkpoints/task1.pt
    torch.save(state, run_dir / "state.pt")
    damage(run_dir)
    capsys.readouterr()
    assert run_cli(*args, "--resume") == 2
    err = capsys.readouterr().err.strip()
    assert fragment in err and "--overwrite" in err and len(err.splitlines()) == 1


def _truncate(path):
    path.write_bytes(path.read_bytes()[:100])


def test_a_damaged_plateau_progress_file_or_image_cache_is_one_line(tmp_path):
    from test_data import write_tiny_imagenet

    from cl2r_bench.data.datasets import read_tiny_imagenet
    from cl2r_bench.models import CheckpointError, build_model
    from cl2r_bench.settings import PlateauSettings, TrainSettings
    from cl2r_bench.training.pretrain import PlateauTraining

    partial = tmp_path / "model.partial.pt"
    partial.write_bytes(b"PK\x03\x04 truncated")
    model = build_model(head="learnable", num_classes=3, backbone="small_cnn", small_width=4, small_out_dim=8)
    with pytest.raises(CheckpointError, match="model.partial.pt is damaged .*delete it"):
        PlateauTraining(model, None, PlateauSettings.with_defaults(), TrainSettings.with_defaults(), partial)
    folder = write_tiny_imagenet(tmp_path)
    (folder / "cl2r-cache-32px.npz").write_bytes(b"PK\x03\x04 truncated")
    with pytest.raises(DataError, match="cl2r-cache-32px.npz is damaged .*delete it"):
        read_tiny_imagenet(tmp_path)


def test_resume_works_from_another_working_directory(tiny, tmp_path, monkeypatch):
    from conftest import interrupt_run_at

    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    config = yaml.safe_load(tiny.read_text())
    config["replacement"]["pretrain"]["cache_dir"] = "relative-cache"
    (work / "tiny.yaml").write_text(yaml.safe_dump(config))
    args = ("--config", work / "tiny.yaml", "--strategy", "er", "--output", "out")
    undo = interrupt_run_at(monkeypatch, 1)
    assert run_cli(*args) == 130
    undo()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert run_cli("--config", work / "tiny.yaml", "--strategy", "er", "--output", work / "out", "--resume") == 0
    record = json.loads((work / "out/iamcl2r/synthetic/er/seed42/metrics.json").read_text())
    assert record["complete"] and all(r["path"].startswith(str(work)) for r in record["replacement_models"])


def test_a_second_pretraining_of_the_same_model_waits_for_the_first(tmp_path):
    lock = tmp_path / "model.lock"
    holder = subprocess.Popen([sys.executable, "-c", "import time; from cl2r_bench.files import exclusive\n"
                               f"with exclusive({str(lock)!r}, 'x'):\n    print('held', flush=True); time.sleep(1.5)"],
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    said, started = [], time.monotonic()
    with exclusive(lock, "the pretraining of model.pt", wait=said.append):
        assert time.monotonic() - started > 1.0  # entered only after the holder let go
    holder.wait()
    assert said == [f"waiting for pid {holder.pid} on host {socket.gethostname()}, which holds the pretraining of "
                    f"model.pt; if that process is gone, delete {lock} (a lock without a heartbeat for 60 s is taken "
                    "over by itself)"]


@pytest.mark.parametrize("change", [{"train_per_class": 6}, {"test_per_class": 3}, {"image_size": 20},
                                    {"num_classes": 9}, {"noise": 0.2}, {"similarity": 0.5}])
def test_a_pretrained_model_is_cached_per_data_so_no_data_setting_is_served_anothers_model(tmp_path, change):
    """Issue 29: every setting that changes the data a replacement model is trained (or validated) on changes its
    cache key: the key holds the data's digest, not only the data set's name."""
    from cl2r_bench.data.datasets import make_synthetic
    from cl2r_bench.settings import TrainSettings
    from cl2r_bench.training.pretrain import pretrained_replacement

    base = {"num_classes": 8, "train_per_class": 4, "test_per_class": 2, "image_size": 16}
    settings = TrainSettings.with_defaults(epochs=1, batch_size=16, progress=False)
    kwargs = {"backbone": "small_cnn", "simplex_vertices_count": 16, "small_width": 4, "small_out_dim": 8}

    def path(data):
        return pretrained_replacement(data, [0, 1, 2], head="learnable", model_kwargs=kwargs, settings=settings,
                                      images_per_class=None, device=torch.device("cpu"), seed=0,
                                      cache_dir=tmp_path, log=lambda _: None)

    first, _ = path(make_synthetic(**base))
    again, cached = path(make_synthetic(**base))
    other, other_cached = path(make_synthetic(**{**base, **change}))
    assert again == first and cached
    assert other != first and not other_cached


def bad_paths(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    (tmp_path / "latin1.yaml").write_bytes(b"\xff\xfeseed: 1")
    return [(["--output", str(afile / "sub")], "is a file, not a folder"),
            (["--output", str(afile)], "is a file, not a folder"),
            (["--output", ""], "output is empty"),
            (["--set", f"replacement.pretrain.cache_dir={afile / 'c'}"], "replacement.pretrain.cache_dir"),
            (["--set", f"model_update.feature_cache={afile}"], "model_update.feature_cache"),
            (["--config", str(tmp_path / "latin1.yaml")], "is not UTF-8 text (byte 0xff at position 0)"),
            (["--epochs", "abc"], "argument --epochs: invalid int value: 'abc'")]


def test_bad_paths_files_and_values_are_one_line_before_anything_runs(tmp_path, capsys):
    """Issue 29: output folders below a file, an empty output, a config file that is not UTF-8 and a value of the
    wrong type are one line and exit 2, and nothing is written."""
    from cl2r_bench.cli import main

    for args, message in bad_paths(tmp_path):
        try:
            code = main(["--dataset", "synthetic", *args])
        except SystemExit as exit_:
            code = exit_.code
        err = capsys.readouterr().err
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1, (args, err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "latin1.yaml"]


def test_yaml_aliases_are_refused_in_config_files_and_set_values(tmp_path, capsys):
    """Issue 29: nested aliases ("billion laughs") expand a few hundred bytes into gigabytes; settings never need
    them, so any alias is one line, exit 2."""
    from cl2r_bench.cli import main

    bomb = tmp_path / "bomb.yaml"
    bomb.write_text('a: &a ["x", "x"]\nb: &b [*a, *a]\nc: [*b, *b]\n')
    assert main(["--dataset", "synthetic", "--config", str(bomb), "--output", str(tmp_path / "o")]) == 2
    assert "YAML aliases (*name) are not accepted in settings (line 2)" in capsys.readouterr().err
    assert main(["--dataset", "synthetic", "--set", "replacement.tasks=[&a 0, *a]", "--output", str(tmp_path)]) == 2
    assert "YAML aliases" in capsys.readouterr().err


def test_a_sweep_reruns_a_point_whose_record_the_leaderboard_would_reject(tmp_path):
    """Issue 29: a hand-written {"complete": true} is not a finished run for the sweep either (one record check)."""
    from cl2r_bench.sweep import Job

    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "metrics.json").write_text('{"complete": true}')
    job = Job(folder, "run", tmp_path / "job.yaml", tmp_path / "job.log")
    assert job.status() == "new"
    from test_leaderboard_input import valid_record

    (folder / "metrics.json").write_text(json.dumps(valid_record()))
    assert job.status() == "complete"


def test_a_plugin_folder_and_an_empty_pretrain_say_what_they_are(tmp_path, capsys):
    """Issue 29: `--plugin DIR.py` names a folder, and `pretrain` on a scenario without starting models says so."""
    from cl2r_bench.cli import main

    (tmp_path / "dir.py").mkdir()
    assert main(["--dataset", "synthetic", "--plugin", str(tmp_path / "dir.py"), "--output", str(tmp_path)]) == 2
    assert "is a folder" in capsys.readouterr().err
    assert main(["pretrain", "--scenario", "cl2r", "--dataset", "synthetic"]) == 0
    assert "nothing to pretrain" in capsys.readouterr().out


def test_missing_replacement_checkpoints_are_named_before_any_data_is_read(tiny, tmp_path, capsys):
    from cl2r_bench.cli import main

    code = main(["--config", str(tiny), "--set", f"replacement.checkpoints=[{tmp_path / 'a.pt'},{tmp_path}]",
                 "--data-root", str(tmp_path / "no_data"), "--output", str(tmp_path / "o")])
    assert code == 2 and f"{tmp_path / 'a.pt'} does not exist" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
def test_a_second_run_on_a_held_folder_never_trains_beside_the_first_under_load(tmp_path):
    """Issue 29's reproduction, three times with a busy process on the other core: while the first run holds its
    folder's lock, the same command with --resume is either refused (the lock) or, when it gets the lock after the
    first finished, resumes after its last task; it never trains task 0 beside the first. The folder's results are
    checked again under the lock, so the state seen before reading the data cannot mislead it."""
    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "out"
    command = [sys.executable, "runner.py", "--scenario", "cl2r", "--strategy", "er", "--dataset", "synthetic",
               "--preset", "quick", "--epochs", "1", "--no-progress", "--set", "stream.num_tasks=3",
               "--output", str(out)]
    lock = out / "cl2r/synthetic/er/seed42.lock"
    load = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        for attempt in range(3):
            first = subprocess.Popen([*command, "--overwrite"] if attempt else command, cwd=root,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            deadline = time.monotonic() + 120
            while not lock.exists() and time.monotonic() < deadline and first.poll() is None:
                time.sleep(0.02)
            second = subprocess.run([*command, "--resume"], cwd=root, capture_output=True, text=True, timeout=300)
            first_out, _ = first.communicate(timeout=300)
            assert first.returncode == 0, first_out
            refused = second.returncode == 2 and "is in use by pid" in second.stderr
            resumed = second.returncode == 0 and "resuming" in second.stdout and "task 0:" not in second.stdout
            assert refused or resumed, (second.returncode, second.stdout[-500:], second.stderr[-500:])
            assert json.loads((out / "cl2r/synthetic/er/seed42/metrics.json").read_text())["complete"]
    finally:
        load.kill()
