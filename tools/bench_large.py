"""A gallery of millions: the whole ``runner.py adapt`` evaluation on memory-mapped features, beside faiss's exact
search of the same arrays, timed in the same run (docs/scale-out.md, "Galleries of millions").

1. **Generate** (not timed): a ``test`` folder of ``--items`` items (``old.npy``, ``new.npy``: ``--dim`` float32
   wide, written chunk by chunk; ``labels.npy``: ``--classes`` classes) and a ``train`` folder of ``--fit`` fitting
   items, both streamed by the study (Procrustes reads its anchors from ``train``); the new model is a noisy
   rotation of the old one.
2. **adapt**: ``runner.py adapt --adapter procrustes --queries Q --set model_update.stream_rows=R`` in a child
   process: the fit, every case, both backfilling curves (random and class-mean L2 orders, 11 steps), the records.
   Its wall time and its peak resident memory (the child's ``VmHWM``, read while it runs: ``ru_maxrss`` would
   count the parent's pages the child held between fork and exec), against the gallery's size (one model's
   features). With ``--processes P``, torchrun starts P processes that share the gallery's passes (docs/scale-out.md,
   "An adapter study shared by processes"), and the peak is the sum of their peaks. With ``--device cuda`` the study
   ranks on the GPU (the features stay memory-mapped on the host and each chunk is copied over), and the GPU
   memory it held is read as the device's memory in use above what was in use before it started
   (``torch.cuda.mem_get_info``, read as the resident memory is: its CUDA context included). With ``--screen`` the
   study is screened (``model_update.screen``: its first places exact, mAP@R for the full mAP; benchmarks/ranking/,
   "Screened"), and with ``--compare`` also ranked in full on the same files, for the ratio of the two.
3. **faiss**: the same sampled old queries against the old gallery, searched exactly by faiss in chunks of ``R``
   rows (:func:`benchmarks.faiss_search.top_k_scores`, k = the largest class + 1): the time of one search, and of
   as many searches as the study made passes over the gallery (each ranked case, and two for the backfilling
   curves' two gallery versions). Its top-1, top-5 and mAP@R of old/old are printed beside the study's.
4. **The products' floor**: the float32 product's rate, measured on this machine after the two (:func:`product_rate`),
   and the time the study's passes need for their products alone at that rate: what no full ranking of every case
   goes under here (docs/scale-out.md, "Galleries of millions"); with ``--screen``, the bfloat16 rate too and the
   time of the screen's products at it.

    python -m tools.bench_large [--items 1000000] [--dim 1280] [--classes 1000] [--queries 10000] [--fit 50000]
                                [--stream-rows 65536] [--processes 1] [--device cpu] [--screen [--compare]]
                                [--folder DIR] [--json]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.adapted_cases import Scoring
from benchmarks.faiss_search import search_threads, top_k_scores
from benchmarks.ranking import similarities
from tools.bench_ranking import resident_high_water_gb

ROTATION_SEED, CENTRES_SEED = 1, 0
PEAK_POLL_SECONDS = 0.2
"""How often the child's resident high-water mark is read; it only grows, so the last read misses at most this."""
SPREAD = 4.0
"""Each item's noise around its class centre, per dimension: classes overlap (old/old top-1 about 50 % at 50,000
items of 1,000 classes), so the ranks of positives lie deep and the search is not trivial."""


def generate(folder: Path, items: int, dim: int, classes: int, fit: int, chunk: int) -> None:
    """The ``test`` folder of ``items`` items and the ``train`` folder of ``fit`` (module docstring), written
    ``chunk`` rows at a time."""
    centres = np.random.default_rng(CENTRES_SEED).normal(size=(classes, dim)).astype(np.float32)
    rotation = np.linalg.qr(np.random.default_rng(ROTATION_SEED).normal(size=(dim, dim)))[0].astype(np.float32)
    rng = np.random.default_rng(2)
    for split, count in (("train", fit), ("test", items)):
        labels = rng.integers(0, classes, size=count)
        (folder / split).mkdir()
        np.save(folder / split / "labels.npy", labels)
        files = {name: np.lib.format.open_memmap(folder / split / f"{name}.npy", mode="w+", dtype=np.float32,
                                                 shape=(count, dim)) for name in ("old", "new")}
        for start in range(0, count, chunk):
            chosen = labels[start:start + chunk]
            old = centres[chosen] + SPREAD * rng.normal(size=(len(chosen), dim)).astype(np.float32)
            files["old"][start:start + chunk] = old
            files["new"][start:start + chunk] = (old + 0.5 * rng.normal(size=old.shape).astype(np.float32)) @ rotation
        for name in files:
            files[name].flush()
        del files


def run_adapt(folder: Path, queries: int, stream_rows: int, processes: int, device: torch.device,
              screen: bool = False) -> tuple[float, float, float | None, dict]:
    """Wall seconds, the peak resident GiB of the process(es) that ran it, the peak GPU GiB it held (None off a
    GPU), and the record of ``runner.py adapt`` (module docstring), screened with ``screen``."""
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(processes), "--master_port",
                str(free_port())] if processes > 1 else [sys.executable]
    command = [*launcher, "-m", "cl2r_bench", "adapt", "--train", str(folder / "train"), "--test",
               str(folder / "test"), "--adapter", "procrustes", "--queries", str(queries), "--device", str(device),
               "--output", str(folder / f"out-{screen}"), "--set", f"model_update.stream_rows={stream_rows}",
               "--set", "model_update.backfill_orders=[random,class_mean_distance]",
               "--set", f"model_update.screen={str(screen).lower()}"]
    errors = folder / "adapt.err"
    gpu_in_use_before = gpu_in_use_gb(device)
    started = time.perf_counter()
    with errors.open("w") as stderr, subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr) as child:
        peaks: dict[int, float] = {}
        gpu_peak = gpu_in_use_before
        while child.poll() is None:
            for pid in [child.pid] if processes == 1 else descendants(child.pid):
                peaks[pid] = max(peaks.get(pid, 0.0), resident_high_water_gb(pid) or 0.0)
            gpu_peak = None if gpu_peak is None else max(gpu_peak, gpu_in_use_gb(device))
            time.sleep(PEAK_POLL_SECONDS)
        peak_gb = sum(peaks.values())
    seconds = time.perf_counter() - started
    if child.returncode != 0:
        raise SystemExit(f"adapt failed ({child.returncode}): {errors.read_text().strip()[-2000:]}")
    record = json.loads(next((folder / f"out-{screen}").rglob("metrics.json")).read_text())
    return seconds, peak_gb, None if gpu_peak is None else gpu_peak - gpu_in_use_before, record


def gpu_in_use_gb(device: torch.device) -> float | None:
    """GiB in use on ``device`` by every process (None off a GPU)."""
    if device.type != "cuda":
        return None
    free, total = torch.cuda.mem_get_info(device)
    return (total - free) / 2**30


def descendants(pid: int) -> list[int]:
    """The processes ``pid`` started, and theirs (Linux), without ``pid``: torchrun's agent holds no features."""
    try:
        children = [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []
    return [grandchild for child in children for grandchild in [child, *descendants(child)]]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def faiss_old_old(folder: Path, queries: int, stream_rows: int) -> tuple[float, dict[str, float]]:
    """Seconds of faiss's exact search of the sampled old queries in the old gallery, and its scores."""
    labels = np.load(folder / "test" / "labels.npy")
    gallery = np.load(folder / "test" / "old.npy", mmap_mode="r")
    sample = Scoring("miss", per_class_cmc=False, queries=queries).sample(len(labels)).numpy()
    started = time.perf_counter()
    scores = top_k_scores(np.asarray(gallery[sample]), labels[sample], gallery, labels, own_index=sample,
                          depth=5, chunk_rows=stream_rows)
    seconds = time.perf_counter() - started
    return seconds, {"top1": scores.cmc(1), "top5": scores.cmc(5), "mAP@R": scores.mAP_at_R}


def product_rate(device: torch.device, dim: int, rows: int = 4096, columns: int = 16384, repeats: int = 3,
                 dtype: torch.dtype = torch.float32) -> float:
    """The matrix product's rate on this machine, in floating-point operations a second: the best of ``repeats``
    products of ``rows`` x ``dim`` by ``dim`` x ``columns`` through the study's own product: in float32
    :func:`benchmarks.ranking.similarities` (with the passes' operations, the time the products alone take, a floor
    no full ranking of every case goes under here), in bfloat16 the screen's (``model_update.screen``)."""
    generator = torch.Generator().manual_seed(0)
    queries = torch.randn(rows, dim, generator=generator).to(device, dtype)
    gallery = torch.randn(columns, dim, generator=generator).to(device, dtype)
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        similarities(queries, gallery)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - started)
    return 2 * rows * dim * columns / best


def gallery_passes(record: dict) -> int:
    """How many times the study compared the queries with a whole gallery: each case it ranked (new/new and the
    forward-adapted case are the backfilling curve's two ends, not ranked again) and the curves' two versions."""
    ranked = [case for case, scores in record["retrieval"]["cases"].items() if scores is not None]
    return len([case for case in ranked if case not in ("new/new", "new/F")]) + 2


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=1280)
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--queries", type=int, default=10_000)
    parser.add_argument("--fit", type=int, default=50_000)
    parser.add_argument("--stream-rows", type=int, default=65536)
    parser.add_argument("--processes", type=int, default=1, help="torchrun processes sharing the study (1: none)")
    parser.add_argument("--device", type=torch.device, default=torch.device("cpu"),
                        help="where the study ranks: cpu, or cuda (one process) for the GPU")
    parser.add_argument("--folder", type=Path, help="where the generated files go (default: a temporary folder, "
                        f"{2 * 4 * 1_000_000 * 1280 / 1e9:.1f} GB at the default size)")
    parser.add_argument("--screen", action="store_true", help="screen the gallery (model_update.screen): the first "
                        "places exact after a bfloat16 screen, mAP@R for the full mAP")
    parser.add_argument("--compare", action="store_true", help="with --screen, also the full ranking of the same "
                        "study on the same files, and the ratio of the two")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(dir=args.folder) as name:
        folder = Path(name)
        started = time.perf_counter()
        generate(folder, args.items, args.dim, args.classes, args.fit, args.stream_rows)
        generate_seconds = time.perf_counter() - started
        adapt_seconds, peak_gb, gpu_peak_gb, record = run_adapt(folder, args.queries, args.stream_rows,
                                                                args.processes, args.device, args.screen)
        full_seconds = run_adapt(folder, args.queries, args.stream_rows, args.processes, args.device)[0] \
            if args.screen and args.compare else None
        faiss_seconds, faiss_scores = faiss_old_old(folder, args.queries, args.stream_rows)
    passes = gallery_passes(record)
    gallery_gb = args.items * args.dim * 4 / 1e9
    rate = product_rate(args.device, args.dim)
    operations = passes * 2 * args.queries * args.items * args.dim
    products_seconds = operations / rate
    screen_rate = product_rate(args.device, args.dim, dtype=torch.bfloat16) if args.screen else None
    result = {"items": args.items, "dim": args.dim, "classes": args.classes, "queries": args.queries,
              "fit": args.fit, "stream_rows": args.stream_rows, "processes": args.processes, "screen": args.screen,
              "generate_seconds": generate_seconds,
              "adapt_seconds": adapt_seconds, "adapter_fit_seconds": record["timings"]["adapter_fit_seconds"],
              "evaluation_seconds": record["timings"]["evaluation_seconds"],
              "adapt_peak_resident_gb": peak_gb * 2**30 / 1e9,
              "adapt_peak_gpu_gb": None if gpu_peak_gb is None else gpu_peak_gb * 2**30 / 1e9,
              "gallery_gb": gallery_gb, "gallery_passes": passes, "faiss_one_search_seconds": faiss_seconds,
              "ratio_to_faiss_same_passes": adapt_seconds / (passes * faiss_seconds),
              "full_ranking_adapt_seconds": full_seconds,
              "product_gflops": rate / 1e9, "products_floor_seconds": products_seconds,
              "screen_product_gflops": None if screen_rate is None else screen_rate / 1e9,
              "screen_products_seconds": None if screen_rate is None else operations / screen_rate,
              "suite_old_old": record["retrieval"]["cases"]["old/old"], "faiss_old_old": faiss_scores,
              "sampling_interval_old_old": record["retrieval"]["sampling_interval"]["old/old"],
              "device": record["device"], "torch": torch.__version__, "numpy": np.__version__,
              "faiss_threads": search_threads(),
              "threads_per_process": torch.get_num_threads() if args.processes == 1 else
              int(os.environ.get("OMP_NUM_THREADS", "1")),
              "processor": platform.processor() or platform.machine()}
    if args.json:
        print(json.dumps(result))
        return 0
    suite = result["suite_old_old"]
    gpu_text = "" if gpu_peak_gb is None else (f", on the {record['device']['gpu']} holding "
                                                f"{result['adapt_peak_gpu_gb']:.2f} GB")
    print(f"{args.items:,} x {args.dim}, {args.classes} classes, {args.queries:,} sampled queries, "
          f"Procrustes fitted on {args.fit:,}, {args.processes} process(es): whole adapt evaluation "
          f"{adapt_seconds:.1f}s, peak resident "
          f"{result['adapt_peak_resident_gb']:.2f} GB ({result['adapt_peak_resident_gb'] / gallery_gb:.2f}x one "
          f"gallery of {gallery_gb:.2f} GB){gpu_text}; of which fit {result['adapter_fit_seconds']:.1f}s, cases and "
          f"curves {result['evaluation_seconds']:.1f}s")
    print(f"faiss exact search on the CPU ({result['faiss_threads']} threads), old/old: {faiss_seconds:.1f}s; "
          f"x {passes} gallery passes = "
          f"{passes * faiss_seconds:.1f}s; adapt / that = {result['ratio_to_faiss_same_passes']:.2f}")
    print(f"the products alone: {passes} passes x {operations / passes:.3g} floating-point "
          f"operations at this machine's {rate / 1e9:.0f} GFLOPS (float32, measured now) = {products_seconds:.1f}s; "
          f"adapt / that = {adapt_seconds / products_seconds:.2f}")
    if screen_rate is not None:
        print(f"the screen's products: the same operations at {screen_rate / 1e9:.0f} GFLOPS (bfloat16, measured "
              f"now) = {result['screen_products_seconds']:.1f}s")
    if full_seconds is not None:
        print(f"the same study ranked in full (every rank, the full mAP): {full_seconds:.1f}s; screened / full = "
              f"{adapt_seconds / full_seconds:.2f}")
    print(f"old/old top-1 / top-5 / mAP@R: suite {suite['top1']:.2f} / {suite['top5']:.2f} / {suite['mAP@R']:.4f}, "
          f"faiss {faiss_scores['top1']:.2f} / {faiss_scores['top5']:.2f} / {faiss_scores['mAP@R']:.4f}")
    interval = result["sampling_interval_old_old"]
    precision = next(name for name in interval if name != "top1")
    print(f"old/old 95% sampling interval of the {args.queries:,} queries: top-1 {interval['top1'][0]:.2f} .. "
          f"{interval['top1'][1]:.2f}, {precision} {interval[precision][0]:.4f} .. {interval[precision][1]:.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
