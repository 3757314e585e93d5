"""The result pages' speed and scale tables, read from committed JSON and records (``runner.py pages`` runs it).

Each table is GitHub markdown, printed from files committed under ``results/`` and given by their paths from the
repository's root; nothing is measured here.

* ``protocol SPEED_JSON``: the third GPU session's protocol run alone (``speed.json``'s ``protocol``, written by
  ``results/gpu/speed/summarize.py``).
* ``eager SPEED_JSON``: the first session's eager run (``speed.json``'s top level).
* ``graphs SPEED_JSON``: the second session's loop eager and with CUDA graphs (``graphs``), with the protocol's time
  projected from each.
* ``profile SPEED_JSON``: the torch profiler's host seconds per labelled region, eager and with graphs.
* ``packing SPEED_JSON``: the loop benchmark alone and 6 or 12 processes packed on the GPU.
* ``packed SPEED_JSON``: the third session's runs started together (``packed``): which finished, when, why not.
* ``runs METRICS_JSON ...``: one row per run record: device, speed settings, AA after each task, AC and the
  replacement models' own top-1.
* ``bench-large JSON ...``: ``tools/bench_large.py``'s records (``--json``), one row each, and the product rates
  of those that measured them.

    python -m tools.page_scale TABLE PATH [PATH ...]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from tabulate import tabulate

REGIONS = ("batch", "augmentation", "forward", "loss", "backward", "optimizer")


def table(headers: list[str], rows: list[list]) -> str:
    return tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True)


def count(value: float) -> str:
    return f"{value:,.0f}"


def both(pair: dict) -> str:
    return f"{count(pair['plain'])} / {count(pair['suite'])}"


def split(seconds: dict) -> str:
    return " / ".join(f"{value:.1f}" for value in seconds.values()) + " s"


def protocol(speed: dict) -> str:
    p = speed["protocol"]
    loops = p["loop_img_s_graphs"]
    return table(["figure", "value"], [
        [f"wall time, command to exit, {p['tasks_completed']} of {p['num_tasks']} tasks (`protocol_wall_s`; "
         f"target {p['target_wall_s']:.0f} s)", f"**{p['protocol_wall_s']:.1f} s**"],
        ["of which training / evaluation / scoring the starting models / the rest (start-up, compiling, data, "
         "records)", split(p["wall_split_s"])],
        [f"training images per second (`train_img_s`; {count(p['iterations'])} iterations of 128, "
         f"{p['ms_per_iteration']:.2f} ms each)", count(p["train_img_s"])],
        ["evaluation images per second (`eval_img_s`: 60,000 per task)", count(p["eval_img_s"])],
        ["GPU memory in use at most (nvidia-smi, during the run)", f"{p['peak_gpu_mem_gb']:.2f} GiB"],
        [f"GPU utilisation during the run (nvidia-smi, mean of {p['smi_samples']} samples)",
         f"{p['gpu_utilisation_mean_pct']:.1f} %"],
        ["loop benchmark with graphs, SGD's foreach update: plain / suite images/s", both(loops["foreach_sgd"])],
        ["the same with the fused update (`plain_loop_img_s` / `suite_loop_img_s`)",
         f"{both(loops['fused_sgd'])} ({p['fused_speedup']['plain']:.2f}× / {p['fused_speedup']['suite']:.2f}×)"],
        ["pretraining the 3 replacement ResNet-18s, side by side, with graphs", f"{p['pretrain_wall_s']:.1f} s"],
        ["unpacking the archives / decoding the images and checking every array",
         f"{p['data_unpack_s']:.1f} / {p['data_decode_and_check_s']:.1f} s"],
        ["runs per hour, one at a time", f"{p['runs_per_hour_one_at_a_time']:.1f}"],
    ])


def eager(speed: dict) -> str:
    return table(["figure", "value"], [
        ["tasks finished before the device time ran out", f"{speed['tasks_completed']} of {speed['num_tasks']}"],
        ["wall time, command to the last task's `metrics.json`", f"{speed['wall_s_to_last_record']:.1f} s"],
        ["of which training / evaluation / scoring the starting models / the rest (start-up, data, records)",
         split(speed["wall_split_s"])],
        [f"protocol wall time, projected (the missing tasks' {count(sum(speed['missing_task_iterations']))} "
         "iterations at the run's own rate)", f"**{speed['protocol_wall_s_projected']:.1f} s**"],
        [f"training images per second (`train_img_s`; {speed['ms_per_iteration']:.2f} ms per iteration)",
         count(speed["train_img_s"])],
        ["evaluation images per second (`eval_img_s`)", count(speed["eval_img_s"])],
        ["GPU memory in use at most (nvidia-smi)", f"{speed['peak_gpu_mem_gb']:.2f} GiB"],
        [f"GPU utilisation during the run (nvidia-smi, mean of {speed['smi_samples']} samples)",
         f"{speed['gpu_utilisation_mean_pct']:.1f} %"],
        ["loop benchmark, fp16: plain / suite images/s (`plain_loop_img_s` / `suite_loop_img_s`)",
         f"{count(speed['plain_loop_img_s'])} / {count(speed['suite_loop_img_s'])}"],
        [f"pretraining the 3 replacement ResNet-18s (the first {speed['pretrain_overlapped_s']:.1f} s beside the "
         "benchmarks)", f"{speed['pretrain_wall_s']:.1f} s"],
        ["runs per hour, one at a time (projected)", f"{speed['runs_per_hour_one_at_a_time']:.1f}"],
    ])


def graphs(speed: dict) -> str:
    g = speed["graphs"]
    loops, profiles, speedup = g["loop_img_s"], g["profile"], g["graphs_speedup"]
    kernel = [1000 * profiles[name]["device_kernel_s"] / profiles[name]["iterations"] for name in ("eager", "graphs")]
    return table(["figure", "eager", "CUDA graphs (`training.compile: reduce-overhead`)"], [
        ["the suite's loop, images/s (`suite_loop_img_s`)", count(loops["eager"]["suite"]),
         f"{count(loops['graphs']['suite'])} ({speedup['suite']:.2f}×)"],
        ["a plain PyTorch loop, same model, loss and batch (`plain_loop_img_s`)", count(loops["eager"]["plain"]),
         f"{count(loops['graphs']['plain'])} ({speedup['plain']:.2f}×)"],
        ["the profiler's run, unprofiled, images/s", count(profiles["eager"]["images_per_second"]),
         count(profiles["graphs"]["images_per_second"])],
        ["GPU kernel time per iteration", f"{kernel[0]:.1f} ms", f"{kernel[1]:.1f} ms"],
        ["GPU busy (kernel time over the profiled wall time)", f"{100 * profiles['eager']['device_busy_share']:.1f} %",
         f"{100 * profiles['graphs']['device_busy_share']:.1f} %"],
        [f"protocol wall time, projected ({count(g['protocol_iterations'])} iterations)",
         f"{speed['protocol_wall_s_projected']:.1f} s", f"{g['protocol_wall_s_projected_with_graphs']:.1f} s"],
        ["runs per hour, one at a time (projected)", f"{speed['runs_per_hour_one_at_a_time']:.1f}",
         f"{g['runs_per_hour_one_at_a_time_with_graphs']:.1f}"],
    ])


def profile(speed: dict) -> str:
    profiles = speed["graphs"]["profile"]

    def host(name: str) -> list[float]:
        regions = profiles[name]["regions"]
        seconds = {region: regions[f"cl2r.{region}"]["host_s"] for region in REGIONS}
        seconds["batch"] -= seconds["augmentation"]  # the batch region holds the augmentation
        return [*seconds.values(), profiles[name]["other_host_s"], profiles[name]["profiled_wall_s"],
                profiles[name]["wall_s"]]

    names = ["batch (less the augmentation inside it)", *REGIONS[1:], "other (outside the labelled regions)",
             "profiled wall time", "unprofiled wall time"]
    seconds = zip(names, host("eager"), host("graphs"), strict=True)
    return table([f"host seconds, {profiles['eager']['iterations']} iterations", "eager", "graphs"],
                 [[name, f"{a:.2f}", f"{b:.2f}"] for name, a, b in seconds])


def packing(speed: dict) -> str:
    g = speed["graphs"]
    alone = g["loop_img_s"]["graphs"]
    rows = [["1 (alone)", count(alone["plain"]), count(alone["suite"]), "1.00×", ""]]
    for key in ("packed_6_processes_img_s", "packed_12_processes_img_s"):
        packed = g[key]
        runs = f"{g['runs_per_hour_6_packed_with_graphs']:.1f}" if packed["processes"] == 6 else ""
        rows.append([str(packed["processes"]), count(packed["plain"]), count(packed["suite"]),
                     f"{packed['suite'] / alone['suite']:.2f}×", runs])
    return table(["processes (graph loop)", "plain images/s, summed", "suite images/s, summed",
                  "suite, × one process", "runs per hour, projected"], rows)


def packed(speed: dict) -> str:
    p = speed["packed"]
    rows = []
    for strategy, run in sorted(p["runs"].items(), key=lambda item: item[1]["seconds_from_start"]):
        metrics = run.get("metrics", {})
        error = (run["error"] or "").removeprefix("error: ").split("; ")[0]
        rows.append([strategy, "yes" if run["finished"] else "no", f"{run['seconds_from_start']:.1f}",
                     f"{run['train_seconds']:.1f}" if "train_seconds" in run else "",
                     f"{metrics['AC']:.3f}" if metrics else "", f"{metrics['AA']:.2f}" if metrics else "", error])
    runs = table(["strategy", "finished", "s from the common start", "training s", "AC", "AA (%)", "why it stopped"],
                 rows)
    gpu = table(["processes", "GPU memory in use at most", "GPU utilisation, mean"],
                [[str(p["processes"]), f"{p['peak_gpu_mem_gb']:.2f} GiB", f"{p['gpu_utilisation_mean_pct']:.1f} %"]])
    return f"{runs}\n\n{gpu}"


def runs(paths: list[str]) -> str:
    rows = []
    for path in paths:
        record = json.loads(Path(path).read_text())
        training, metrics = record["config"]["training"], record["metrics"]
        rows.append([f"`{path}`", record["device"].get("gpu") or record["device"]["type"],
                     training.get("compile") or "no", "yes" if training.get("fused_optimizer") else "no",
                     f"{record['tasks_completed']} of {record['num_tasks']}",
                     " ".join(f"{value:.2f}" for value in metrics["AA_per_task"]), f"{metrics['AC']:.3f}",
                     " / ".join(f"{100 * model['own_accuracy']:.1f}" for model in record["replacement_models"])])
    return table(["record", "GPU", "`training.compile`", "fused SGD", "tasks", "AA_t after each task (%)", "AC",
                  "replacement models' own top-1 (%)"], rows)


def bench_large(paths: list[str]) -> str:
    rows, products = [], []
    for path in paths:
        record, name = json.loads(Path(path).read_text()), Path(path).name
        device = record["device"]
        where = device.get("gpu") or f"{device['cpu_threads']} CPU threads"
        gallery = record.get("gallery_gb")
        resident = f"{record['adapt_peak_resident_gb']:.2f}" + (
            f" ({record['adapt_peak_resident_gb'] / gallery:.2f}× the {gallery:.2f} GB gallery)" if gallery else "")
        suite, faiss = record.get("suite_old_old") or record.get("old_old"), record.get("faiss_old_old")
        held = record.get("adapt_peak_gpu_gb")
        rows.append([f"`{name}`", Path(path).stem.rsplit("-", 1)[-1],
                     f"{count(record['items'])}, {count(record['queries'])}" if "items" in record else "",
                     where, f"{record['adapt_seconds']:.1f}", f"{record['evaluation_seconds']:.1f}", resident,
                     f"{held:.1f}" if held else "",
                     f"{record['faiss_one_search_seconds']:.1f}" if "faiss_one_search_seconds" in record else "",
                     f"{suite['top1']:.2f} / {suite['top5']:.2f} / {suite['mAP@R']:.4f}",
                     f"{faiss['top1']:.2f} / {faiss['top5']:.2f} / {faiss['mAP@R']:.4f}" if faiss else ""])
        if "product_gflops" in record:
            products.append([f"`{name}`", count(record["product_gflops"]), f"{record['products_floor_seconds']:.1f}",
                             count(record["screen_product_gflops"]) if "screen_product_gflops" in record else "",
                             f"{record['screen_products_seconds']:.1f}" if "screen_products_seconds" in record else "",
                             f"{record['full_ranking_adapt_seconds']:,.1f}" if "full_ranking_adapt_seconds" in record
                             else ""])
    text = table(["file", "code", "items, queries", "ranked on", "whole `adapt` (s)", "cases and curves (s)",
                  "peak resident (GB)", "GPU memory held (GB)", "faiss, one search (s)",
                  "old/old top-1 / top-5 / mAP@R, suite", "the same, faiss"], rows)
    if products:
        text += "\n\n" + table(["file", "float32 product (GFLOPS)", "the passes' products at that rate (s)",
                                "bfloat16 product (GFLOPS)", "the screen's products at that rate (s)",
                                "whole `adapt`, full ranking (s)"], products)
    return text


SPEED = {"protocol": protocol, "eager": eager, "graphs": graphs, "profile": profile, "packing": packing,
         "packed": packed}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("table", choices=[*SPEED, "runs", "bench-large"])
    parser.add_argument("paths", nargs="+", help="the committed JSON files the table reads, from the repository root")
    args = parser.parse_args(argv)
    if args.table in SPEED:
        if len(args.paths) != 1:
            parser.error(f"{args.table} reads one speed.json")
        print(SPEED[args.table](json.loads(Path(args.paths[0]).read_text())))
    elif args.table == "runs":
        print(runs(args.paths))
    else:
        print(bench_large(args.paths))


if __name__ == "__main__":
    main()
