"""Result files: atomic writes, strict JSON, run-folder locks, and the environment recorded with every result.

Every file the suite writes goes through :func:`atomic_write`: a uniquely named temporary file beside the target,
flushed and fsynced, then renamed over it, so a reader (or a crash) never sees a half-written file and two
writers never share a temporary file. JSON is strict (no ``NaN`` / ``Infinity`` tokens, :func:`strict_json`).
"""
from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import platform
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import IO, Any

import torch

PACKAGES = ("cl2r-bench", "torch", "torchvision", "avalanche-lib", "numpy", "numba", "timm", "tabulate", "pyyaml",
            "tqdm", "matplotlib")


class FolderBusyError(RuntimeError):
    """Another live process holds the lock of a run folder or cached model."""


_UMASK_LOCK = threading.Lock()


def current_umask() -> int:
    """The process's umask: from ``/proc/self/status`` where Linux gives it, else read by setting it and putting it
    back (under a lock, so no thread of this process writes a file in between)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    with _UMASK_LOCK:
        mask = os.umask(0o022)
        os.umask(mask)
    return mask


def atomic_write(path: str | Path, write: Callable[[IO[bytes]], Any]) -> None:
    """Call ``write`` on a fresh temporary file beside ``path``, fsync it and rename it to ``path``. The file gets
    the mode a plain ``open`` would give it (``0o666`` less the umask), not the temporary file's ``0o600``, so a
    shared results folder or a web server can read what the suite writes."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o666 & ~current_umask())
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


def portable_path(path: str) -> str:
    """``path`` as a record keeps it: relative to the working directory when it lies inside it (where the suite's
    caches live, ``results/replacement_models/``), so a committed record names no machine's folders; other paths
    and encoder specs unchanged. The run's own state keeps the absolute path, which a resume from another working
    directory needs."""
    candidate = Path(path)
    if not candidate.is_absolute():
        return path
    with contextlib.suppress(ValueError):
        return candidate.relative_to(Path.cwd().resolve()).as_posix()
    return path


LEASE_SECONDS = 60.0
"""A lock whose heartbeat (the lock file's modification time, refreshed every quarter of this by its holder) is
older than this is stale, wherever its holder runs."""
EMPTY_GRACE_SECONDS = 10.0
"""An empty or unreadable lock file older than this is stale (its writer died between creating and filling it)."""
POLL_SECONDS = 0.5
HELD_HERE: set[Path] = set()
"""The lock files this process holds (:func:`exclusive`): a lock that names this process and is not among them was
left by an earlier process with the same pid (a container restarted), so it is stale."""


@dataclass(frozen=True)
class LockHolder:
    """What a lock file says of its holder (``pid``, ``host``; the file's third line, its start time, is for people)
    and how old its heartbeat is; ``pid`` is None for an empty or unreadable file."""

    pid: int | None
    host: str
    heartbeat_age: float

    def __str__(self) -> str:
        if self.pid is None:
            return "an empty or unreadable lock file"
        return f"pid {self.pid} on host {self.host}"

    def stale(self, lease: float, lock_path: Path | None = None) -> str | None:
        """Why the lock is stale, or None while its holder may still hold it: empty or unreadable past the grace
        period, naming this very process while it does not hold ``lock_path`` (:data:`HELD_HERE`: a pid reused after
        a restart), its holder dead on this host, or no heartbeat for longer than ``lease``."""
        if self.pid is None:
            if self.heartbeat_age > EMPTY_GRACE_SECONDS:
                return f"empty or unreadable for {self.heartbeat_age:.0f} s"
            return None
        if self.host == socket.gethostname():
            if self.pid == os.getpid() and lock_path is not None and lock_path.resolve() not in HELD_HERE:
                return f"it names this very process (pid {self.pid}), which does not hold it: a pid reused"
            return None if _alive(self.pid) else f"its holder, pid {self.pid}, is gone"
        return f"no heartbeat for {self.heartbeat_age:.0f} s" if self.heartbeat_age > lease else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def read_holder(lock_path: Path) -> LockHolder | None:
    """The holder of ``lock_path`` (lines ``pid`` and ``host``), or None when no lock file exists."""
    try:
        age = time.time() - lock_path.stat().st_mtime
    except FileNotFoundError:
        return None
    except OSError:
        return LockHolder(None, "", 0.0)
    try:
        lines = lock_path.read_text(encoding="utf-8").split("\n")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError):
        return LockHolder(None, "", age)
    try:
        return LockHolder(int(lines[0]), lines[1].strip(), age)
    except (ValueError, IndexError):
        return LockHolder(None, "", age)


def lock_holder(lock_path: Path) -> str:
    """``pid N on host H`` as the lock file says, or what else it is."""
    holder = read_holder(lock_path)
    return "no process (the lock is gone)" if holder is None else str(holder)


def _try_create(lock_path: Path) -> bool:
    try:
        fd = os.open(lock_path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(f"{os.getpid()}\n{socket.gethostname()}\n{time.time():.3f}\n")
    return True


def _take_over_if_stale(lock_path: Path, lease: float) -> str | None:
    """Delete ``lock_path`` when it is stale, deciding under a short takeover lock (so two takers never delete each
    other's fresh lock); the reason it was stale once it is gone (``"gone"`` when it went by itself), else None."""
    guard = lock_path.with_name(lock_path.name + ".takeover")
    guard_holder = read_holder(guard)
    if guard_holder is not None and guard_holder.heartbeat_age > EMPTY_GRACE_SECONDS:
        guard.unlink(missing_ok=True)
    if not _try_create(guard):
        return None
    try:
        holder = read_holder(lock_path)
        reason = holder.stale(lease, lock_path) if holder is not None else "gone"
        if reason and holder is not None:
            lock_path.unlink(missing_ok=True)
        return reason if read_holder(lock_path) is None else None
    finally:
        guard.unlink(missing_ok=True)


def _heartbeat(lock_path: Path, period: float, stop: threading.Event) -> None:
    while not stop.wait(period):
        with contextlib.suppress(OSError):
            os.utime(lock_path)


@contextlib.contextmanager
def exclusive(lock_path: str | Path, what: str, *, wait: Callable[[str], Any] | None = None,
              lease: float = LEASE_SECONDS) -> Iterator[None]:
    """Hold the lock file ``lock_path`` while the block runs: an exclusively created file (it works on network file
    systems, where ``flock`` does not) holding the holder's pid, host and start time, whose modification time is
    its heartbeat, refreshed by a thread every ``lease / 4`` seconds.

    A stale lock (:meth:`LockHolder.stale`: empty or unreadable for :data:`EMPTY_GRACE_SECONDS`, naming this very
    process, its holder dead on this host, or no heartbeat for ``lease`` seconds) is taken over, and ``wait`` says
    which. A live holder makes this a :class:`FolderBusyError`, or,
    given ``wait`` (a logging function), a wait until it lets go or goes stale; both name the holder, the lock file
    and how to clear it."""
    lock_path = Path(lock_path)
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    said = False
    while not _try_create(lock_path):
        reason = _take_over_if_stale(lock_path, lease)
        if reason:
            if wait is not None and reason != "gone":
                wait(f"took over the stale lock {lock_path} of {what}: {reason}")
            continue
        clear = (f"if that process is gone, delete {lock_path} (a lock without a heartbeat for {lease:.0f} s is "
                 "taken over by itself)")
        if wait is None:
            raise FolderBusyError(f"{what} is in use by {lock_holder(lock_path)}; wait for it to end, or, {clear}")
        if not said:
            wait(f"waiting for {lock_holder(lock_path)}, which holds {what}; {clear}")
            said = True
        time.sleep(POLL_SECONDS)
    held = lock_path.resolve()
    HELD_HERE.add(held)
    stop = threading.Event()
    beat = threading.Thread(target=_heartbeat, args=(lock_path, lease / 4, stop), daemon=True)
    beat.start()
    try:
        yield
    finally:
        stop.set()
        beat.join()
        HELD_HERE.discard(held)
        holder = read_holder(lock_path)
        if holder is not None and holder.pid == os.getpid() and holder.host == socket.gethostname():
            lock_path.unlink(missing_ok=True)


CODE_ROOT = Path(__file__).resolve().parents[1]
COMMIT_VARIABLE = "CL2R_COMMIT"
"""Where a copy of the suite without its ``.git`` (a lent GPU machine, a container) says which commit it is."""


def package_versions() -> dict[str, str | None]:
    """Python's and :data:`PACKAGES`' versions (None where not installed), and the suite's own commit
    (:func:`code_commit`): a package version does not tell two checkouts of one release apart."""
    return {"python": platform.python_version(), **_installed_versions(), "cl2r-bench commit": code_commit()}


@functools.cache
def _installed_versions() -> dict[str, str | None]:
    """:data:`PACKAGES`' versions, read once per process like :func:`code_commit` (each read parses the package's
    metadata file, and a run writes its record after every task); :func:`package_versions` copies it."""
    versions: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


@functools.cache
def code_commit(root: Path = CODE_ROOT) -> str | None:
    """The git commit of the checkout at ``root``, with ``-dirty`` when a tracked file outside ``results/`` differs
    from it (read once per process: the code a process runs is the code it imported; the records and pages under
    ``results/`` are what runs write, not code); else :data:`COMMIT_VARIABLE`; else None."""
    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=30)

    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
        head = git("rev-parse", "--verify", "HEAD") if (root / ".git").exists() else None
        if head is not None and head.returncode == 0:
            dirty = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)results").stdout.strip()
            return head.stdout.strip() + ("-dirty" if dirty else "")
    return os.environ.get(COMMIT_VARIABLE) or None


def device_description(device: torch.device) -> dict[str, Any]:
    info: dict[str, Any] = {"type": device.type, "cpu": platform.processor() or platform.machine(),
                            "cpu_threads": torch.get_num_threads()}
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info
