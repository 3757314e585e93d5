"""Stops that do not depend on how the suite was launched (docs/reliability.md).

A process started in the background by a shell script (``cmd &``), and by some CI runners and wrappers, inherits
SIGINT as *ignored*; Python then installs no Ctrl-C handler, and ``kill -INT`` does nothing. SLURM at a time limit,
``docker stop`` and ``timeout`` send SIGTERM, whose default ends the process at once. So every command of the
suite installs both handlers itself, first thing: the first of either signal raises :class:`Stopped` (a
``KeyboardInterrupt``, so every clean-stop path that catches Ctrl-C catches it too), and the command exits with
:func:`exit_code` (130 after SIGINT, 143 after SIGTERM) after one line, its finished tasks kept. What must not
be cut in two (a task that is finished and its saved state) runs inside :func:`deferred_stops`.
"""
from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Stopped(KeyboardInterrupt):
    """The process was sent SIGINT or SIGTERM (``signum``)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


REPEAT_SECONDS = 10.0
"""How long after a stop another one only says that the process is stopping (:func:`stop_handlers`). Pairs come
milliseconds apart; a stop after that raises again, in case the first was caught and dropped by code that should
have let it through."""
REDELIVER_SECONDS = 0.1
"""How long after Python dropped a stop it is sent again (:func:`stop_handlers`): long enough to have left the
callback that dropped it."""
ALREADY_STOPPING = b"\nalready stopping (kill -9 ends the process at once, and may lose what it is saving)\n"


@contextlib.contextmanager
def stop_handlers() -> Iterator[None]:
    """While inside, the first SIGINT or SIGTERM raises :class:`Stopped` in this process, whatever it inherited;
    the previous handlers are restored after, so an in-process caller (a test, a notebook) keeps its own. Later
    ones within :data:`REPEAT_SECONDS` only say that the process is stopping: stops often come in pairs (SLURM's
    ``scancel`` and time limit signal every process of a job, and torchrun passes the signal it gets on to its
    workers, so each worker gets two), and a second one raised while the first unwinds would cut short what it
    saves and its one line. A stop that Python dropped (raised in a ``__del__`` or a garbage-collector callback, such
    as the one JAX installs when qpsolvers imports it for Avalanche's GEM; Python prints it as ignored) is sent again
    after :data:`REDELIVER_SECONDS`, and opens no such window: one Ctrl-C or SIGTERM is never lost. A no-op off the main
    thread, where Python cannot install handlers."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    last_stop: float | None = None

    def stop(signum: int, frame: Any) -> None:
        nonlocal last_stop
        now = time.monotonic()
        if last_stop is not None and now - last_stop < REPEAT_SECONDS:
            os.write(2, ALREADY_STOPPING)
            return
        last_stop = now
        raise Stopped(signum)

    def dropped(unraisable: Any) -> None:
        nonlocal last_stop
        if isinstance(unraisable.exc_value, Stopped):
            last_stop = None
            again = threading.Timer(REDELIVER_SECONDS, os.kill, (os.getpid(), unraisable.exc_value.signum))
            again.daemon = True
            again.start()
            redeliveries.append(again)
        previous_hook(unraisable)

    redeliveries: list[threading.Timer] = []
    previous_hook, sys.unraisablehook = sys.unraisablehook, dropped
    previous = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    for signum in STOP_SIGNALS:
        signal.signal(signum, stop)
    try:
        yield
    finally:
        for again in redeliveries:
            again.cancel()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        sys.unraisablehook = previous_hook


@contextlib.contextmanager
def deferred_stops() -> Iterator[None]:
    """While inside, SIGINT and SIGTERM wait: a stop that arrives is delivered on leaving, to the handler that was
    there before, so a finished task is saved whole before the process stops (docs/reliability.md). When the body
    raises, its exception goes on and the waiting stop is dropped. A no-op off the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived: list[int] = []
    previous = {signum: signal.signal(signum, lambda signum, frame: arrived.append(signum))
                for signum in STOP_SIGNALS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if arrived:
        signal.raise_signal(arrived[0])


def exit_code(stop: BaseException) -> int:
    """128 + the signal's number: 143 after SIGTERM, 130 after SIGINT or a plain ``KeyboardInterrupt``."""
    return 128 + (stop.signum if isinstance(stop, Stopped) else signal.SIGINT)


def stop_name(stop: BaseException) -> str:
    """How a person names the stop: ``SIGTERM``, or ``Ctrl-C / SIGINT``."""
    return "SIGTERM" if isinstance(stop, Stopped) and stop.signum == signal.SIGTERM else "Ctrl-C / SIGINT"
