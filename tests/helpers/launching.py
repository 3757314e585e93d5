"""Launching the suite as its users do: torchrun with two processes on a free port, a rank's environment, and
the one-node SLURM test cluster (``tests/slurm/cluster.sh``) with the small resources its jobs ask for."""
import os
import socket
import subprocess
import sys
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
