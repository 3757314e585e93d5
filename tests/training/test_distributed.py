"""Data-parallel runs under torchrun (``cl2r_bench/distributed.py``): the ranks' shares make up the
one-process batch, two gloo processes give one process's loss and gradients, a two-process run writes one set of
results and resumes after being killed, and a bad launch is one line before anything starts."""
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
import yaml
from helpers.launching import TORCHRUN, free_port, launched, torchrun

from cl2r_bench.app import cli
from cl2r_bench.data.datasets import ImageSet
from cl2r_bench.distributed import LaunchError, Processes, place
from cl2r_bench.settings import DistributedSettings
from cl2r_bench.training.engine import DeviceBatches

TESTS = Path(__file__).resolve().parents[1]


def test_shares_split_a_count_into_contiguous_parts_the_first_ranks_one_larger():
    assert [Processes(rank, 3).share(10) for rank in range(3)] == [slice(0, 4), slice(4, 7), slice(7, 10)]
    assert [Processes(rank, 2).share(64) for rank in range(2)] == [slice(0, 32), slice(32, 64)]
    assert Processes().share(5) == slice(0, 5)


@pytest.mark.parametrize("world_size, new, memory, length", [(2, 300, 100, "reference"), (3, 300, 100, "reference"),
                                                              (2, 300, 0, "reference"), (2, 200, 50, "full_pass")])
def test_the_ranks_shares_of_each_batch_are_the_one_process_batch_with_its_crops(world_size, new, memory, length):
    def data(n, offset):
        return ImageSet(torch.randint(0, 256, (n, 3, 8, 8), dtype=torch.uint8), torch.arange(n) + offset)

    def epoch(processes):
        torch.manual_seed(7)
        batches = DeviceBatches(new_set, memory_set, new_batch=64 if memory else 128, memory_batch=64,
                                epoch_length=length, processes=processes)
        return [(images, labels, from_memory, batches.rank_sizes) for images, labels, from_memory in batches]

    new_set, memory_set = data(new, 0), data(memory, 10_000) if memory else None
    whole = epoch(Processes())
    shares = [epoch(Processes(rank, world_size)) for rank in range(world_size)]
    assert len(whole) > 1 and all(len(s) == len(whole) for s in shares)
    for b, (images, labels, from_memory, sizes) in enumerate(whole):
        parts = [s[b] for s in shares]
        for half in (False, True):
            assert torch.equal(torch.cat([p[0][p[2] == half] for p in parts]), images[from_memory == half])
            assert torch.equal(torch.cat([p[1][p[2] == half] for p in parts]), labels[from_memory == half])
        assert sizes == [len(labels)] and all(p[3] == [len(q[1]) for q in parts] for p in parts)


STEPPED = ["fd", "dsimplex_hoc", "advbct", "bt2"]


@pytest.fixture(scope="module")
def two_rank_steps(tmp_path_factory) -> Path:
    """The folder where one torchrun launch of two gloo ranks saved a step of each of :data:`STEPPED`."""
    folder = tmp_path_factory.mktemp("two-ranks")
    result = torchrun(str(TESTS / "helpers" / "ddp_step.py"), str(folder), *STEPPED)
    assert result.returncode == 0, result.stderr[-2000:]
    return folder


@pytest.mark.slow
@pytest.mark.parametrize("strategy", STEPPED)
def test_two_gloo_ranks_give_the_loss_and_gradients_of_one_process_on_the_global_batch(strategy, two_rank_steps,
                                                                                       tmp_path):
    """FD: per-sample terms, the teacher, the replay half; d-Simplex-HOC: a batch-level term (pairs across the
    whole global batch), which needs the gathered outputs; AdvBCT: the strategy's own trained modules (its
    discriminator, with batch norm, and elastic boundary), not wrapped by DDP, each rank computing their gradient
    on the gathered batch; BT²: the head's own backbone features (``Step.new_features``, gathered with their
    gradient) and an independent model's. The gathered batch holds the ranks' shares one after the other, so its
    sums run in another order than one process's: the loss agrees within float32 rounding (2e-6 relative; AdvBCT's
    came to 1.1e-6)."""
    from helpers.ddp_step import one_step

    one = tmp_path / "one.pt"
    one_step(one, strategy)
    a, b = torch.load(one), torch.load(two_rank_steps / f"{strategy}.pt")
    from strategies import get_strategy

    images = 64 + 64 if get_strategy(strategy).uses_memory else 96    # 64 new + 64 replayed, or the 96 new alone
    assert b["world_size"] == 2 and a["iterations"] == b["iterations"] == 1 and a["images"] == b["images"] == images
    assert b["loss"] == pytest.approx(a["loss"], rel=2e-6)
    for name, change in a["change"].items():
        assert change.abs().max() > 1e-4, name
        torch.testing.assert_close(b["change"][name], change, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_a_two_process_run_writes_one_set_of_results_and_resumes_after_a_kill(tiny, tmp_path):
    command = [str(TESTS.parent / "runner.py"), "--config", str(tiny), "--strategy", "er",
               "--set", "training.epochs=12"]
    done = torchrun(*command, "--output", str(tmp_path / "whole"))
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.count("== iamcl2r / synthetic / er / seed 42") == 1 and "2 processes" in done.stdout
    assert done.stdout.count("task 2 (replacement): trained") == 1
    run = tmp_path / "whole" / "iamcl2r" / "synthetic" / "er" / "seed42"
    whole = json.loads((run / "metrics.json").read_text())
    assert whole["complete"] and whole["world_size"] == 2
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["task0.pt", "task1.pt", "task2.pt"]

    killed = tmp_path / "killed" / "iamcl2r" / "synthetic" / "er" / "seed42"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    process = subprocess.Popen([*TORCHRUN, "--master_port", str(free_port()), *command, "--output",
                                str(tmp_path / "killed")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               env=env, start_new_session=True)
    deadline = time.monotonic() + 120
    while not (killed / "metrics.json").exists() and process.poll() is None:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    partial = json.loads((killed / "metrics.json").read_text())
    assert not partial["complete"] and partial["tasks_completed"] < 3
    resumed = torchrun(*command, "--output", str(tmp_path / "killed"), "--resume")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resuming" in resumed.stdout
    record = json.loads((killed / "metrics.json").read_text())
    assert record["complete"] and record["world_size"] == 2
    assert record["compatibility_matrix"] == whole["compatibility_matrix"]
    single = cli.main(["--config", str(tiny), "--strategy", "er", "--set", "training.epochs=12", "--output",
                       str(tmp_path / "killed"), "--resume"])
    assert single == 2


@pytest.mark.slow
def test_a_two_process_model_update_fits_the_adapter_of_one_process(tiny, tmp_path):
    """With the adapter's fitting pairs and the final measures embedded in shares and gathered, two ranks give the
    one-process cases and backfilling curves (model_update trains nothing, so the models are the same)."""
    config = yaml.safe_load(tiny.read_text())
    config.update(scenario="model_update")
    config["stream"]["num_tasks"] = 2
    (tmp_path / "update.yaml").write_text(yaml.safe_dump(config))
    command = ["--config", str(tmp_path / "update.yaml"), "--adapter", "procrustes"]
    assert cli.main([*command, "--output", str(tmp_path / "one"), "--no-progress"]) == 0
    done = torchrun(str(TESTS.parent / "runner.py"), *command, "--output", str(tmp_path / "two"))
    assert done.returncode == 0, done.stderr[-2000:]
    one, two = (json.loads(next((tmp_path / name).rglob("metrics.json")).read_text()) for name in ("one", "two"))
    assert two["world_size"] == 2 and two["complete"]
    first, second = one["retrieval"], two["retrieval"]
    assert second["cases"].keys() == first["cases"].keys()
    for case, scores in first["cases"].items():
        assert second["cases"][case] == (None if scores is None else pytest.approx(scores, abs=1e-4)), case
    curves = second["backfilling"]["curves"]
    assert curves.keys() == first["backfilling"]["curves"].keys()
    for order, curve in first["backfilling"]["curves"].items():
        expected = None if curve is None else {score: pytest.approx(v, abs=1e-4) for score, v in curve.items()}
        assert curves[order] == expected, order


def test_a_held_run_folder_refuses_every_rank_with_rank_0s_error(tiny, tmp_path):
    """Rank 0 checks the folder under its lock and every other rank takes its outcome: here the refusal (the lock is
    held by this test), which each rank raises, so none trains or waits on the others."""
    from cl2r_bench.files import exclusive

    out = tmp_path / "out"
    with exclusive(out / "iamcl2r/synthetic/er/seed42.lock", "the test"):
        done = torchrun(str(TESTS.parent / "runner.py"), "--config", str(tiny), "--strategy", "er", "--output",
                        str(out), "--resume")
    assert done.returncode != 0
    assert done.stderr.count(f"is in use by pid {os.getpid()}") == 2, done.stderr[-2000:]
    assert "task 0" not in done.stdout


class FromMain:
    """A rank other than 0 that receives ``outcome`` from rank 0."""

    def __init__(self, outcome):
        self.outcome = outcome

    def from_main(self, value):
        return self.outcome


def test_a_rank_other_than_0_takes_rank_0s_decision_not_its_own_view_of_the_folder(tmp_path):
    from cl2r_bench.app.run_folder import RunError, RunFolder

    folder = tmp_path / "run"
    folder.mkdir()
    (folder / ".cl2r-run").touch()
    (folder / "state.pt").touch()  # what this rank sees; rank 0 decided under its lock not to resume
    reader = RunFolder(folder, resume=True, overwrite=False, writer=False)
    assert reader.resuming
    with reader.writing({}, FromMain((None, False))):
        assert not reader.resuming
    with pytest.raises(RunError, match="refused by rank 0"):
        with RunFolder(folder, resume=True, overwrite=False, writer=False).writing(
                {}, FromMain((RunError("refused by rank 0"), False))):
            pass


@pytest.mark.parametrize("args, message", [
    (["--strategy", "er", "--set", "distributed.sync_batchnorm=true"], "distributed.sync_batchnorm needs CUDA"),
    (["--strategy", "avalanche:Naive"], "avalanche:Naive trains in one process"),
    (["--strategy", "er", "--device", "mps"], "torchrun runs on CUDA GPUs or the CPU"),
])
def test_a_bad_torchrun_launch_is_one_line_before_anything_starts(args, message, monkeypatch, tiny, tmp_path, capsys):
    launched(monkeypatch)
    out = tmp_path / "out"
    assert cli.main(["--config", str(tiny), "--output", str(out), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err and not out.exists()


def test_other_commands_are_refused_under_torchrun(monkeypatch, tiny, tmp_path, capsys):
    launched(monkeypatch)
    assert cli.main(["sweep", "--config", str(tiny), "--strategy", "er", "--output", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "use the run, embed or adapt command under it, and `runner.py sweep` in one process" in err


def test_an_unreachable_master_is_one_line_after_the_connect_timeout(monkeypatch, tiny, tmp_path, capsys):
    launched(monkeypatch, rank=1)
    out = tmp_path / "out"
    started = time.monotonic()
    assert cli.main(["--config", str(tiny), "--strategy", "er", "--output", str(out),
                     "--set", "distributed.connect_timeout=1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "cannot reach the torchrun master at 127.0.0.1:" in err
    assert "(rank 1 of 2)" in err and time.monotonic() - started < 30 and not out.exists()


def test_more_processes_than_gpus_is_refused(monkeypatch):
    launched(monkeypatch, rank=1)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    settings = DistributedSettings(sync_batchnorm=False, connect_timeout=1.0, timeout=1.0)
    with pytest.raises(LaunchError, match=r"started 2 processes on this machine but it has 1 GPU\(s\), one per "
                                          r"process: use --nproc_per_node 1 or fewer"):
        place(settings, torch.device("cuda"))
    with pytest.raises(LaunchError, match="each process takes the GPU of its local rank"):
        place(settings, torch.device("cuda", 0))
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert place(settings, torch.device("cpu")) == (Processes(), torch.device("cpu"))


def test_the_leaderboard_keeps_runs_of_different_world_sizes_apart():
    from cl2r_bench.reporting.experiments import experiment_groups

    def record(seed, world_size=None):
        r = {"scenario": "cl2r", "dataset": "synthetic", "strategy": "er", "method": "er", "seed": seed,
             "config": {"strategy": "er", "seed": seed, "training": {"lr": 0.1}}}
        return r if world_size is None else {**r, "world_size": world_size}

    groups = experiment_groups([record(1), record(2, 1), record(3, 2)])
    assert sorted(groups) == [("cl2r", "synthetic", "er [world_size=1]"), ("cl2r", "synthetic", "er [world_size=2]")]
    assert [r["seed"] for r in groups[("cl2r", "synthetic", "er [world_size=1]")]] == [1, 2]
