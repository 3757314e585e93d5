"""``runner.py sweep``: a grid of runs as separate processes; complete runs are skipped, failed ones named, every
bad point refused before anything starts."""
import json

import pytest

from cl2r_bench import cli


def sweep(tiny, out, *args):
    return cli.main(["sweep", "--config", str(tiny), "--output", str(out), *args])


@pytest.mark.slow
def test_a_sweep_runs_each_point_once_and_a_second_sweep_runs_nothing(tiny, tmp_path, capsys):
    out = tmp_path / "out"
    assert sweep(tiny, out, "--strategy", "er", "cores", "--seeds", "1", "2", "--jobs", "2") == 0
    printed = capsys.readouterr().out
    assert "sweep: 4 runs, 0 already complete, 4 to run, 2 at a time" in printed
    assert "sweep: 4 done, 0 running, 0 failed, 0 waiting" in printed
    for strategy in ("er", "cores"):
        for seed in (1, 2):
            record = json.loads((out / f"iamcl2r/synthetic/{strategy}/seed{seed}/metrics.json").read_text())
            assert record["complete"] and record["seed"] == seed and record["strategy"] == strategy
    assert len(list((out / "sweep" / "logs").glob("*.log"))) == 4
    assert sweep(tiny, out, "--strategy", "er", "cores", "--seeds", "1", "2") == 0
    assert "sweep: 4 runs, 4 already complete, 0 to run" in capsys.readouterr().out


@pytest.mark.slow
def test_a_failed_job_is_named_with_its_log_and_runs_again_once_fixed(tiny, tmp_path, capsys):
    out = tmp_path / "out"
    assert sweep(tiny, out, "--strategy", "er", "--seeds", "3", "--set", "training.lr=1e9") == 1
    printed = capsys.readouterr().out
    log = out / "sweep" / "logs" / "iamcl2r-synthetic-er-seed3.log"
    assert f"failed: iamcl2r-synthetic-er-seed3 (exit code 3); see {log}" in printed
    assert "diverged" in log.read_text()
    assert sweep(tiny, out, "--strategy", "er", "--seeds", "3") == 0
    assert json.loads((out / "iamcl2r/synthetic/er/seed3/metrics.json").read_text())["complete"]


@pytest.mark.parametrize("args, message", [
    (["--strategy", "er", "nope"], "unknown strategy 'nope'"),
    (["--strategy", "er", "--jobs", "0"], "--jobs must be at least 1"),
    (["--strategy", "er", "--seed", "1"], "--seeds K1 K2"),
])
def test_bad_sweep_input_is_one_line_before_any_run(args, message, tiny, tmp_path, capsys):
    out = tmp_path / "out"
    assert sweep(tiny, out, *args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err and not out.exists()
