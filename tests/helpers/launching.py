"""Launching the suite as its users do: torchrun with two processes on a free port, a rank's environment, and
the one-node SLURM test cluster (``tests/slurm/cluster.sh``) with the small resources its jobs ask for."""
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]


def torchrun(*args: str, **kwargs) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    return subprocess.run([*TORCHRUN, "--master_port", str(free_port()), *args], capture_output=True, text=True,
                          env=env, timeout=300, **kwargs)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launched(monkeypatch, rank: int = 0, port: int | None = None) -> None:
    for name, value in {"RANK": rank, "WORLD_SIZE": 2, "LOCAL_RANK": rank, "LOCAL_WORLD_SIZE": 2,
                        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port or free_port()}.items():
        monkeypatch.setenv(name, str(value))


CLUSTER = Path(os.environ.get("CL2R_SLURM_DIR", "/tmp/cl2r-slurm")) / "slurm.conf"


SMALL = ["--gpus-per-job", "0", "--cpus-per-job", "1", "--mem-per-job", "1", "--time", "10"]


def cluster_environment() -> dict[str, str]:
    """The environment that reaches the one-node cluster of tests/slurm/cluster.sh, or a skip saying how to start
    it."""
    import pytest

    pytest.importorskip("submitit")
    if shutil.which("sbatch") is None:
        pytest.skip("sbatch is not on PATH: no SLURM here (apt-get install slurm-wlm; tests/slurm/cluster.sh start)")
    if not (CLUSTER.parent / "slurmctld.pid").exists():
        pytest.skip(f"the test cluster is not up (no {CLUSTER.parent / 'slurmctld.pid'}): tests/slurm/cluster.sh start")
    environment = dict(os.environ, SLURM_CONF=str(CLUSTER))
    if subprocess.run(["sinfo"], capture_output=True, timeout=30, env=environment).returncode != 0:
        pytest.skip("the test cluster does not answer: tests/slurm/cluster.sh start")
    return environment


def sweep_on_cluster(config: Path, out: Path, *args: str, strategy: str = "er",
                     environment: dict[str, str] | None = None) -> tuple[int, str]:
    """``sweep --launcher slurm`` with :data:`SMALL` resources in its own process, so that a hung cluster fails the
    test instead of blocking it; the exit code and what it printed."""
    command = [sys.executable, "-m", "cl2r_bench", "sweep", "--config", str(config), "--output", str(out),
               "--strategy", strategy, "--launcher", "slurm", *SMALL, *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=240, env=environment)
    return done.returncode, done.stdout + done.stderr


def wait_until(condition: Callable[[], bool], seconds: float, what: str, every: float = 0.2) -> None:
    """Poll ``condition`` every ``every`` seconds; fail with ``what`` after ``seconds``."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"{what} after {seconds} s"
        time.sleep(every)


def wait_for_first_task(record: Path, process: subprocess.Popen, seconds: float = 240) -> None:
    """Wait until the run (or sweep) in ``process`` has written ``record``, its metrics after its first task; fail
    if it never does, whether it ends first or runs past ``seconds``."""
    wait_until(lambda: record.exists() or process.poll() is not None, seconds, "the run never finished its first task")
    assert record.exists(), f"the run never finished its first task (exit code {process.returncode})"
