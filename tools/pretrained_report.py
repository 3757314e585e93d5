"""Tables and a figure of the pretrained-encoder study (``results/pretrained/``, docs/METHODS.md §7b), from its
records alone.

Per pair of encoders and data set: the retrieval cases in the λ-orth paper's layout (rows: adapters; columns:
query/gallery cases; cells: CMC top-1 / mAP in percent, mean over seeds, with the seed std of top-1), the
backfilling AUCs per order, zero-shot retention and fit times; then the paper's own Table 1b and Table 2 rows,
marked as other models and data. The figure draws the backfilling curves (top-1 and mAP against β, λ-orth's
class-mean order, mean over seeds) of every adapter.

    python -m tools.pretrained_report [--results results/pretrained] [--out results/pretrained]
    python -m tools.pretrained_report --results results/pretrained --group lite0-lite2/tinyimagenet [--table answer]

``tables.md`` is a result page: its tables are one generated block whose marker names ``--print``, the same tables
on stdout, so ``python runner.py pages FOLDER/tables.md --check`` tells whether it still matches the records (run
from the repository's root with a relative ``--results``). ``--group PAIR/DATASET`` prints one group's section
instead (PAIR: the folders above ``model_update``, as in the section's heading), ``--table`` one of its tables
(``answer``: the summary and recommendation of :mod:`cl2r_bench.reporting.adapter_recommendation`, as ``runner.py
adapt`` gives them; ``cases``; ``backfilling``), or, without a group, ``--table published`` the papers' rows; a page
embeds them as generated blocks. Printing writes nothing.
"""
from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.record import PAPER_CASES, checked_records, leave_one_out, update_fit
from cl2r_bench.reporting.adapter_answer import classes_line
from cl2r_bench.reporting.adapter_recommendation import (
    SUMMARY_COLUMNS,
    models_line,
    models_verdict,
    ranked,
    recommendation,
    summarise,
    summary_cells,
)
from cl2r_bench.reporting.published import LAMBDA_ORTH_SOURCE, LAMBDA_ORTH_TABLE_1B, LAMBDA_ORTH_TABLE_2
from tools.pretrained_study import BACKFILL_ORDERS

Group = tuple[str, str]


def grouped(results: Path, only: Group | None = None) -> dict[Group, dict[str, list[dict[str, Any]]]]:
    """Leave-one-out records by (the folders above ``model_update``, e.g. ``open-set/fit-20/lite0-lite2``, and the
    data set), then by adapter label; ``only``: that group's folder alone is read."""
    groups: dict[Group, dict[str, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    folder = results if only is None else results / only[0] / "model_update" / only[1]
    for path, record, _ in checked_records(folder):
        if record is not None and leave_one_out(record):
            parts = path.relative_to(results).parts
            pair = "/".join(parts[:parts.index("model_update")])
            groups[pair, record["dataset"]][record["method"]].append(record)
    return groups


def mean_std(values: list[float]) -> tuple[float, float] | None:
    """Mean and seed std (ddof 1); the std is 0 where every seed gave the same value (a case no seed changes)."""
    if not values:
        return None
    varies = len(values) > 1 and float(np.ptp(values)) > 1e-9
    return float(np.mean(values)), float(np.std(values, ddof=1)) if varies else 0.0


def case_cell(runs: list[dict[str, Any]], case: str) -> str:
    top1 = mean_std([r["retrieval"]["cases"][case]["top1"] for r in runs if r["retrieval"]["cases"].get(case)])
    mAP = mean_std([r["retrieval"]["cases"][case]["mAP"] for r in runs if r["retrieval"]["cases"].get(case)])
    if top1 is None:
        return "-"
    return f"{top1[0]:.2f} / {mAP[0]:.2f}" + (f" (±{top1[1]:.2f})" if top1[1] > 0 else "")


def auc_cell(runs: list[dict[str, Any]], order: str) -> str:
    areas = [r["retrieval"]["backfilling"]["auc"].get(order) for r in runs]
    areas = [a for a in areas if a]
    if not areas:
        return "-"
    return f"{np.mean([a['top1_auc'] for a in areas]):.2f} / {np.mean([a['mAP_auc'] for a in areas]):.2f}"


def zero_shot_cell(runs: list[dict[str, Any]]) -> str:
    shots = [r["retrieval"]["zero_shot"] for r in runs if r["retrieval"].get("zero_shot")]
    if not shots:
        return "-"
    change = mean_std([z["change"] for z in shots])
    spread = f" ± {change[1]:.2f}" if change[1] > 0 else ""
    return f"{np.mean([z['before'] for z in shots]):.2f} -> {np.mean([z['after'] for z in shots]):.2f} " \
           f"({change[0]:+.2f}{spread})"


def fit_cell(runs: list[dict[str, Any]]) -> str:
    """Mean fit seconds; for a learned adapter also its mean steps and how many of its fits converged."""
    seconds = f"{np.mean([r['timings']['adapter_fit_seconds'] for r in runs]):.1f}"
    fits = [update_fit(r) for r in runs]
    if not all("steps" in f for f in fits):
        return seconds
    return (f"{seconds} ({np.mean([f['steps'] for f in fits]):.0f} steps, converged "
            f"{sum(bool(f['converged']) for f in fits)}/{len(fits)})")


def answer(by_adapter: dict[str, list[dict[str, Any]]]) -> str:
    """The study's answer (:mod:`cl2r_bench.reporting.adapter_recommendation`): its table, best top-1 gain first, the
    lines on the models and the classes, and the recommendation, as ``runner.py adapt`` gives them."""
    records = [r for runs in by_adapter.values() for r in runs]
    rows, verdict = ranked(summarise(records)), models_verdict(records)
    notes = "".join(f"\n\n{line[0].upper()}{line[1:]}." for line in (models_line(verdict), classes_line(records))
                    if line)
    return (table(list(SUMMARY_COLUMNS), [summary_cells(r) for r in rows]) + notes
            + f"\n\n**Recommendation:** {recommendation(rows, verdict)}")


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def group_tables(pair: str, dataset: str, by_adapter: dict[str, list[dict[str, Any]]], only: str | None = None) -> str:
    """The group's section (its heading, its setting, :func:`answer`, the cases and the backfilling table), or with
    ``only`` (``answer``, ``cases`` or ``backfilling``) that one table."""
    names = sorted(by_adapter, key=lambda n: (n != "none", n))
    first = by_adapter[names[0]][0]
    models = first["models"]
    about = (f"`{models['old']['spec']}` ({models['old']['feature_dim']}-d) -> `{models['new']['spec']}` "
             f"({models['new']['feature_dim']}-d); fitted on {first['retrieval']['fitting_items']} train images, "
             f"{first['retrieval']['queries']} test images as query and gallery; seeds per row: "
             f"{', '.join(f'{n} {len(by_adapter[n])}' for n in names)}")
    cases = table(["adapter", *PAPER_CASES], [[n, *(case_cell(by_adapter[n], c) for c in PAPER_CASES)]
                                               for n in names])
    backfill = table(["adapter", *(f"AUC {o}" for o in BACKFILL_ORDERS), "zero-shot top-1 (change)", "fit s"],
                     [[n, *(auc_cell(by_adapter[n], o) for o in BACKFILL_ORDERS), zero_shot_cell(by_adapter[n]),
                       fit_cell(by_adapter[n])] for n in names])
    if only is not None:
        return {"answer": answer(by_adapter), "cases": cases, "backfilling": backfill}[only] + "\n"
    return (f"### {pair}, {dataset}\n\n{about}\n\n{answer(by_adapter)}\n\n"
            f"CMC top-1 / mAP (%), mean over seeds (± seed std of top-1, where the seeds differ):\n\n"
            f"{cases}\n\nBackfilling AUC top-1 / mAP (%), zero-shot ImageNet-1k top-1 of the new encoder before -> "
            f"after B (change in points), mean adapter fit time (steps and converged fits of a learned adapter):\n\n"
            f"{backfill}\n")


def published_tables() -> str:
    t1 = LAMBDA_ORTH_TABLE_1B
    rows = [[name, *(f"{v[0]:.2f} / {v[1]:.2f}" if (v := cells.get(c)) else "-" for c in PAPER_CASES),
             f"{cells['auc'][0]:.2f} / {cells['auc'][1]:.2f}" if "auc" in cells else "-"]
            for name, cells in t1["rows"].items()]
    t2 = LAMBDA_ORTH_TABLE_2
    rows2 = [[name, *(f"{cells[c]:.2f}" if c in cells else "-" for c in PAPER_CASES),
              f"{cells['ZS']:+.3f}" if "ZS" in cells else "-"] for name, cells in t2["rows"].items()]
    return (f"### Published (other models and data: {LAMBDA_ORTH_SOURCE})\n\n{t1['setting']}, top-1 / mAP (%):\n\n"
            + table(["adapter", *PAPER_CASES, "backfill AUC"], rows)
            + f"\n\n{t2['setting']}:\n\n" + table(["adapter", *PAPER_CASES, "ZS"], rows2) + "\n")


def curves_figure(groups: dict[Group, dict[str, list[dict[str, Any]]]], path: Path,
                  order: str = "class_mean_distance") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = sorted(groups)
    fig, axes = plt.subplots(len(keys), 2, figsize=(11, 3.2 * len(keys)), squeeze=False)
    for row, key in zip(axes, keys, strict=True):
        for name, runs in sorted(groups[key].items()):
            curves = [r["retrieval"]["backfilling"]["curves"].get(order) for r in runs]
            curves = [c for c in curves if c]
            if not curves:
                continue
            betas = runs[0]["retrieval"]["backfilling"]["betas"]
            for ax, score in zip(row, ("top1", "mAP"), strict=True):
                ax.plot(betas, np.mean([c[score] for c in curves], axis=0), label=name,
                        linestyle="--" if name == "none" else "-")
        for ax, score in zip(row, ("CMC top-1 (%)", "mAP (%)"), strict=True):
            ax.set_title(f"{key[0]}, {key[1]}: {score}", fontsize=9)
            ax.set_xlabel("backfilled fraction β (class-mean L2 order)")
            ax.grid(alpha=0.3)
        row[1].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


TABLES = ("answer", "cases", "backfilling", "published")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", default="results/pretrained")
    parser.add_argument("--out", default=None, help="folder of tables.md and backfilling.png (default --results)")
    parser.add_argument("--print", action="store_true", help="print the tables of tables.md; write nothing")
    parser.add_argument("--group", default=None, help="PAIR/DATASET: print this group's section; write nothing")
    parser.add_argument("--table", choices=TABLES, default=None,
                        help="print this table of --group (published: the papers' rows, no group); write nothing")
    args = parser.parse_args(argv)
    results = Path(args.results)
    if args.table == "published":
        print(published_tables(), end="")
        return 0
    if args.table and not args.group:
        parser.error(f"--table {args.table} needs --group PAIR/DATASET")
    only = tuple(args.group.rsplit("/", 1)) if args.group else None
    if only is not None and len(only) != 2:
        parser.error("--group is PAIR/DATASET, e.g. lite0-lite2/tinyimagenet")
    groups = grouped(results, only)
    if not groups or (only is not None and only not in groups):
        print(f"no leave-one-out records under {results}" + (f" in group {args.group}" if only else "")
              + "; run python -m tools.pretrained_study first")
        return 2
    if only is not None:
        print(group_tables(*only, groups[only], args.table), end="")
        return 0
    text = "\n".join(group_tables(pair, dataset, groups[pair, dataset]) for pair, dataset in sorted(groups)) \
        + "\n" + published_tables()
    if args.print:
        print(text, end="")
        return 0
    out = Path(args.out or results)
    command = f"python -m tools.pretrained_report --results {results.as_posix()} --print"
    (out / "tables.md").write_text("# Pretrained-encoder study: tables\n\nWritten by `python -m "
                                   "tools.pretrained_report` from the records under this folder; `python runner.py "
                                   "pages` rewrites it from them, `--check` tells whether it still matches.\n\n"
                                   f"<!-- generated by: {command} -->\n\n{text.strip()}\n\n<!-- end generated -->\n")
    curves_figure(groups, out / "backfilling.png")
    print(f"wrote {out / 'tables.md'} and {out / 'backfilling.png'} ({len(groups)} pair and data set groups)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
