"""``runner.py run`` (the default command): each asked run (one per seed), its console lines as it ends, then the
leaderboard of what ran, the adapter studies' answers and what to do next."""
from __future__ import annotations

import argparse
import sys
from typing import Any

from cl2r_bench.app.stops import exit_code, stop_name
from cl2r_bench.reporting.tables import figure_or_na


def command_run(args: argparse.Namespace) -> int:
    """Run each asked configuration (one per seed); under torchrun every process runs them together and rank 0
    prints (:mod:`cl2r_bench.distributed`)."""
    from cl2r_bench.app.adapt_command import case_line
    from cl2r_bench.app.feature_run import start_run
    from cl2r_bench.app.run_options import requested_runs
    from cl2r_bench.app.sweep import distinct_runs
    from cl2r_bench.distributed import leave, processes_note
    from cl2r_bench.reporting.leaderboard import tables

    try:
        parts = distinct_runs(requested_runs(args))
        runs = [start_run(part, resume=args.resume, overwrite=args.overwrite) for part in parts]
        say = print if runs[0].main else (lambda *_, **__: None)
        records = []
        for run in runs:
            settings = run.settings
            say(f"== {settings.scenario} / {settings.dataset} / {run.parts.label} / seed {settings.seed} (preset "
                f"{settings.preset}, device {run.device}{processes_note(run.processes.world_size)}) -> {run.dir}")
            try:
                record = run.execute()
            except KeyboardInterrupt as stop:
                print(f"\nstopped ({stop_name(stop)}): finished tasks are saved in {run.dir}; continue with the same "
                      "command and --resume", file=sys.stderr)
                return exit_code(stop)
            if "retrieval" in record:
                r = record["retrieval"]
                say(case_line(settings.adapter.name, settings.seed, r["cases"], r["backfilling"]["auc"],
                              r["zero_shot"]))
            if "two_model" in record:
                say(two_model_line(record["two_model"]))
            if record.get("protocol") == "leave_one_out":
                records.append(record)
                continue
            m, noise = record["metrics"], record.get("noise")
            say(f"   AC {m['AC']:.3f}  AA {m['AA']:.2f}  ACA {figure_or_na(m['ACA'])}  BC {figure_or_na(m['BC'])}  "
                f"FC {figure_or_na(m['FC'])}  -> {run.dir / 'metrics.json'}")
            if noise:
                low, high = noise["AC_interval"]
                say(f"   AC {noise['confidence']:.0%} interval [{low:.3f}, {high:.3f}], outside noise "
                    f"{figure_or_na(noise['AC_outside_noise'], 3)} ({noise['within_noise']} of {noise['pairs']} pairs "
                    f"within noise, {noise['queries']} queries)")
            records.append(record)
        say()
        say(tables(records))
        say(study_answers(records))
        say(what_next(runs))
        return 0
    finally:
        leave()


def two_model_line(two_model: dict[str, Any]) -> str:
    """The two-model protocol's cases (top-1 / top-5 / mAP in percent) and negative flip rates in one line."""
    cases = "  ".join(f"{case} {c['top1']:.2f}/{c['top5']:.2f}/{c['mAP']:.2f}"
                      for case, c in two_model["cases"].items() if c)
    flips, classifier = two_model["negative_flips"], two_model.get("classification")
    line = (f"   two-model top-1/top-5/mAP %  {cases}  NFR self {100 * flips['mean_self']:.2f}% "
            f"cross {100 * flips['mean_cross']:.2f}%")
    return line + (f"  classifier NFR {100 * classifier['nfr']:.2f}%" if classifier else "")


def study_answers(records: list[dict[str, Any]]) -> str:
    """The summary and recommendation of each data set's adapter studies
    (:mod:`cl2r_bench.reporting.adapter_recommendation`), or
    nothing for runs without one."""
    from benchmarks.record import adapter_study
    from cl2r_bench.reporting.adapter_answer import summary_text

    studies: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        if adapter_study(record):
            studies.setdefault(record["dataset"], []).append(record)
    return "".join(f"\n{dataset}:\n{summary_text(group)}\n" for dataset, group in studies.items())


def what_next(runs: list[Any]) -> str:
    """The closing lines of a run command: where the figures are (when drawn, ``evaluation.plots``), the next
    commands, and on the generated data set what its numbers do and do not show."""
    output = runs[0].settings.output
    drawn = [run for run in runs if run.settings.evaluation.plots]
    lines = [""]
    if drawn:
        lines.append(f"figures: {drawn[-1].dir}/*.png" + (f" (and in the other {len(drawn) - 1} run folders)"
                                                          if len(drawn) > 1 else ""))
    lines.append(f"next: python runner.py leaderboard --results {output}  (one row per experiment);  python "
                 f"runner.py plot {output}  (comparison figures)")
    if runs[0].settings.dataset == "synthetic":
        lines.append("note: on the generated data these numbers show that the pipeline runs end to end, not the "
                     "papers' results (README, 'What the demo's numbers show')")
    return "\n".join(lines)
