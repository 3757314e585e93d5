"""A results folder as the commands that read records take it (leaderboard, compare, plot, report): it must exist,
and the records it holds that cannot be read are named, one line each."""
from __future__ import annotations

import sys
from pathlib import Path

from cl2r_bench.errors import UsageError


def existing_folder(path: str, hint: str = "") -> Path:
    """``path`` when it is a folder; a file or a missing path is a :class:`UsageError` saying which."""
    folder = Path(path)
    if not folder.is_dir():
        state = "is a file, not a folder" if folder.exists() else "does not exist"
        raise UsageError(f"results folder {folder} {state}{hint or '; pass a folder that holds metrics.json files'}")
    return folder


def refuse_nothing_read(skipped: list[tuple[Path, str]], found: bool, results: Path | str, verb: str = "") -> None:
    """Name each skipped record file on stderr (leaderboard, plot, report); with no complete record found (to
    ``verb``), a :class:`UsageError`."""
    for path, reason in skipped:
        print(f"skipped {path}: {reason}", file=sys.stderr)
    if not found:
        raise UsageError(f"no complete metrics.json under {results}{f' to {verb}' if verb else ''}; run an "
                         "experiment first"
                         + (f" ({len(skipped)} file(s) skipped, reasons above)" if skipped else ""))
