"""Result files: atomic writes, strict JSON, run-folder locks, and the environment recorded with every result.

Every file the suite writes goes through :func:`atomic_write`: a uniquely named temporary file beside the target,
flushed and fsynced, then renamed over it, so a reader (or a crash) never sees a half-written file and two
writers never share a temporary file. JSON is strict (no ``NaN`` / ``Infinity`` tokens, :func:`strict_json`).
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import tempfile
from collections.abc import Callable, Iterator
from importlib import metadata
from pathlib import Path
from typing import IO, Any

import torch

PACKAGES = ("torch", "torchvision", "avalanche-lib", "numpy", "tabulate", "pyyaml", "tqdm", "matplotlib", "filelock")


class FolderBusyError(RuntimeError):
    """Another live process holds the lock of a run folder or cached model."""


def atomic_write(path: str | Path, write: Callable[[IO[bytes]], Any]) -> None:
    """Call ``write`` on a fresh temporary file beside ``path``, fsync it and rename it to ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):
        directory = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write(path, lambda f: f.write(text.encode()))


def strict_json(data: Any) -> Any:
    """``data`` with every non-finite float replaced by None. A dict also gets ``non_finite_values``: the dotted
    path of each replaced value and what it was (``nan``, ``inf``, ``-inf``), so a null keeps its reason."""
    replaced: dict[str, str] = {}

    def clean(value: Any, where: str) -> Any:
        if isinstance(value, float) and not math.isfinite(value):
            replaced[where] = str(value)
            return None
        if isinstance(value, dict):
            return {k: clean(v, f"{where}.{k}" if where else str(k)) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [clean(v, f"{where}[{i}]") for i, v in enumerate(value)]
        return value

    out = clean(data, "")
    if replaced and isinstance(out, dict):
        out["non_finite_values"] = replaced
    return out


def atomic_write_json(path: str | Path, data: Any) -> None:
    """Write ``data`` as strict JSON (:func:`strict_json`), atomically."""
    atomic_write_text(path, json.dumps(strict_json(data), indent=1, allow_nan=False) + "\n")


@contextlib.contextmanager
def exclusive(lock_path: str | Path, what: str, *, wait: Callable[[str], Any] | None = None) -> Iterator[None]:
    """Hold the lock file ``lock_path`` (holder's pid and host inside) while the block runs.

    A lock left by a process that no longer runs on this host is stale and taken over (filelock's
    ``SoftFileLock``: an exclusively created file, which works on network file systems where ``flock`` does not).
    A live holder makes this a :class:`FolderBusyError` naming it, or, given ``wait`` (a logging function), a wait
    until the holder is done (e.g. a model another run is pretraining)."""
    from filelock import SoftFileLock, Timeout

    lock_path = Path(lock_path)
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    lock = SoftFileLock(lock_path, timeout=0)
    try:
        lock.acquire()
    except Timeout:
        if wait is None:
            raise FolderBusyError(f"{what} is in use by {lock_holder(lock_path)}; wait for that run to end, or, if "
                                  f"it is gone (another host), delete {lock_path}") from None
        wait(f"waiting for {lock_holder(lock_path)}, which holds {what}")
        lock.acquire(timeout=-1)
    try:
        yield
    finally:
        lock.release()


def lock_holder(lock_path: Path) -> str:
    """``pid N on host H`` as the lock file says, or ``another process`` when it cannot be read."""
    try:
        pid, host = lock_path.read_text().split("\n")[:2]
        return f"pid {int(pid)} on host {host}"
    except (OSError, ValueError):
        return "another process"


def package_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def device_description(device: torch.device) -> dict[str, Any]:
    info: dict[str, Any] = {"type": device.type, "cpu": platform.processor() or platform.machine(),
                            "cpu_threads": torch.get_num_threads()}
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info
