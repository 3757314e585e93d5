"""``metrics.json`` on disk: the one way to write a record and the one way to read one, checked."""
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cl2r_bench.files import atomic_write_json, strict_json
from cl2r_bench.limits import TEXT_BYTES_MAX, TextFileError, read_text

from .check import record_problem
from .schema import RunRecord

RECORD_FILE = "metrics.json"


class RecordError(ValueError):
    """A ``metrics.json`` that cannot be read as a complete run: ``path`` names the file, ``problem`` says why in
    one line (the message is both)."""

    def __init__(self, path: Path, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path, self.problem = path, problem


def read_record(path: str | Path) -> RunRecord:
    """The complete run record in ``path``, checked by :func:`record_problem`.

    Raises :class:`RecordError` naming the file and the one-line problem: unreadable, not UTF-8, not JSON, JSON
    nested too deeply, or a record that :func:`record_problem` rejects (an incomplete run included)."""
    path = Path(path)
    record, problem = _parse(path)
    problem = problem or record_problem(record)
    if problem:
        raise RecordError(path, problem)
    return record


def write_record(folder: str | Path, record: dict[str, Any]) -> None:
    """Write ``record`` as the run folder's :data:`RECORD_FILE` (strict JSON, atomically): the one writer of run
    records. A complete record must pass :func:`record_problem` as its readers will read it, so that a writer and
    the leaderboard can never disagree on the layout; one that does not is a bug in the suite, a
    :class:`RecordError` before anything is written."""
    path = Path(folder) / RECORD_FILE
    if record.get("complete"):
        problem = record_problem(json.loads(json.dumps(strict_json(record))))
        if problem:
            raise RecordError(path, f"the suite wrote a record its readers reject ({problem}); please report it")
    atomic_write_json(path, record)


def holds_complete_record(folder: str | Path) -> bool:
    """Whether ``folder`` holds a ``metrics.json`` that :func:`read_record` accepts: the one test of "this run is
    finished" for the sweep and the study tools, the same as the leaderboard's."""
    try:
        read_record(Path(folder) / RECORD_FILE)
    except RecordError:
        return False
    return True


def checked_records(results_dir: str | Path) -> Iterator[tuple[Path, RunRecord | None, str | None]]:
    """``(path, record, None)`` for every :data:`RECORD_FILE` under ``results_dir`` that :func:`read_record`
    accepts and ``(path, None, why not)`` for the others, in path order: the one walk over a results folder
    (``cl2r_bench.reporting.experiments.collect``, ``cl2r_bench.reporting.plots.plot_results``)."""
    for path in sorted(Path(results_dir).rglob(RECORD_FILE)):
        try:
            yield path, read_record(path), None
        except RecordError as exc:
            yield path, None, exc.problem


MAX_RECORD_BYTES = TEXT_BYTES_MAX
"""The largest record read: any text file's bound (:data:`cl2r_bench.limits.TEXT_BYTES_MAX`)."""


def _parse(path: Path) -> tuple[Any, str | None]:
    """``(parsed JSON, None)``, or ``(None, why the file cannot be read)`` in one line. Only regular files of at
    most :data:`MAX_RECORD_BYTES` are read (:func:`cl2r_bench.limits.read_text`), so a FIFO or a link to a device
    never hangs a reader."""
    try:
        return json.loads(read_text(path, "record", MAX_RECORD_BYTES)), None
    except TextFileError as exc:
        suffix = "; a metrics.json is UTF-8 JSON" if exc.problem.startswith("not UTF-8") else ""
        return None, exc.problem + suffix
    except RecursionError:
        return None, "JSON nesting too deep; a metrics.json is an object a few levels deep"
    except ValueError as exc:
        return None, f"not valid JSON ({exc})"
