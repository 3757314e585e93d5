"""The tables of ``results/parity/README.md``, from the parity records beside it (``runner.py pages`` writes them).

    python -m tools.parity.tables steps|protocol|end-to-end|timing|bct-line|bt2|authors|mixbct|oca|vec2vec|\
        local-procrustes|fct|track [--folder results/parity]

``steps``, ``bct-line``, ``bt2``, ``authors``, ``mixbct``, ``oca``, ``vec2vec``, ``local-procrustes`` and ``fct``:
one row per check of ``steps.json``, ``bct_line.json``, ``bt2.json``, ``authors.json``, ``mixbct.json``,
``oca.json``, ``vec2vec.json``, ``local_procrustes.json`` and ``fct.json`` (the largest absolute difference, its
tolerance, whether it agrees, the note), then the commits they name; ``protocol``: the authors' 7-task run beside
the resolved ``paper`` preset (:func:`tools.parity.report.protocol`); ``end-to-end``: per strategy and code the AC
and AA over seeds of ``end_to_end.json``, and each mean matrix entry by entry; ``timing``: the timed pair of
``timing.json``; ``track``: per strategy of ``track.json`` both codes' new/old and new/new top-1 and their
difference with ``runner.py compare``'s interval, then each reference's commit and entry point.
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from benchmarks.metrics import all_metrics, as_matrix
from cl2r_bench.reporting.compare import compare
from tools.parity.common import ROOT
from tools.parity.report import entry_table, protocol, summarise

CHECKS = {"steps": "steps.json", "bct-line": "bct_line.json", "bt2": "bt2.json", "authors": "authors.json",
          "mixbct": "mixbct.json", "oca": "oca.json", "vec2vec": "vec2vec.json",
          "local-procrustes": "local_procrustes.json", "fct": "fct.json"}


def number(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3g}"


def checks(record: dict | list) -> str:
    """A check table, then the commits the record names (records before that name none)."""
    rows = record["rows"] if isinstance(record, dict) else record
    lines = ["| check | max abs difference | tolerance | agree | note |", "|---|---|---|---|---|"]
    lines += [f"| {r['name']} | {number(r['max_abs_diff'])} | {number(r['tolerance'])} | "
              f"{'yes' if r['agree'] else '**no**'} | {r.get('note', '')} |" for r in rows]
    if isinstance(record, dict) and "suite_commit" in record:
        references = ", ".join(f"`{r['repository']}` at {r['commit']}" for r in record["references"].values())
        lines.append(f"\nSuite at {record['suite_commit']}; {references}.")
    for difference in record.get("differences", []) if isinstance(record, dict) else []:
        values = ", ".join(f"{key} {value:.4g}" for key, value in difference.items() if isinstance(value, float))
        lines.append(f"\n- {difference['name']}: {values}. {difference['note']}")
    return "\n".join(lines)


def protocol_table() -> str:
    lines = ["| setting | authors' code | suite (`paper` preset) | same |", "|---|---|---|---|"]
    lines += [f"| {r['setting']} | {r['reference']} | {r['suite']} | {'yes' if r['agree'] else '**no**'} |"
              for r in protocol()]
    return "\n".join(lines)


def end_to_end_table(record: dict) -> str:
    lines = ["| strategy | code | seeds | AC (mean ± std) | AC per seed | AA (%) |", "|---|---|---|---|---|---|"]
    for strategy, entry in record.items():
        for code in ("suite", "reference"):
            metrics = [all_metrics(as_matrix(r["matrix"]), "strict") for r in entry[code].values()]
            ac, aa = [m["AC"] for m in metrics], [m["AA"] for m in metrics]
            lines.append(f"| {strategy} | {code} | {len(metrics)} | {statistics.mean(ac):.3f} ± "
                         f"{statistics.pstdev(ac):.3f} | {', '.join(f'{v:.3f}' for v in ac)} | "
                         f"{statistics.mean(aa):.2f} ± {statistics.pstdev(aa):.2f} |")
    for strategy, entry in record.items():
        table, beyond, noisy, total = entry_table(entry)
        lines += [f"\n**{strategy}**, suite / reference (% mean ± std over seeds); of {total} entries, {beyond} differ "
                  f"by more than the seed spread (bold), {noisy} by more than one entry's query noise:\n", table]
    return "\n".join(lines)


def timing_table(record: dict) -> str:
    t = summarise(record)[0]
    rows = [("wall time (s)", "suite_wall_s", "suite_first_run_wall_s", "reference_wall_s", 0),
            ("training images/s", "suite_train_img_s", None, "reference_train_img_s", 0),
            ("evaluation (s)", "suite_eval_s", "suite_first_run_eval_s", "reference_eval_s", 0),
            ("peak resident memory (MiB)", "suite_peak_rss_mib", None, "reference_peak_rss_mib", 0)]
    lines = [f"| {t['strategy']}, seed {t['seed']} | suite, a later run of a study | suite, the first run of a study "
             "| authors' code |", "|---|---|---|---|"]
    for title, later, first, reference, digits in rows:
        cells = [t.get(key) for key in (later, first, reference)]
        lines.append(f"| {title} | " + " | ".join("-" if c is None else f"{c:.{digits}f}" for c in cells) + " |")
    lines.append(f"| wall time ratio (authors' / suite) | {t['wall_ratio']:.2f} | "
                 f"{t.get('first_run_wall_ratio', float('nan')):.2f} | 1 |")
    return "\n".join(lines)


def track_table(record: dict) -> str:
    """Per strategy: both codes' new/old and new/new top-1 (mean ± std over the seeds both codes trained) and the
    authors' code's difference with ``compare``'s interval (paired seeds; each seed its own split and queries), and
    the seeds where a code diverged; then the suite's commits and each reference's repository, commit and entry
    point."""
    figures = ("new/old top-1", "new/new top-1")
    lines = ["| strategy | seeds | " + " | ".join(f"{f} (%): suite | authors | authors − suite [95% interval]"
                                                  for f in figures) + " | within noise | diverged (seeds) |",
             "|---|---|" + "---|---|---|" * len(figures) + "---|---|"]
    commits, sources = set(), []
    for strategy, entry in record.items():
        runs = entry["runs"].values()
        trained = [run for run in runs if all("two_model" in run[code] for code in ("suite", "reference"))]
        suite, authors = [run["suite"] for run in trained], [run["reference"] for run in trained]
        cells, within = ["– | – | –"] * len(figures), "–"
        if trained:
            found = {d.figure: d for d in compare(authors, suite) if d.figure in figures}
            cells = [figure_cells(suite, authors, figure, found[figure]) for figure in figures]
            within = "yes" if all(d.verdict == "noise" for d in found.values()) else "**no**"
        diverged = "; ".join(f"{who} {', '.join(str(run[code]['seed']) for run in runs if 'diverged' in run[code])}"
                             for code, who in (("suite", "suite"), ("reference", "authors"))
                             if any("diverged" in run[code] for run in runs)) or "–"
        smoke = "" if isinstance(entry["epochs"], str) else f" (smoke: {entry['epochs']} epochs)"
        lines.append(f"| {strategy}{smoke} | {len(trained)} of {len(runs)} | {' | '.join(cells)} | {within} | "
                     f"{diverged} |")
        commits |= {run[code]["commit"] for run in runs for code in ("suite", "reference")}
        reference = next(iter(entry["references"].values()))
        sources.append(f"- {strategy}: `{reference['repository']}` at {reference['commit']}, {entry['entry_point']}")
    lines.append(f"\nSuite at {', '.join(sorted(str(c) for c in commits))}.\n")
    return "\n".join(lines + sources)


def figure_cells(suite: list[dict], authors: list[dict], figure: str, difference) -> str:
    """One figure's cells: each code's mean ± std over the seeds, the authors' difference and its interval."""
    case = figure.split()[0]
    spread = [_mean_std([run["two_model"]["cases"][case]["top1"] for run in runs]) for runs in (suite, authors)]
    low, high = difference.interval
    return f"{spread[0]} | {spread[1]} | {difference.difference:+.2f} [{low:+.2f}, {high:+.2f}]"


def _mean_std(values: list[float]) -> str:
    return f"{statistics.mean(values):.2f} ± {statistics.pstdev(values):.2f}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("table", choices=[*CHECKS, "protocol", "end-to-end", "timing", "track"])
    parser.add_argument("--folder", type=Path, default=ROOT / "results" / "parity")
    args = parser.parse_args(argv)
    if args.table in CHECKS:
        print(checks(json.loads((args.folder / CHECKS[args.table]).read_text())))
    elif args.table == "protocol":
        print(protocol_table())
    elif args.table == "track":
        path = args.folder / "track.json"
        print(track_table(json.loads(path.read_text())) if path.is_file() else
              "No run yet: `python -m tools.parity.track` (the commands above) writes `track.json`.")
    elif args.table == "end-to-end":
        print(end_to_end_table(json.loads((args.folder / "end_to_end.json").read_text())))
    else:
        print(timing_table(json.loads((args.folder / "timing.json").read_text())))


if __name__ == "__main__":
    main()
