"""End-to-end parity on the pretrained-backbone track (results/parity/README.md §12): each strategy of the BCT line
trained by its authors' own code and by the suite, on the same cached features, upgrade split, seeds and recipe.

    python -m tools.parity.track --references REF --data-root data --work WORK [--strategies lce bct ...] \\
        [--seeds 1 2 3] [--reference-python REF/venv/bin/python] [--suite-output results] \\
        [--out results/parity/track.json] [--epochs N] [--set KEY=VALUE ...] [--variant KEY=VALUE ...]

For each strategy and seed, in ``WORK/<strategy>/seed<K>/``, each step kept and skipped when the script runs again:

1. **The suite's run**: ``runner.py run --scenario upgrade --strategy S --preset pretrained --seed K --set
   seed_scope=split --set training.recipe=authors`` (plus the ``--set`` options), into ``--suite-output``; a
   complete record there is reused. It pretrains and caches the old model that both codes start from.
2. **Export**: the same settings assembled as the run assembles them give the split (the items of every class, each
   the frozen encoders' cached features side by side, the test items), the cached old model (its embedding network
   and classifier) and, for BT², the independent new model; ``data.pt`` holds them for the reference's Python.
3. **The authors' run**: ``track_reference.py`` under the reference's Python drives their own training loop
   (``track_<reference>.py``: their model around the suite's embedding network, their loss, trainer and recipe)
   and writes their trained model's features of the test items (``reference.pt``).
4. **Evaluation**: the suite's two-model protocol (``scenarios/upgrade.py``'s ``two_model_study``) on the old model's
   features, embedded as the suite's run embeds them, and the authors' model's; ``record.json``.

The parity record (``--out``) keeps, per strategy and seed, both codes' two-model figures, per-query top-1 hits and
split identifiers (so that ``runner.py compare``'s paired interval can be computed from it, ``tables.py track``),
the suite's commit of each run and the reference's repository and commit. A code whose run diverged (the suite's
exit 3; the authors' model's features not finite) is recorded as such for that seed, with its one-line reason; the
table pairs the seeds both codes trained and names the others. ``--epochs N`` is a smoke run: both codes
train N epochs of the authors' recipe (the suite with that recipe written out as ``training`` settings); with it or
with ``--set`` (e.g. the synthetic stand-in of the tests) the record goes to ``WORK/track.json`` unless ``--out`` is
given. ``--variant KEY=VALUE`` sets the strategy's own setting ``strategy_params.<strategy>.KEY`` on the suite's
side only: the authors' run of the same strategy and seed in ``WORK`` is reused, the suite's run goes to
``SUITE_OUTPUT/variants/<KEY>-<VALUE>/`` and the record keeps it as ``<strategy> [KEY=VALUE]`` beside the default's
row (e.g. ``bct [new_class_rows=none]``: the old classes alone, as the reference's BCT). A wrong checkout path or
variant is a one-line error (exit 2).
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
import torch.nn.functional as F

from tools.parity.common import ROOT, ParityError, provenance, reference_checkout, reference_python

REFERENCES = ("lce", "advbct", "bt2", "ract", "oca", "mixbct")
"""The references, each described and driven by ``tools/parity/track_<name>.py``."""
SUITE_RUN = ["--scenario", "upgrade", "--preset", "pretrained", "--set", "seed_scope=split"]
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "CUDA_VISIBLE_DEVICES")
TWO_MODEL_FIELDS = ("cases", "query_top1", "queries", "queries_without_match", "unmatched_queries")


def reference_module(name: str) -> ModuleType:
    """``tools/parity/track_<name>.py``: its ``REPOSITORY``, ``MARKER``, ``STRATEGIES``, ``ENTRY_POINT``, ``train``."""
    return importlib.import_module(f"tools.parity.track_{name}")


def strategy_references() -> dict[str, str]:
    """Each strategy the track's parity covers -> the reference that trains it."""
    return {strategy: name for name in REFERENCES for strategy in reference_module(name).STRATEGIES}


def recipe_settings(strategy: str, epochs: int | None) -> list[str]:
    """The ``--set`` options of the suite's side: its authors' recipe (``training.recipe=authors``), or, for a smoke
    run of ``epochs`` epochs, that recipe written out as the run's own training settings."""
    from strategies import get_strategy

    if epochs is None:
        return ["--set", "training.recipe=authors"]
    recipe = {**get_strategy(strategy).authors_recipe, "epochs": epochs}
    return [option for key, value in recipe.items() for option in ("--set", f"training.{key}={json.dumps(value)}")]


def suite_arguments(strategy: str, seed: int, args: argparse.Namespace) -> list[str]:
    """``runner.py``'s arguments of the suite's run of ``strategy`` at ``seed`` (a variant's in its own folder)."""
    output = args.suite_output
    if args.variant:
        output = output / "variants" / variant_name(args.variant)
    variant = [f"strategy_params.{strategy}.{assignment}" for assignment in args.variant]
    return ["run", *SUITE_RUN, "--strategy", strategy, "--seed", str(seed), "--data-root", str(args.data_root),
            "--output", str(output), "--no-progress", *recipe_settings(strategy, args.epochs),
            *[option for assignment in [*args.set, *variant] for option in ("--set", assignment)]]


def variant_name(variant: list[str]) -> str:
    """A variant's settings as a name of files and folders (``KEY-VALUE+KEY-VALUE``)."""
    return "+".join(assignment.replace("=", "-") for assignment in variant)


def record_key(strategy: str, variant: list[str]) -> str:
    """The record's key of ``strategy``'s runs: its name, then its variant's settings in brackets."""
    return strategy + "".join(f" [{assignment}]" for assignment in variant)


def assembled(arguments: list[str]):
    """The suite's run as ``runner.py`` assembles it from ``arguments`` (:class:`cl2r_bench.app.assembly.Assembly`)."""
    from cl2r_bench.app.arguments import build_parser
    from cl2r_bench.app.run_options import requested_runs
    from cl2r_bench.errors import ConfigError, PartError, UsageError

    try:
        return requested_runs(build_parser().parse_args(arguments))[0]
    except (ConfigError, PartError, UsageError) as exc:
        raise ParityError(f"the suite's run: {exc}") from None


def suite_run(arguments: list[str], parts, folder: Path, name: str = "suite") -> dict[str, Any]:
    """The suite's record of the run, from ``--suite-output`` (its settings checked as ``--resume`` checks them)
    or run now (resumed if a run stopped there; its output in ``folder/<name>.log``); a run that diverged (exit 3)
    is ``{"seed", "diverged": its one-line error, "commit"}``, kept in ``folder/<name>_diverged.json`` and not run
    again."""
    from benchmarks.record import RECORD_FILE, holds_complete_record, read_record
    from cl2r_bench.app.cli import EXIT_DIVERGED
    from cl2r_bench.app.run_folder import RunError, RunFolder
    from cl2r_bench.files import code_commit

    path = parts.directory / RECORD_FILE
    if path.is_file():
        try:
            RunFolder(parts.directory, resume=True, overwrite=False).check_resumable(parts.config)
        except RunError as exc:
            raise ParityError(f"the suite's run in {parts.directory} has other settings: {exc}") from None
    diverged, log_path = folder / f"{name}_diverged.json", folder / f"{name}.log"
    if diverged.is_file():
        return json.loads(diverged.read_text())
    if not holds_complete_record(parts.directory):
        resume = ["--resume"] if path.is_file() else []
        with open(log_path, "w") as log:
            done = subprocess.run([sys.executable, str(ROOT / "runner.py"), *arguments, *resume], cwd=ROOT,
                                  stdout=log, stderr=subprocess.STDOUT)
        if done.returncode == EXIT_DIVERGED:
            run = {"seed": parts.settings.seed, "diverged": last_error(log_path), "commit": code_commit()}
            diverged.write_text(json.dumps(run, indent=1) + "\n")
            return run
        if done.returncode != 0:
            raise ParityError(f"the suite's run failed (exit {done.returncode}); see {log_path}")
    return read_record(path)


def last_error(log: Path) -> str:
    """What diverged, from the suite's one-line error at the end of its log (``error: task T diverged: ...; tasks
    kept in FOLDER, ...``): its first clause, which names no folder of this machine."""
    lines = [line for line in log.read_text().splitlines() if line.startswith("error: ")]
    return lines[-1].removeprefix("error: ").split("; ")[0] if lines else f"diverged (see the seed's {log.name})"


def export(parts, folder: Path, needs_independent: bool) -> dict[str, Any]:
    """``folder/data.pt`` (module docstring, step 2); returns the split's identifiers and the old model's features
    of the test items, embedded as the suite's run embeds them."""
    from cl2r_bench.app.starting_models import task_inputs
    from cl2r_bench.models import embed
    from scenarios.upgrade import test_split

    scenario, settings = parts.scenario, parts.settings
    stream = scenario.stream()
    starting = scenario.starting_models(stream, parts.head, parts.device, print)
    old = parts.new_model(stream.tasks[0].num_seen_classes, stream.mean, stream.std,
                          **task_inputs(parts, stream, starting, 0))
    scenario.load_starting_model(old, starting[0]["path"])
    old.eval()
    test = test_split(stream)
    train = stream.tasks[1].train
    train = train.select(torch.argsort(train.labels, stable=True))  # class by class, as MixBCT's tools read it
    model = settings.model
    data = {"train_items": train.images.cpu(), "train_labels": train.labels.cpu(),
            "test_items": test.images.cpu(), "classes": stream.tasks[1].num_seen_classes,
            "old_classes": stream.tasks[0].num_seen_classes, "batch_size": settings.training.batch_size,
            "embedding": {"width": model.embedding_width, "out_dim": model.embedding_dim,
                          "new_columns": task_inputs(parts, stream, starting, 1)["columns"]},
            "old": frozen(old)}
    if needs_independent:
        path = scenario.independent_models(stream, starting, parts.device, print)[1]
        independent = parts.independent_model(stream.tasks[1].num_seen_classes, stream.mean, stream.std,
                                              columns=data["embedding"]["new_columns"])
        scenario.load_starting_model(independent, path)
        data["independent"] = frozen(independent)
    torch.save(data, folder / "data.pt")
    with torch.no_grad():
        old_features = embed(old.to(parts.device), test.images.to(parts.device),
                             batch_size=settings.evaluation.batch_size, amp=settings.training.autocast).cpu()
    return {"old_features": old_features, "labels": test.labels.cpu(),
            "stream": {"class_order": stream.class_order},
            "evaluation": {"query_sha256": stream.query.digest(), "gallery_sha256": stream.gallery.digest()}}


def frozen(model) -> dict[str, Any]:
    """A suite model's embedding network (weights and columns) and classifier rows, for the reference's side."""
    return {"backbone": {k: v.cpu() for k, v in model.backbone.state_dict().items()},
            "columns": model.backbone.columns, "classifier": model.head.classifier.weight.detach().cpu()}


def reference_run(args: argparse.Namespace, name: str, strategy: str, seed: int, folder: Path) -> dict[str, Any]:
    """``track_reference.py`` under the reference's Python (module docstring, step 3); ``reference.pt``."""
    command = [str(args.python[name]), str(Path(__file__).with_name("track_reference.py")), "--reference", name,
               "--checkout", str(args.checkouts[name]), "--work", str(folder), "--strategy", strategy,
               "--seed", str(seed)] + (["--epochs", str(args.epochs)] if args.epochs else [])
    env = {"PATH": "/usr/bin:/bin", "HOME": str(folder), **{k: v for k, v in os.environ.items()
                                                           if k in THREAD_VARIABLES}}
    with open(folder / "reference.log", "w") as log:
        done = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=folder)
    if done.returncode != 0:
        raise ParityError(f"the authors' run of {strategy} (seed {seed}) failed (exit {done.returncode}); see "
                          f"{folder / 'reference.log'}")
    return torch.load(folder / "reference.pt", weights_only=False)


def evaluated(parts, split: dict[str, Any], reference: dict[str, Any], commit: str) -> dict[str, Any]:
    """The authors' model scored by the suite's two-model protocol (module docstring, step 4), as a record's fields;
    a model whose features are not finite (their loop diverged) is ``{"seed", "diverged", "commit", ...}``."""
    from scenarios.upgrade import TWO_MODEL_CASES, two_model_study

    timing = {key: reference[key] for key in ("train_seconds", "device")}
    if not torch.isfinite(reference["test_features"]).all():
        return {"seed": parts.settings.seed, "diverged": "their trained model's features are not finite (their "
                "loss went NaN or infinite; see the seed's reference.log)", "commit": commit, **timing}
    new = F.normalize(reference["test_features"].float(), dim=1)
    study = two_model_study(split["old_features"], new, split["labels"], parts.settings)
    two_model = {**study, "cases": {case: study["cases"][case] for case in TWO_MODEL_CASES}}
    return comparable({"seed": parts.settings.seed, "stream": split["stream"], "evaluation": split["evaluation"],
                       "two_model": two_model, **timing}, commit)


def run_strategy(args: argparse.Namespace, strategy: str, seed: int) -> dict[str, dict[str, Any]]:
    """Both codes' runs of ``strategy`` at ``seed`` (module docstring), each step skipped when already done."""
    from cl2r_bench.files import code_commit

    name = strategy_references()[strategy]
    folder = args.work / (strategy + (f"-epochs{args.epochs}" if args.epochs else "")) / f"seed{seed}"
    folder.mkdir(parents=True, exist_ok=True)
    arguments = suite_arguments(strategy, seed, args)
    parts = assembled(arguments)
    suite = suite_run(arguments, parts, folder, f"suite-{variant_name(args.variant)}" if args.variant else "suite")
    recorded = folder / "record.json"
    if not recorded.is_file():
        split = export(parts, folder, needs_independent=parts.trainer.needs_independent)
        reference = reference_run(args, name, strategy, seed, folder)
        recorded.write_text(json.dumps(evaluated(parts, split, reference, code_commit()), indent=1) + "\n")
        (folder / "data.pt").unlink()
    return {"suite": suite if "diverged" in suite else comparable(suite, suite["versions"]["cl2r-bench commit"]),
            "reference": json.loads(recorded.read_text())}


def comparable(record: dict[str, Any], commit: str | None) -> dict[str, Any]:
    """What the parity record keeps of a run: its seed, split identifiers (class order, query and gallery digests),
    two-model figures and per-query hits (what :func:`cl2r_bench.reporting.compare.compare` reads) and the suite's
    commit."""
    two_model = record["two_model"]
    return {"seed": record["seed"], "stream": {"class_order": record["stream"]["class_order"]},
            "evaluation": {key: record["evaluation"][key] for key in ("query_sha256", "gallery_sha256")},
            "two_model": {key: two_model[key] for key in TWO_MODEL_FIELDS}, "commit": commit,
            **{key: record[key] for key in ("train_seconds", "device") if key in record}}


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--references", type=Path, required=True,
                        help="the folder of the references' checkouts (LCE, AdvBCT, BT-2, OpenCompatible, OCA, MixBCT)")
    parser.add_argument("--reference-python", help="their interpreter (default: REFERENCES/venv/bin/python)")
    parser.add_argument("--data-root", type=Path, required=True)
    parser.add_argument("--work", type=Path, required=True, help="scratch folder (kept: finished steps are skipped)")
    parser.add_argument("--strategies", nargs="+", default=list(strategy_references()),
                        choices=list(strategy_references()))
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    parser.add_argument("--suite-output", type=Path, default=ROOT / "results",
                        help="the suite's results folder, where its runs are found or written")
    parser.add_argument("--epochs", type=int, help="a smoke run of N epochs of each recipe (never a parity result)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a setting of both codes' runs (the suite's, which the export reads)")
    parser.add_argument("--variant", action="append", default=[], metavar="KEY=VALUE",
                        help="a setting of the strategy's own for the suite's side only "
                        "(strategy_params.<strategy>.KEY), recorded as '<strategy> [KEY=VALUE]' beside its default")
    parser.add_argument("--out", type=Path, help="default: results/parity/track.json, or WORK/track.json with --epochs "
                        "or --set")
    args = parser.parse_args(argv)
    bad = [assignment for assignment in args.variant if "=" not in assignment or "." in assignment.split("=")[0]]
    if bad:
        raise ParityError(f"--variant {bad[0]!r}: use a setting of the strategy's own as KEY=VALUE, e.g. --variant "
                          "new_class_rows=none")
    args.work = args.work.resolve()
    trial = args.epochs or args.set
    args.out = args.out or (args.work / "track.json" if trial else ROOT / "results" / "parity" / "track.json")
    names = {strategy_references()[s] for s in args.strategies}
    args.checkouts = {name: reference_checkout(str(args.references / folder), module.MARKER, module.REPOSITORY)
                      for name in sorted(names)
                      for module in [reference_module(name)] for folder in [module.REPOSITORY.split("/")[1]]}
    args.python = {name: reference_python(args.reference_python, checkout) for name, checkout in args.checkouts.items()}
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    for strategy in args.strategies:
        name = strategy_references()[strategy]
        module = reference_module(name)
        key = record_key(strategy, args.variant)
        about = {"epochs": args.epochs or "the authors' recipe", "entry_point": module.ENTRY_POINT,
                 **provenance({name: (module.REPOSITORY, args.checkouts[name])})}
        for seed in args.seeds:
            print(f"{strategy} seed {seed} ...", flush=True)
            runs = run_strategy(args, strategy, seed)
            record_run(args.out, key, about, seed, runs)
            top1 = {code: {case: run["two_model"]["cases"][case]["top1"] for case in ("new/old", "new/new")}
                    if "two_model" in run else "diverged" for code, run in runs.items()}
            print(f"  {top1}", flush=True)


def record_run(out: Path, key: str, about: dict[str, Any], seed: int, runs: dict[str, dict[str, Any]]) -> None:
    """Add seed ``seed``'s runs to entry ``key`` of the record ``out``, read again under its lock, so that
    invocations running side by side (other strategies, a variant, another machine sharing the folder) keep each
    other's runs. Runs against another repository (a strategy whose reference changed) are dropped: they pair with
    no run of this one."""
    from cl2r_bench.files import atomic_write_json, exclusive

    out.parent.mkdir(parents=True, exist_ok=True)
    with exclusive(out.with_name(out.name + ".lock"), f"the parity record {out}", wait=print):
        results = json.loads(out.read_text()) if out.is_file() else {}
        entry = results.setdefault(key, {"runs": {}})
        if repositories(entry) not in (set(), repositories(about)):
            print(f"{key}: its runs against {sorted(repositories(entry))} are dropped from {out} (they pair with no "
                  f"run of {sorted(repositories(about))})")
            entry["runs"] = {}
        entry.update(about)
        entry["runs"][str(seed)] = runs
        atomic_write_json(out, results)


def repositories(entry: dict[str, Any]) -> set[str]:
    """The reference repositories an entry of the record (or the ``about`` of a run) names."""
    return {reference["repository"] for reference in entry.get("references", {}).values()}


if __name__ == "__main__":
    main()
