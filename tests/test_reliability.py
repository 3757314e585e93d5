"""Issue 16: hostile files, diverged runs, unsafe names, concurrent runs, damaged run folders, late errors."""
import contextlib
import dataclasses
import json
import os
import pickle
import socket
import subprocess
import sys

import numpy as np
import pytest

import runner
from benchmarks.records import atomic_write, atomic_write_json, exclusive
from scenarios.datasets import DataError, read_cifar
from test_data import write_cifar10


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
    import experiment

    original = experiment.train_task

    def lr_explodes_at_task_2(model, strategy, new, memory, settings, **kw):
        if kw["description"].startswith("task 2/"):
            settings = dataclasses.replace(settings, lr=1e9)
        return original(model, strategy, new, memory, settings, **kw)

    monkeypatch.setattr(experiment, "train_task", lr_explodes_at_task_2)
    out = tmp_path / "out"
    assert run_cli("--config", tiny, "--scenario", "cl2r", "--strategy", "er", "--output", out) == runner.EXIT_DIVERGED
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "task 1 diverged" in err and "iteration" in err and "Traceback" not in err
    record = strict_load(out / "cl2r/synthetic/er/seed42/metrics.json")
    assert record["tasks_completed"] == 1 and not record["complete"]
    assert not (out / "cl2r/synthetic/er/seed42/checkpoints/task1.pt").exists()
    assert run_cli("leaderboard", "--results", out) == 2  # an incomplete run is never a leaderboard row


def test_a_diverged_first_task_writes_no_result(tiny, tmp_path, capsys):
    out = tmp_path / "out"
    assert run_cli("--config", tiny, "--scenario", "cl2r", "--strategy", "er", "--output", out,
                   "--set", "training.lr=1e9") == runner.EXIT_DIVERGED
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
    code = run_cli("--config", tiny, "--scenario", "cl2r", "--strategy", "er", "--output", out, "--overwrite",
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
    assert run_cli("--config", tiny, "--scenario", "cl2r", "--strategy", "er", "--output", out, "--overwrite") == 2
    assert "did not write" in capsys.readouterr().err and (foreign / "notes.txt").exists()


def test_resume_and_overwrite_together_is_a_usage_error(tiny, tmp_path, capsys):
    assert run_cli("--config", tiny, "--output", tmp_path, "--resume", "--overwrite") == 2
    assert "--resume" in capsys.readouterr().err


def test_a_second_run_on_a_folder_in_use_is_refused_and_a_stale_lock_is_taken_over(tiny, tmp_path, capsys):
    out = tmp_path / "out"
    run_dir = out / "cl2r/synthetic/er/seed42"
    args = ("--config", tiny, "--scenario", "cl2r", "--strategy", "er", "--output", out)
    with exclusive(run_dir.with_name("seed42.lock"), "test"):
        assert run_cli(*args) == 2
    err = capsys.readouterr().err
    assert f"pid {os.getpid()} on host {socket.gethostname()}" in err and "seed42.lock" in err
    holder = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    run_dir.with_name("seed42.lock").write_text(f"{holder.stdout.strip()}\n{socket.gethostname()}\n")
    assert run_cli(*args) == 0 and not run_dir.with_name("seed42.lock").exists()
