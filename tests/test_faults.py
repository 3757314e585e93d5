"""Fault injection: a run killed at random points — in training, in evaluation, while writing its
results, or by SIGKILL from outside — ends, after ``--resume``, with the uninterrupted run's metrics."""
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.retrieval import CompatibilityEvaluator
from cl2r_bench import files as records
from cl2r_bench.app import cli as runner
from cl2r_bench.training.engine import DeviceBatches

RUN = Path("cl2r/synthetic/er/seed42")
RESULTS = ("compatibility_matrix", "metrics", "noise", "tasks_completed", "complete")


class Killed(BaseException):
    """Stands for the process dying: not an Exception, so nothing in the suite catches it."""


def run_args(tiny, out):
    return ["--config", str(tiny), "--scenario", "cl2r", "--set", "replacement.tasks=[]", "--strategy", "er",
            "--output", str(out)]


def results(out):
    record = json.loads((out / RUN / "metrics.json").read_text())
    return {key: record[key] for key in RESULTS}


@pytest.fixture
def uninterrupted(tiny, tmp_path):
    assert runner.main(run_args(tiny, tmp_path / "clean")) == 0
    return results(tmp_path / "clean")


def kill_at_call(monkeypatch, owner, name, call):
    """Make ``owner.name`` raise :class:`Killed` on its ``call``-th call (1-based), before doing anything."""
    original = getattr(owner, name)
    calls = {"n": 0}

    def dying(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == call:
            raise Killed
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, dying)
    return calls


# Calls in a 3-task run: 3 epochs of batches (one per task), 3 deployments, and 4 atomic writes per task plus 2 at
# the start (marker, config.yaml): the points are drawn among them with a fixed seed.
POINTS = random.Random(16).sample([("training", DeviceBatches, "__iter__", n) for n in (1, 2, 3)], 2) + \
    random.Random(17).sample([("evaluation", CompatibilityEvaluator, "deploy", n) for n in (1, 2, 3)], 2) + \
    random.Random(18).sample([("writing", records.os, "replace", n) for n in range(1, 13)], 3)


@pytest.mark.parametrize("phase, owner, name, call", POINTS, ids=[f"{p[0]}-{p[3]}" for p in POINTS])
def test_a_run_killed_anywhere_resumes_to_the_uninterrupted_metrics(phase, owner, name, call, tiny, tmp_path,
                                                                    uninterrupted, monkeypatch):
    out = tmp_path / "killed"
    with monkeypatch.context() as patch:
        kill_at_call(patch, owner, name, call)
        with pytest.raises(Killed):
            runner.main(run_args(tiny, out))
    assert runner.main(run_args(tiny, out) + ["--resume"]) == 0
    assert results(out) == uninterrupted


def test_a_run_killed_by_sigkill_at_a_random_moment_resumes_to_the_uninterrupted_metrics(tiny, tmp_path,
                                                                                         uninterrupted):
    out = tmp_path / "sigkill"
    command = [sys.executable, "-m", "cl2r_bench", *run_args(tiny, out)]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    chance = random.Random()
    milestone = out / RUN / chance.choice(["config.yaml", "checkpoints/task0.pt", "checkpoints/task1.pt"])
    deadline = time.monotonic() + 120
    while not milestone.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(chance.uniform(0, 0.1))
    os.kill(process.pid, signal.SIGKILL)
    assert process.wait() == -signal.SIGKILL, "the run ended before it could be killed"
    assert (out / RUN.with_name("seed42.lock")).exists()  # the dead process's lock stays, and is taken over
    assert runner.main(run_args(tiny, out) + ["--resume"]) == 0
    assert results(out) == uninterrupted
