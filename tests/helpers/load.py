"""A loaded machine for the tests of locks, stops and timeouts: a guarantee that holds only on an idle machine is not
one (the developers' guide)."""
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def busy_core() -> Iterator[None]:
    """Keep one core busy while the block runs: a process that computes without pause, ended (and reaped, so its
    CPU time is counted where it was spent) when the block ends. Tests put around the moment they check (two runs on
    one lock, a stop being handled), not around the set-up before it."""
    load = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        load.kill()
        load.wait()
