"""Benchmark: the time of one evaluation of the paper protocol, and of the metrics record that follows it.

One evaluation (``CompatibilityEvaluator.deploy``, docs/METHODS.md §3) embeds the gallery (CIFAR-10 test, 10,000
images, reduced to 10 class templates) and the queries (CIFAR-10 train, 50,000 images) with
:func:`cl2r_bench.models.embed`, ``evaluation.batch_size`` images at a time, under the training autocast setting,
from images already on the device. This tool times those two calls for a freshly built model on generated images of
the same shape and counts (``cl2r_bench.data.datasets.make_synthetic`` with 10 classes: the cost does not depend on the
pixels), the model optionally in the channels-last format that ``training.channels_last`` leaves it in (the images
stay as stored, as in a run). ``--images N`` embeds fewer images (five queries to one gallery image, as the
protocol) and scales the time to the protocol's counts by the measured images/s. The template reduction and the
nearest-template search (a 50,000 x 10 product) are not timed; ``torch.compile`` does not apply (embedding runs the
uncompiled model).

After every task the run also writes ``metrics.json`` with its query-bootstrap intervals
(``benchmarks.noise.noise_metrics``: ``evaluation.resamples`` resamples of the per-query hits of every matrix entry,
on the CPU); ``--records`` times those T records on random hits of the protocol's size.

    python -m tools.bench_evaluation [--backbone resnet18] [--amp none|float16|bfloat16]
        [--channels-last] [--images 60000] [--repeats 3] [--records]
"""
from __future__ import annotations

import argparse
import math
import statistics
import time
from dataclasses import dataclass

import numpy as np
import torch

from benchmarks.noise import noise_metrics
from cl2r_bench.config import resolve
from cl2r_bench.data.datasets import ImageSet
from cl2r_bench.data.synthetic import make_synthetic
from cl2r_bench.models import autocast_dtype, build_model, embed
from cl2r_bench.settings import RunSettings

CIFAR10_CLASSES, CIFAR10_TRAIN_PER_CLASS, CIFAR10_TEST_PER_CLASS = 10, 5000, 1000
AMP_CHOICES = ("none", "float16", "bfloat16")


@dataclass(frozen=True)
class EvaluationTiming:
    """The measured embedding of ``images`` images in ``seconds`` (median over repeats) with its peak GPU memory
    (None off CUDA)."""

    images: int
    seconds: float
    peak_memory: int | None

    @property
    def images_per_second(self) -> float:
        return self.images / self.seconds

    def seconds_for(self, images: int) -> float:
        """The time of ``images`` images at the measured rate."""
        return images / self.images_per_second


def paper_settings(strategy: str = "dsimplex_hoc") -> RunSettings:
    """The paper protocol's settings (``configs/presets/paper.yaml`` on CIFAR-100, the default IAM-CL2R scenario),
    resolved as a run resolves them, with ``strategy``."""
    return RunSettings.from_config(resolve([("evaluation benchmark", {"preset": "paper", "dataset": "cifar100",
                                                                    "strategy": strategy})]))


def evaluation_counts(settings: RunSettings) -> tuple[int, int]:
    """``(queries, gallery images)`` of one evaluation of a CIFAR-10-evaluated run (docs/METHODS.md §3: queries =
    the 5,000 train images of each class, or ``evaluation.queries_per_class`` of them; gallery = the 10,000 test
    images)."""
    evaluation = settings.evaluation
    if evaluation.dataset != "cifar10":
        raise ValueError(f"evaluation.dataset {evaluation.dataset!r}: this benchmark times the CIFAR-10 evaluation "
                         "only")
    per_class = min(evaluation.queries_per_class or CIFAR10_TRAIN_PER_CLASS, CIFAR10_TRAIN_PER_CLASS)
    return CIFAR10_CLASSES * per_class, CIFAR10_CLASSES * CIFAR10_TEST_PER_CLASS


def evaluation_images(images: int, device: torch.device) -> tuple[ImageSet, ImageSet]:
    """``(queries, gallery)``: about ``images`` generated CIFAR-10-shaped images, five queries to one gallery image,
    on ``device``."""
    per_class = max(1, math.ceil(images / CIFAR10_CLASSES / 6))
    data = make_synthetic(num_classes=CIFAR10_CLASSES, train_per_class=5 * per_class, test_per_class=per_class)
    return (ImageSet(data.train.images.to(device), data.train.labels.to(device)),
            ImageSet(data.test.images.to(device), data.test.labels.to(device)))


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory(device: torch.device) -> int | None:
    """``torch.cuda.max_memory_allocated`` since the last reset; None off CUDA."""
    return torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None


def memory_text(peak: int | None) -> str:
    return "n/a" if peak is None else f"{peak / 2**20:.0f} MiB"


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_evaluation(model: torch.nn.Module, queries: ImageSet, gallery: ImageSet, *, batch_size: int,
                    amp: bool | str, repeats: int) -> EvaluationTiming:
    """The median time of embedding ``gallery`` then ``queries`` with :func:`embed`, as one evaluation does, after
    one warm-up batch (cuDNN's algorithm search, the allocator)."""
    device = next(model.parameters()).device
    embed(model, gallery.images[:batch_size], batch_size=batch_size, amp=amp)
    times, peak = [], None
    for _ in range(repeats):
        reset_peak_memory(device)
        synchronize(device)
        started = time.perf_counter()
        for images in (gallery, queries):
            embed(model, images.images, batch_size=batch_size, amp=amp)
        synchronize(device)
        times.append(time.perf_counter() - started)
        peak = peak_memory(device)
    return EvaluationTiming(len(queries) + len(gallery), statistics.median(times), peak)


def time_records(settings: RunSettings, seed: int = 0) -> float:
    """Seconds of the query-bootstrap part of the T ``metrics.json`` records of a run (``noise_metrics`` after
    tasks 0..T-1, on random hits of the protocol's query count)."""
    rng = np.random.default_rng(seed)
    queries = evaluation_counts(settings)[0]
    evaluation, total = settings.evaluation, 0.0
    for size in range(1, settings.stream.num_tasks + 1):
        hits = rng.random((size * (size + 1) // 2, queries)) < 0.5
        matrix = np.tril(np.full((size, size), 0.5))
        started = time.perf_counter()
        noise_metrics(matrix, queries, hits=hits, replacement_tasks=settings.replacement.tasks,
                      tie_rule=evaluation.tie_rule, confidence=evaluation.confidence, resamples=evaluation.resamples,
                      seed=settings.seed)
        total += time.perf_counter() - started
    return total


def evaluation_model(backbone: str, head: str, device: torch.device, channels_last: bool) -> torch.nn.Module:
    """A freshly built model on ``device``, in the channels-last format when training would leave it so."""
    torch.manual_seed(0)
    model = build_model(backbone=backbone, head=head, num_classes=20).to(device)
    return model.to(memory_format=torch.channels_last) if channels_last else model


def describe(timing: EvaluationTiming, protocol_images: int) -> str:
    return (f"{timing.images} images in {timing.seconds:.2f}s ({timing.images_per_second:.0f} images/s), "
            f"peak memory {memory_text(timing.peak_memory)}; one protocol evaluation ({protocol_images:,} images) "
            f"{timing.seconds_for(protocol_images):.2f}s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backbone", default="resnet18")
    parser.add_argument("--head", default="dsimplex", help="dsimplex (the paper's dsimplex_hoc) | learnable | cosine")
    parser.add_argument("--amp", choices=AMP_CHOICES, default="none")
    parser.add_argument("--channels-last", action="store_true")
    parser.add_argument("--images", type=int, default=None, help="images to embed (default: the protocol's)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--records", action="store_true", help="also time the T metrics.json records")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    device, settings = torch.device(args.device), paper_settings()
    amp = False if args.amp == "none" else args.amp
    protocol_images = sum(evaluation_counts(settings))
    queries, gallery = evaluation_images(args.images or protocol_images, device)
    model = evaluation_model(args.backbone, args.head, device, args.channels_last)
    timing = time_evaluation(model, queries, gallery, batch_size=settings.evaluation.batch_size, amp=amp,
                             repeats=args.repeats)
    autocast = autocast_dtype(amp, device)
    print(f"device {device}, backbone {args.backbone} ({args.head} head), autocast {autocast or 'off'}, channels-last "
          f"{args.channels_last}, batch {settings.evaluation.batch_size}, torch threads {torch.get_num_threads()}")
    print(f"embedding: {describe(timing, protocol_images)}")
    if args.records:
        print(f"metrics records after each of {settings.stream.num_tasks} tasks (query bootstrap, "
              f"{settings.evaluation.resamples} resamples, CPU): {time_records(settings):.2f}s")


if __name__ == "__main__":
    main()
