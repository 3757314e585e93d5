"""Locks that let go (cl2r_bench/files.py): an empty lock file or one whose holder went silent on another host is
taken over after its lease, a live holder keeps its lock by its heartbeat, and every wait names the lock file and
how to clear it. The other core is kept busy: a guarantee that holds only on an idle machine is not one."""
import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest
from helpers.load import busy_core

from cl2r_bench.files import (
    EMPTY_GRACE_SECONDS,
    FolderBusyError,
    atomic_write,
    atomic_write_json,
    atomic_write_text,
    exclusive,
    read_holder,
)


@pytest.fixture(name="busy_core")
def busy_core_fixture():
    with busy_core():
        yield


def aged(path, seconds: float) -> None:
    """Set the lock file's heartbeat (its modification time) ``seconds`` into the past."""
    then = time.time() - seconds
    os.utime(path, (then, then))


def test_an_empty_lock_left_by_a_writer_killed_before_filling_it_is_taken_over(tmp_path, busy_core):
    lock = tmp_path / "entry.lock"
    lock.touch()
    with pytest.raises(FolderBusyError, match="an empty or unreadable lock file"):
        with exclusive(lock, "the entry"):
            pass  # a fresh empty file may be a writer about to fill it: not taken over yet
    aged(lock, EMPTY_GRACE_SECONDS + 1)
    with exclusive(lock, "the entry"):
        assert read_holder(lock).pid == os.getpid()
    assert not lock.exists()


def test_an_unreadable_lock_goes_stale_and_the_waiting_line_says_why(tmp_path, busy_core):
    """Bytes that are not UTF-8 once hid the lock's age, so a ten-minute-old one was waited on for ever."""
    lock = tmp_path / "entry.lock"
    lock.write_bytes(b"\xff\xfe\x00garbage")
    aged(lock, 600)
    said = []
    with exclusive(lock, "the entry", wait=said.append):
        assert read_holder(lock).pid == os.getpid()
    assert len(said) == 1 and said[0].startswith(f"took over the stale lock {lock} of the entry: empty or unreadable "
                                                 "for 60"), said


def test_a_lock_that_names_this_very_process_is_a_reused_pid_and_is_taken_over(tmp_path, busy_core):
    """A lock left by an earlier container whose pid this process now has: alive by its pid, but this process does
    not hold it."""
    lock = tmp_path / "entry.lock"
    lock.write_text(f"{os.getpid()}\n{socket.gethostname()}\n{time.time() - 5:.3f}\n")
    said = []
    with exclusive(lock, "the entry", wait=said.append):
        pass
    assert said == [f"took over the stale lock {lock} of the entry: it names this very process (pid {os.getpid()}), "
                    "which does not hold it: a pid reused"]
    assert not lock.exists()


def test_a_holder_on_another_host_that_went_silent_is_taken_over_after_its_lease(tmp_path, busy_core):
    lock = tmp_path / "entry.lock"
    lock.write_text(f"4242\nanother-host\n{time.time() - 100:.3f}\n")
    said = []
    with pytest.raises(FolderBusyError) as busy:
        with exclusive(lock, "the feature cache entry", lease=30):
            pass
    assert f"pid 4242 on host another-host; wait for it to end, or, if that process is gone, delete {lock}" in str(
        busy.value)
    taken = threading.Event()

    def take() -> None:
        with exclusive(lock, "the feature cache entry", wait=said.append, lease=2):
            taken.set()

    waiter = threading.Thread(target=take)
    waiter.start()
    time.sleep(1.0)
    assert not taken.is_set() and said == [
        f"waiting for pid 4242 on host another-host, which holds the feature cache entry; if that process is gone, "
        f"delete {lock} (a lock without a heartbeat for 2 s is taken over by itself)"]
    waiter.join(timeout=20)
    assert taken.is_set() and not lock.exists()


def test_a_live_holder_keeps_its_lock_by_its_heartbeat(tmp_path, busy_core):
    """The holder (another process) holds for 4 s with a lease of 1 s: its heartbeat keeps the lock fresh, so a
    waiter that sees it as another host's (the lease rule, not the pid check) waits until it lets go."""
    lock = tmp_path / "entry.lock"
    holder = subprocess.Popen([sys.executable, "-c", "import time; from cl2r_bench.files import exclusive\n"
                               f"with exclusive({str(lock)!r}, 'x', lease=1.0):\n"
                               "    print('held', flush=True); time.sleep(4)"], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    started = time.monotonic()
    for _ in range(6):
        time.sleep(0.5)
        assert read_holder(lock).heartbeat_age < 1.0, "the heartbeat stopped while the holder lives"
    with exclusive(lock, "the entry", wait=lambda _: None, lease=1.0):
        assert time.monotonic() - started > 3.5  # only once the holder let go, after its 4 s
    holder.wait()
    assert read_holder(lock) is None


def strict_load(path):
    """JSON as a strict parser reads it: a NaN or Infinity token is an error."""
    def refuse(token):
        raise ValueError(f"non-standard JSON token {token}")
    return json.loads(path.read_text(), parse_constant=refuse)


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


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_written_files_get_the_mode_the_umask_gives(tmp_path, umask, mode):
    previous = os.umask(umask)
    try:
        atomic_write_text(tmp_path / "metrics.json", "{}\n")
    finally:
        os.umask(previous)
    assert (tmp_path / "metrics.json").stat().st_mode & 0o777 == mode



WRITES = {"save", "write_text", "write_bytes", "savefig", "dump", "fdopen"}
"""The calls that write a file (``torch.save``, ``torch.export.save``, ``np.save``, ``Path.write_text``, ...); in the
suite each is handed to the one atomic writer."""
SCRATCH = {"benchmarks/gallery_rows.py": "a private scratch array in the temporary folder, deleted with its reader",
           "cl2r_bench/files.py": "the atomic writer itself",
           "cl2r_bench/reporting/plots.py": "png_bytes draws into memory (io.BytesIO), for pages that embed their "
                                            "figures"}
"""The modules allowed a write outside :func:`cl2r_bench.files.atomic_write`, and why."""


def test_every_file_the_suite_writes_goes_through_the_atomic_writer():
    """A record, report, export, checkpoint or cache written in place could be left half-written by a crash or
    follow a link out of the output folder: every call that writes a file in the installed packages is inside an
    ``atomic_write`` call (a lambda handed to it), except in the modules of :data:`SCRATCH`."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    found = []
    for package in ("cl2r_bench", "benchmarks", "scenarios", "strategies"):
        for path in sorted((root / package).rglob("*.py")):
            relative = path.relative_to(root).as_posix()
            if relative in SCRATCH:
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"))
            parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
            for node in ast.walk(tree):
                if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and node.func.attr in WRITES):
                    continue
                above = node
                while above in parents and not (isinstance(above, ast.Call) and ast.unparse(above.func).endswith(
                        "atomic_write")):
                    above = parents[above]
                if above not in parents and not isinstance(above, ast.Call):
                    found.append(f"{relative}:{node.lineno}: {ast.unparse(node)[:100]}")
    assert not found, "written outside the atomic writer:\n" + "\n".join(found)


def test_a_record_names_the_suites_commit_a_dirty_tree_and_a_copy_without_git(tmp_path, monkeypatch):
    """``versions`` tells two checkouts of one release apart: the checkout's commit, ``-dirty`` when a tracked file
    outside ``results/`` differs from it, and in a copy without ``.git`` (a lent GPU machine) what ``CL2R_COMMIT``
    says, else None."""
    from cl2r_bench.files import COMMIT_VARIABLE, code_commit, package_versions

    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "tracked.py").write_text("a = 1\n")
    (repo / "results").mkdir()
    (repo / "results" / "page.md").write_text("one\n")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    for args in (["init", "-q"], ["add", "tracked.py", "results/page.md"], ["commit", "-q", "-m", "one"]):
        subprocess.run(git + args, check=True, capture_output=True)
    head = subprocess.run(git + ["rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    code_commit.cache_clear()
    assert code_commit(repo) == head
    (repo / "untracked.py").write_text("")
    code_commit.cache_clear()
    assert code_commit(repo) == head, "an untracked file leaves the tree clean"
    (repo / "results" / "page.md").write_text("two\n")
    code_commit.cache_clear()
    assert code_commit(repo) == head, "a record or page under results/ is not code"
    (repo / "tracked.py").write_text("a = 2\n")
    code_commit.cache_clear()
    assert code_commit(repo) == f"{head}-dirty"
    copy = tmp_path / "copy"
    copy.mkdir()
    monkeypatch.delenv(COMMIT_VARIABLE, raising=False)
    assert code_commit(copy) is None
    monkeypatch.setenv(COMMIT_VARIABLE, "b9d4623")
    code_commit.cache_clear()
    assert code_commit(copy) == "b9d4623"
    code_commit.cache_clear()
    assert "cl2r-bench commit" in package_versions()


def test_a_record_keeps_paths_inside_the_working_directory_relative_and_others_as_given(tmp_path, monkeypatch):
    from cl2r_bench.files import portable_path

    tmp_path = tmp_path.resolve()
    monkeypatch.chdir(tmp_path)
    assert portable_path(str(tmp_path / "results/replacement_models/a.pt")) == "results/replacement_models/a.pt"
    assert portable_path(str(tmp_path.parent / "b.pt")) == str(tmp_path.parent / "b.pt")
    assert portable_path("timm:resnet18") == "timm:resnet18"
