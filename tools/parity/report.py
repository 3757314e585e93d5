"""Assemble ``results/parity/parity.json`` and print the tables of ``results/parity/README.md``.

    python -m tools.parity.report [--steps results/parity/steps.json]
                                             [--end-to-end results/parity/end_to_end.json]

The protocol table sets each setting of the authors' 7-task run (read from their code, cited by file) beside the
suite's, which is read from the resolved ``paper`` preset, so the table follows the code.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path

from benchmarks.metrics import all_metrics, as_matrix
from cl2r_bench.app.assembly import assemble
from cl2r_bench.config import resolve
from tools.parity.common import ROOT  # noqa: I001


def protocol() -> list[dict]:
    """``{"setting", "reference", "suite", "agree"}`` rows; ``agree`` is False only for a real difference."""
    cfg = assemble(resolve([("paper", {"preset": "paper"})])).config
    t, s, e = cfg["training"], cfg["stream"], cfg["evaluation"]
    rows = [
        ("stream", "CIFAR-100, natural order, 10 + 15 x 6 classes, first 300 train images per class "
         "(dataset/cifar.py, subsample_dataset)",
         f"{cfg['dataset']}, {s['class_order']} order, {s['initial_classes']} + {s['increment']} x "
         f"{s['num_tasks'] - 1}, "
         f"first {s['images_per_class']} per class", True),
        ("epochs per task", "70 (params.py)", str(t["epochs"]), t["epochs"] == 70),
        ("epoch length, task 0", "N // 128 batches: DataLoader(shuffle, drop_last) (main.py)",
         f"epoch_length: {t['epoch_length']} (N // 128, last partial batch dropped)", t["epoch_length"] == "reference"),
        ("epoch length, tasks 1-6", "(N_new + N_mem) // 128 batches, at least 1 (BalancedBatchSampler)",
         f"epoch_length: {t['epoch_length']}: (N_new + N_mem) // 128; 36 batches at task 1",
         t["epoch_length"] == "reference"),
        ("batch from task 1", "64 memory + 64 new, each drawn with np.random.choice without replacement inside the "
         "batch (with replacement when a pool has <= 64 samples), independently across batches",
         f"{t['memory_batch_size']} memory + {t['new_batch_size']} new, drawn the same way",
         t["epoch_length"] == "reference"),
        ("optimiser", "SGD lr 1e-3, momentum 0.9, weight decay 5e-4 except p.ndim < 2, bn, ln, bias; rebuilt per task",
         f"SGD lr {t['lr']:g}, momentum {t['momentum']}, weight decay {t['weight_decay']:g} except ndim <= 1; "
         "rebuilt per task", t["lr"] == 1e-3 and t["momentum"] == 0.9 and t["weight_decay"] == 5e-4),
        ("schedule", "CosineAnnealingLR(T_max=70, eta_min=1e-5), scheduler.step() after each epoch",
         f"cosine {t['lr']:g} -> {t['lr_min']:g}, schedule_step: {t['schedule_step']}", t["schedule_step"] == "epoch"),
        ("mixed precision", "autocast float16 + GradScaler on CUDA, training and feature extraction; off on CPU",
         f"amp: {t['amp']}, amp_dtype: {t['amp_dtype']} (+ GradScaler for float16); off on CPU",
         t["amp"] and t["amp_dtype"] == "float16"),
        ("augmentation", "Resize(32), RandomCrop(32, padding=4), RandomHorizontalFlip, ToTensor, Normalize(CIFAR-100)",
         "crop 32 with 4 zero-padded pixels and flip, batched on the device, then CIFAR-100 normalisation", True),
        ("evaluation transform", "Resize(32), ToTensor, Normalize(CIFAR-100 mean / std)",
         "uint8 / 255, CIFAR-100 normalisation (identical values, steps.json)", True),
        ("seeds", "one seed (42) for torch, numpy and random at start; cudnn deterministic",
         f"seed {cfg['seed']}; each task re-seeds from (seed, task) so that a resumed run equals an uninterrupted one",
         True),
        ("replay memory", "20 random exemplars per seen class (RehearsalMemory, herding random), added after "
         "training the task, before evaluation", f"{t['memory_per_class']} random exemplars per class, added after "
         "training, before evaluation", t["memory_per_class"] == 20),
        ("teacher (HOC)", "the model the task starts from: previous checkpoint, or at tasks 0, 2, 4 the loaded "
         "replacement; eval mode, no gradient", "the same (replacement_teacher: incoming)",
         cfg["strategy_params"]["dsimplex_hoc"]["replacement_teacher"] == "incoming"),
        ("HOC loss", "0.1 CE + 0.9 L_hoc, mu 10, same-class pairs multiplied by 0 (hoc.py)",
         "ce_weight {ce_weight}, hoc_weight {hoc_weight}, mu {mu:g}, mask: {mask}".format(
             **cfg["strategy_params"]["dsimplex_hoc"]), cfg["strategy_params"]["dsimplex_hoc"]["mask"] == "zero"),
        ("d-Simplex head", "K = 1024 fixed, fc1 512 -> 1023 trainable, class y on vertex 1023 - y",
         f"K = {cfg['model']['simplex_classes']}, lift 512 -> {cfg['model']['simplex_classes'] - 1}, vertex K - 1 - y",
         cfg["model"]["simplex_classes"] == 1024),
        ("retrieved feature", "learnable: the 512-d backbone output; d-Simplex: the 1023-d fc1 output; L2-normalised",
         "the same", True),
        ("gallery and queries", "CIFAR-10 test as 10 class templates (mean of normalised features, normalised); "
         "CIFAR-10 train (50,000) as queries", f"{e['dataset']}, mode {e['mode']}, all queries "
         f"(queries_per_class: {e['queries_per_class']})", e["mode"] == "templates" and e["queries_per_class"] is None),
        ("nearest template, ties", "faiss IndexFlatIP top-1 (lowest index wins a tie)", "argmax (first index wins)",
         True),
        ("compatibility tie rule", "M[t][k] <= M[k][k] is a violation (compatibility_metrics.py)",
         f"tie_rule: {e['tie_rule']}", e["tie_rule"] == "strict"),
        ("checkpoint kept per task", "the last epoch (save_best: False)", "the model after the last epoch", True),
        ("AA", "zeros replaced by NaN before the mean (replace_zero_with_nan)",
         "genuine zeros count (METHODS.md §9: their defect, not reproduced)", False),
        ("replacement load", "strict=False; the head is dropped only when the path contains 'pretrained'",
         "strict except the learnable classifier, always dropped (METHODS.md §9: their defect, not reproduced)",
         False),
        ("replacement models", "ResNet-18s trained on 32x32 ImageNet, 100 / 300 / 600 classes (download)",
         "suite-pretrained on Tiny ImageNet classes outside the stream, or your own checkpoints "
         "(replacement.checkpoints)", False),
    ]
    return [{"setting": a, "reference": b, "suite": c, "agree": d} for a, b, c, d in rows]


def entry_table(entry: dict) -> tuple[str, int, int, int]:
    """The matrix entry by entry, suite and reference (% mean ± std over seeds); how many entries differ by more
    than the seed spread (|difference of means| > std of the suite + std of the reference, bold) and by more than
    the query noise of one entry (1.96 sqrt(p (1 - p) / n), n queries: the seeds share queries and replacement
    models, so their spread understates it)."""
    stats = {}
    for code in ("suite", "reference"):
        matrices = [r["matrix"] for r in entry[code].values()]
        stats[code] = [[(statistics.mean(100 * m[t][k] for m in matrices),
                         statistics.pstdev(100 * m[t][k] for m in matrices))
                        for k in range(t + 1)] for t in range(len(matrices[0]))]
    lines = ["| query \\ gallery | " + " | ".join(str(k) for k in range(len(stats["suite"]))) + " |",
             "|---|" + "---|" * len(stats["suite"])]
    beyond = noisy = total = 0
    for t, (ours, theirs) in enumerate(zip(stats["suite"], stats["reference"], strict=True)):
        cells = []
        for (m1, s1), (m2, s2) in zip(ours, theirs, strict=True):
            differs = abs(m1 - m2) > s1 + s2
            p = (m1 + m2) / 200
            noisy += abs(m1 - m2) > 100 * 1.96 * math.sqrt(p * (1 - p) / entry["queries"])
            beyond, total = beyond + differs, total + 1
            cell = f"{m1:.1f} ± {s1:.1f} / {m2:.1f} ± {s2:.1f}"
            cells.append(f"**{cell}**" if differs else cell)
        lines.append(f"| {t} | " + " | ".join(cells) + " |" * (len(stats["suite"]) - t))
    return "\n".join(lines), beyond, noisy, total


def summarise(end_to_end: dict) -> tuple[dict, list[str]]:
    """Per strategy and code: the mean / std matrix, AC and AA per seed; and the timing of the first seed."""
    lines = []
    for strategy, entry in end_to_end.items():
        for code in ("reference", "suite"):
            runs = entry[code]
            metrics = [all_metrics(as_matrix(r["matrix"]), "strict") for r in runs.values()]
            ac = [m["AC"] for m in metrics]
            aa = [m["AA"] for m in metrics]
            lines.append(f"{strategy} {code}: {len(runs)} seeds, AC {statistics.mean(ac):.3f} +- "
                         f"{statistics.pstdev(ac):.3f}, AA {statistics.mean(aa):.2f} +- {statistics.pstdev(aa):.2f}")
    first = next(iter(end_to_end.values()))
    seed = min(set(first["reference"]) & set(first["suite"]), default=None)
    timing = {}
    if seed is not None:
        ref, suite = first["reference"][seed], first["suite"][seed]
        timing = {"suite_wall_s": suite["wall_s"], "reference_wall_s": ref["wall_s"],
                  "suite_train_img_s": suite["train_images"] / suite["train_s"],
                  "reference_train_img_s": suite["train_images"] / ref["train_s"],
                  "suite_eval_s": suite["eval_s"], "reference_eval_s": ref["eval_s"],
                  "suite_peak_rss_mib": suite["peak_rss_mib"], "reference_peak_rss_mib": ref["peak_rss_mib"],
                  "wall_ratio": ref["wall_s"] / suite["wall_s"], "seed": int(seed),
                  "strategy": next(iter(end_to_end)), "queries": first["queries"],
                  "epochs": first["epochs"], "images_per_class": first["images_per_class"]}
        if seed in first.get("suite_first_run", {}):
            cold = first["suite_first_run"][seed]
            timing |= {"suite_first_run_wall_s": cold["wall_s"], "suite_first_run_eval_s": cold["eval_s"],
                       "first_run_wall_ratio": ref["wall_s"] / cold["wall_s"]}
    for strategy, entry in end_to_end.items():
        if entry["suite"] and entry["reference"]:
            table, beyond, noisy, total = entry_table(entry)
            lines += [f"\n{strategy}: suite / reference, % (mean ± std over seeds); of {total} entries, {beyond} "
                      f"differ by more than the seed spread (bold), {noisy} by more than one entry's query noise\n",
                      table]
    return timing, lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    folder = ROOT / "results" / "parity"
    parser.add_argument("--steps", type=Path, default=folder / "steps.json")
    parser.add_argument("--end-to-end", type=Path, default=folder / "end_to_end.json",
                        help="the parity runs of tools/parity/end_to_end.py")
    parser.add_argument("--timing", type=Path, default=folder / "timing.json",
                        help="tools/parity/end_to_end.py's output for the timed pair "
                             "(the real evaluation set)")
    parser.add_argument("--out", type=Path, default=folder / "parity.json")
    args = parser.parse_args()
    end_to_end = json.loads(args.end_to_end.read_text()) if args.end_to_end.is_file() else {}
    lines = summarise(end_to_end)[1] if end_to_end else []
    timing = summarise(json.loads(args.timing.read_text()))[0] if args.timing.is_file() else {}
    steps = json.loads(args.steps.read_text())
    report = {"steps": steps["rows"] if isinstance(steps, dict) else steps, "protocol": protocol(),
              "end_to_end": {s: {"epochs": e["epochs"], "images_per_class": e["images_per_class"],
                                 "queries": e["queries"],
                                 "suite": [r["matrix"] for _, r in sorted(e["suite"].items())],
                                 "reference": [r["matrix"] for _, r in sorted(e["reference"].items())]}
                             for s, e in end_to_end.items()},
              "timing": timing}
    args.out.write_text(json.dumps(report, indent=1, allow_nan=False) + "\n")
    print("| setting | authors' code | suite (`paper` preset) | same |\n|---|---|---|---|")
    for r in report["protocol"]:
        print(f"| {r['setting']} | {r['reference']} | {r['suite']} | {'yes' if r['agree'] else '**no**'} |")
    print("\n".join(lines))
    print(json.dumps(timing, indent=1))


if __name__ == "__main__":
    main()
