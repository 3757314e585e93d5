"""Adapter studies side by side, for the result pages of the pretrained-encoder study (``results/pretrained/``): one
row per adapter, and for each study its cross case's top-1 gain over old/old with the 95 % interval and its negative
flips, as :mod:`cl2r_bench.reporting.adapter_recommendation` computes them (``runner.py adapt`` and
``python -m tools.pretrained_report`` give the same figures, one study at a time); under the table, each study's
line on its models and its recommendation. Reads the committed records only.

    python -m tools.page_pretrained --study closed results/pretrained/lite0-lite2/model_update/tinyimagenet \\
        --study open results/pretrained/open-set/lite0-lite2/model_update/tinyimagenet

A study is one folder of leave-one-out records (one pair of encoders, one data set: ``PAIR/model_update/DATASET``).
Rows follow the first study's ranking (largest gain first); an adapter measured on fewer seeds than its study's
most says so in its cell. Prints a GitHub Markdown table.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from benchmarks.record import checked_records, leave_one_out
from cl2r_bench.reporting.adapter_recommendation import (
    AdapterSummary,
    models_line,
    models_verdict,
    ranked,
    recommendation,
    summarise,
)


def study_records(folder: Path) -> list[dict[str, Any]]:
    """The leave-one-out records under ``folder``, in path order."""
    return [record for _, record, _ in checked_records(folder) if record is not None and leave_one_out(record)]


def gain_cell(row: AdapterSummary | None, most_seeds: int) -> str:
    if row is None or row.top1_gain is None:
        return "-"
    interval = f" ({row.top1_interval[0]:+.1f}, {row.top1_interval[1]:+.1f})" if row.top1_interval else ""
    seeds = f", {row.seeds} seed{'s' * (row.seeds != 1)}" if row.seeds < most_seeds else ""
    return f"{row.top1_gain:+.1f}{interval}{seeds}"


def side_by_side(studies: list[tuple[str, list[dict[str, Any]]]]) -> str:
    """The table and, per study, its models line and recommendation (module docstring)."""
    summaries = [(label, ranked(summarise(records)), records) for label, records in studies]
    order: list[str] = []
    for _, rows, _ in summaries:
        order += [r.adapter for r in rows if r.adapter not in order]
    header = ["adapter", "cross case"]
    for label, _, _ in summaries:
        header += [f"{label}: top-1 gain (95% interval)", f"{label}: flips %"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for adapter in order:
        found = [next((r for r in rows if r.adapter == adapter), None) for _, rows, _ in summaries]
        case = next((r.cross_case for r in found if r is not None and r.cross_case), None) or "-"
        cells = [adapter, case]
        for row, (_, rows, _) in zip(found, summaries, strict=True):
            most = max(r.seeds for r in rows)
            cells += [gain_cell(row, most),
                      "-" if row is None or row.negative_flips is None else f"{row.negative_flips:.1f}"]
        lines.append("| " + " | ".join(cells) + " |")
    notes = []
    for label, rows, records in summaries:
        verdict = models_verdict(records)
        notes.append(f"- **{label}**: {models_line(verdict)}; recommendation: {recommendation(rows, verdict)}.")
    return "\n".join(lines) + "\n\n" + "\n".join(notes) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--study", nargs=2, action="append", metavar=("LABEL", "FOLDER"), required=True,
                        help="a column's label and its study's folder of records (PAIR/model_update/DATASET)")
    args = parser.parse_args(argv)
    studies = []
    for label, folder in args.study:
        records = study_records(Path(folder))
        if not records:
            print(f"no leave-one-out records under {folder}")
            return 2
        studies.append((label, records))
    print(side_by_side(studies), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
