"""``runner.py adapt``: adapters fitted and measured on the user's own embeddings (docs/adapters.md): every setting,
and with ``--resume`` every record an earlier study left, is checked before the files are read, the files before any
adapter is fitted; :mod:`cl2r_bench.adapter_study.driver` then fits, measures, records and exports."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cl2r_bench.distributed import processes_note
from cl2r_bench.errors import UsageError, writable_folder

if TYPE_CHECKING:
    import torch

    from cl2r_bench.distributed import Processes


def command_adapt(args: argparse.Namespace) -> int:
    """Fit and measure adapters on the user's embeddings (:mod:`cl2r_bench.adapter_study`): every setting, and with
    ``--resume`` every record an earlier run left, is checked before the files are read, the files before any
    adapter is fitted. Under torchrun the processes share the
    streamed splits' passes (docs/scale-out.md), and rank 0 prints and writes."""
    from benchmarks.ranking import screen_problem
    from cl2r_bench.adapter_study import adapt_settings
    from cl2r_bench.adapter_study.embeddings import AUTO_STREAM_BYTES, stream_rows_for
    from cl2r_bench.app.assembly import load_plugins, resolve_device
    from cl2r_bench.distributed import connect, leave, place

    load_plugins(args.plugin)
    settings = adapt_settings(args.set if args.queries is None else [*args.set, f"model_update.queries={args.queries}"])
    asked = settings["stream_rows"]
    settings["stream_rows"] = stream_rows_for(args.test, asked, settings["unseen_classes"])
    settings["plugins"] = [str(Path(path).resolve()) for path in args.plugin]
    launch = settings["distributed"]
    processes, device = place(launch, resolve_device(args.device))
    if asked == "auto" and settings["stream_rows"] is not None and processes.is_main:
        print(f"{args.test}: its old.npy and new.npy exceed {AUTO_STREAM_BYTES // 2**20} MiB, so they are streamed "
              f"{settings['stream_rows']} rows at a time (model_update.stream_rows=auto; null reads them into memory)",
              file=sys.stderr if args.json else sys.stdout)
    if settings["screen"] and screen_problem(device):
        raise UsageError(screen_problem(device))
    if processes.distributed and settings["stream_rows"] is None:
        raise UsageError("under torchrun, adapt shares a streamed test split's passes between the processes: add "
                         "--set model_update.stream_rows=65536 (with a folder of .npy files); in memory, run adapt "
                         "in one process")
    connect(processes, launch, device, trains=False)
    try:
        return adapt_study(args, settings, processes, device)
    finally:
        leave()


def adapt_study(args: argparse.Namespace, settings: dict[str, Any], processes: Processes,
                device: torch.device) -> int:
    """:func:`command_adapt` once its processes are placed and connected."""
    from benchmarks.adapted_cases import Scoring
    from cl2r_bench.adapter_study import adapt_config, finished_records, study_from_embeddings
    from cl2r_bench.adapter_study.driver import Protocol, StudyRun, drive
    from cl2r_bench.adapters import list_adapters, make_adapter, unpaired_adapters
    from cl2r_bench.app.assembly import check_pairing
    from cl2r_bench.errors import safe_name
    from cl2r_bench.reporting.adapter_answer import summary_json, summary_text

    say = print if processes.is_main else (lambda *_, **__: None)
    args.output = settings["output"] if args.output is None else args.output
    args.seeds = args.seeds or [settings["seed"]]
    writable_folder(args.output, "--output")
    if args.export is not None:
        writable_folder(args.export, "--export")
        if args.resume:
            raise UsageError("--resume keeps finished records without their fitted adapters, so --export would have "
                             "nothing to write for them: export in a run without --resume")
    if args.train_old is not None:
        settings["pairing"] = "unpaired"
    names = adapter_names(args.adapter, list_adapters(),
                          unpaired_adapters() if settings["pairing"] == "unpaired" else None)
    for name in names:
        if name != "none":
            check_pairing(name, settings["pairing"])
            settings["adapter_params"][name] = make_adapter(name, settings["adapter_params"]).parameters_used()
            if args.export is not None:
                writable_folder(Path(args.export) / name, "--export")
    train = fitting_input(args, settings)
    study_name = safe_name(args.name or Path(args.train or args.train_old).stem, "--name")
    configs = {(name, seed): adapt_config(train, args.test, name, seed, settings)
               for name in names for seed in args.seeds}
    folders = {key: Path(args.output) / "adapt" / study_name / key[0] / f"seed{key[1]}" for key in configs}
    kept = processes.decided_on_main(lambda: finished_records(folders, configs)) if args.resume else {}
    study = study_from_embeddings(train, args.test, settings["stream_rows"], processes,
                                  progress=not args.no_progress, unseen_classes=settings["unseen_classes"])
    study.pairing = settings["pairing"]
    study.to(device)
    if not args.json:
        fitting = (f"fitting without pairs on the old embeddings of {study.about['train_old_items']} items and the new "
                   f"of {study.about['train_new_items']} others" if "train_old_items" in study.about else
                   f"fitting on {study.about['train_items']} items")
        say(f"{study_name}: {fitting}, evaluating on "
            f"{study.about['test_items']} (old {study.about['old_dim']}-d, new {study.about['new_dim']}-d)"
            f"{processes_note(processes.world_size)}")
    runs = [StudyRun(name, seed, folders[name, seed], configs[name, seed]) for name in names for seed in args.seeds]
    protocol = Protocol("adapt", study_name, settings["adapter_params"], settings["backfill_orders"],
                        settings["backfill_steps"], Scoring.of(settings["study"]), device)
    export = None if args.export is None else Path(args.export)
    records = []
    for driven in drive(study, runs, protocol, kept=kept, export=export):
        records.append(driven.record)
        print_result(driven.result, kept=driven.kept, as_json=args.json)
        if driven.exported and not args.json:
            print(f"   exported {driven.run.adapter} to {driven.exported[0].parent} "
                  f"({', '.join(p.name for p in driven.exported)})")
    if not processes.is_main:
        return 0
    if args.json:
        print(json.dumps(summary_json(records), allow_nan=False))
        return 0
    print(f"\n{summary_text(records)}")
    print(f"\nrecords: {Path(args.output) / 'adapt' / study_name}; next: python runner.py leaderboard --results "
          f"{args.output}")
    return 0


def fitting_input(args: argparse.Namespace, settings: dict[str, Any]) -> str | tuple[str, str]:
    """``--train``, or ``(--train-old, --train-new)``: the embeddings of different items, which fit only without
    pairs (``model_update.pairing`` is ``unpaired`` with them); one line for an incomplete or contradictory pair."""
    if args.train_old is None:
        if args.train_new is not None:
            raise UsageError("--train-new goes with --train-old (the old model's embeddings of other items)")
        return args.train
    if args.train_new is None:
        raise UsageError("--train-old needs --train-new: the new model's embeddings of other items")
    if settings["unseen_classes"]:
        raise UsageError("model_update.unseen_classes draws classes out of a labelled --train; --train-old and "
                         "--train-new have no labels: leave it 0")
    return args.train_old, args.train_new


def adapter_names(asked: list[str], registered: list[str], usable: list[str] | None = None) -> list[str]:
    """The adapters of ``adapt --adapter``: 'all' is none and every registered adapter (of ``usable`` when given:
    those the study's pairing can fit); each name once, in order; an unknown name is one line listing the valid
    ones."""
    names: list[str] = []
    for name in asked:
        for one in ["none", *(registered if usable is None else usable)] if name == "all" else [name]:
            if one != "none" and one not in registered:
                raise UsageError(f"--adapter: unknown adapter {one!r}; choose from none, all, {', '.join(registered)}")
            if one not in names:
                names.append(one)
    return names


def print_result(result: dict[str, Any], *, kept: bool, as_json: bool) -> None:
    """One adapter and seed of ``runner.py adapt`` as it is measured or ``kept`` (``--resume``): its case lines, or
    its JSON line, and the warning of a fit that did not converge."""
    from cl2r_bench.adapter_study import result_json
    from cl2r_bench.adapters import convergence_note

    name, seed = result["adapter"], result["seed"]
    if as_json:
        print(json.dumps({**result_json(result), **({"kept": True} if kept else {})}, allow_nan=False))
    else:
        print(case_line(name, seed, result["cases"], result["backfilling"]["auc"], result["zero_shot"]))
        if kept:
            print("   kept: measured by an earlier run with the same settings (--resume)")
    note = convergence_note(name, result["fit"], f" (seed {seed})")
    if note:
        print(note, file=sys.stderr if as_json else sys.stdout)


def case_line(adapter: str, seed: int, cases: dict[str, Any], auc: dict[str, Any], zero_shot: Any) -> str:
    """One adapter and seed in two lines: top-1 / mAP (%) of each leave-one-out case it produces, its backfilling
    AUCs and the zero-shot change."""
    precision = "mAP" if all(v["mAP"] is not None for v in cases.values() if v) else "mAP@R"
    scores = "  ".join(f"{case} {v['top1']:.2f}/{v[precision]:.2f}" for case, v in cases.items() if v)
    areas = "  ".join(f"{order} {v['top1_auc']:.2f}/{v[precision + '_auc']:.2f}" for order, v in auc.items() if v)
    zs = f"  ZS {zero_shot['change']:+.2f} points" if zero_shot else ""
    return (f"   {adapter} seed {seed}: top-1/{precision} %  {scores}\n"
            f"   backfill AUC top-1/{precision} %  {areas or '-'}{zs}")
