"""What a seed, a count, a number option and a text file may be, checked where they enter (command line, config,
array files, pages) and before anything is allocated, seeded or read (docs/reliability.md).

* A seed is an integer in [0, :data:`SEED_MAX`]: every generator the suite seeds (torch, numpy, Python) takes it,
  and so does a task's seed ``seed * 1000 + task`` (:func:`cl2r_bench.settings.task_seed`) in torch's 64 bits.
* A count (queries, jobs, runs) is an integer in [1, :data:`COUNT_MAX`], unless it declares less.
* A number on the command line declares the values it takes beside its option, as a setting declares its own
  (:func:`cl2r_bench.plugin_settings.setting`): ``type=number(int, at_least=2, at_most=RESAMPLES_MAX)``
  (:class:`NumberOption`); ``tests/app/test_arguments.py`` feeds every option of every command a value outside.
* A text file the suite reads whole (a record, a config, a page, a matrix) is a regular file of at most
  :data:`TEXT_BYTES_MAX` bytes of UTF-8 (:func:`read_text`): a FIFO, a device or a link to one is never opened.
"""
from __future__ import annotations

import argparse
import math
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SEED_MAX = 2**32 - 1
COUNT_MAX = 2**31 - 1
RESAMPLES_MAX = 100_000
"""The most bootstrap draws of an interval (``compare --resamples``, ``evaluation.resamples``): a hundred times the
default 1,000, whose percentile interval already moves by less than its last printed digit; each draw is a row of
the entries' accuracies (``entries x resamples`` float64: 400 MB for a 31-task matrix at this bound)."""
JOBS_MAX = 1024
"""The most runs a local sweep starts at a time (``--jobs``): one process, and a GPU slot, each."""
SHARDS_MAX = 2**16
"""The most pieces an embedding is split in (``embed --shards``) and SLURM array tasks it is spread over
(``--workers``; SLURM's own ``MaxArraySize`` is at most 4,000,001 and 1,001 by default): a task object and a done
file each."""
TEXT_BYTES_MAX = 64 << 20
"""The largest text file read whole: a metrics.json is a few hundred kB (the per-entry noise intervals of a 31-task
run), a config or a page a few dozen."""


def seed_problem(value: object, name: str = "seed") -> str | None:
    """Why ``value`` is not a seed, or None."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= SEED_MAX:
        return f"{name} must be an integer from 0 to {SEED_MAX} (2^32 - 1), not {value!r}"
    return None


def _number(value: float) -> str:
    return str(value) if isinstance(value, int) else f"{value:g}"


@dataclass(frozen=True)
class Allowed:
    """The values one setting or option takes: numbers from ``low`` (excluded when ``low_open``) to ``high``, or
    ``choices``."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    choices: tuple[Any, ...] | None = None

    def problem(self, value: Any) -> str | None:
        """What is wrong with ``value`` (in the words of :mod:`cl2r_bench.setting_rules`), or None; None passes."""
        if value is None or isinstance(value, bool):
            return None
        if self.choices is not None:
            return None if value in self.choices else f"choose from {list(self.choices)}"
        if isinstance(value, (int, float)) and not self.holds(value):
            return f"must be {self.described()}"
        return None

    def holds(self, value: float) -> bool:
        if math.isnan(value) or math.isinf(value) and self.high is None and value > 0:
            return False
        above = self.low is None or (value > self.low if self.low_open else value >= self.low)
        below = self.high is None or (value < self.high if self.high_open else value <= self.high)
        return above and below

    def described(self) -> str:
        low = None if self.low is None else ("above " if self.low_open else "at least ") + _number(self.low)
        high = None if self.high is None else ("below " if self.high_open else "at most ") + _number(self.high)
        return " and ".join(part for part in (low, high) if part) + ("" if self.high is not None else " (finite)")


def bounds(*, at_least: float | None = None, above: float | None = None, at_most: float | None = None,
           below: float | None = None) -> Allowed:
    """The :class:`Allowed` of a number declared with these words (``above`` and ``below`` exclude their bound)."""
    return Allowed(low=above if above is not None else at_least, high=below if below is not None else at_most,
                   low_open=above is not None, high_open=below is not None)


@dataclass(frozen=True)
class NumberOption:
    """The argparse ``type`` of a number option with the values it takes (module docstring): a value outside is
    refused while the command line is parsed, in one line naming the option, before anything is read or
    allocated."""

    kind: type
    allowed: Allowed

    def __call__(self, text: str) -> int | float:
        try:
            value = self.kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid {self.kind.__name__} value: {text!r}") from None
        if not self.allowed.holds(value):
            raise argparse.ArgumentTypeError(f"must be {self.described()}, not {text}")
        return value

    def described(self) -> str:
        allowed = self.allowed
        closed = not (allowed.low_open or allowed.high_open) and None not in (allowed.low, allowed.high)
        if self.kind is int and closed:
            return f"a whole number from {allowed.low} to {allowed.high}"
        return allowed.described()


def number(kind: type = int, *, at_least: float | None = None, above: float | None = None,
           at_most: float | None = None, below: float | None = None) -> NumberOption:
    """The argparse ``type`` of a number option taking the values these words declare; a whole number without an
    upper bound stops at :data:`COUNT_MAX`, a float must declare one."""
    if kind is int and at_most is None and below is None:
        at_most = COUNT_MAX
    if at_least is None and above is None or at_most is None and below is None:
        raise ValueError("a number option declares both its bounds")
    return NumberOption(kind, bounds(at_least=at_least, above=above, at_most=at_most, below=below))


seed_argument = number(int, at_least=0, at_most=SEED_MAX)
"""argparse ``type`` of a seed."""
count_argument = number(int, at_least=1)
"""argparse ``type`` of a count (queries, runs)."""


class TextFileError(ValueError):
    """A text file that cannot be read whole: ``problem`` says why in one line (without the file's name, which the
    reader adds as it names the file)."""

    def __init__(self, problem: str) -> None:
        super().__init__(problem)
        self.problem = problem


def read_text(path: str | Path, what: str = "file", max_bytes: int = TEXT_BYTES_MAX) -> str:
    """The UTF-8 text of ``path``, a regular file of at most ``max_bytes`` (a ``what``: a record, a config, ...).

    Raises :class:`TextFileError` naming the problem in one line: missing or unreadable, a folder, not a regular
    file (a FIFO, device or link to one: never opened, so never waited on), larger than ``max_bytes`` (checked
    before reading and while reading, so a file that grows is cut off), or not UTF-8. Line ends read as
    :meth:`pathlib.Path.read_text` reads them (``\\r\\n`` and ``\\r`` as ``\\n``)."""
    path = Path(path)
    too_large = f"more than a {what} holds ({max_bytes >> 20} MB)"
    try:
        info = path.stat()
        if stat.S_ISDIR(info.st_mode):
            raise TextFileError(f"a folder, not a {what}")
        if not stat.S_ISREG(info.st_mode):
            raise TextFileError(f"not a regular file (a FIFO, device or link to one); a {what} is a file")
        if info.st_size > max_bytes:
            raise TextFileError(f"{info.st_size} bytes, {too_large}")
        with path.open("rb") as handle:
            data = handle.read(max_bytes + 1)
    except OSError as exc:
        raise TextFileError(f"unreadable ({exc.strerror or exc})") from None
    if len(data) > max_bytes:
        raise TextFileError(f"more than {max_bytes} bytes, {too_large}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TextFileError(f"not UTF-8 text (byte {data[exc.start]:#04x} at position {exc.start})") from None
    return text.replace("\r\n", "\n").replace("\r", "\n")
