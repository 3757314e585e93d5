"""Benchmark: the suite's training loop (Avalanche template + strategy + trainer) against a plain PyTorch loop, its
speed variants, and the paper protocol's time estimated from measured components.

Both loops train the same model architecture from the same initial weights on the same device-resident data with
the same batches (``DeviceBatches``), optimizer, schedule and loss (the strategy's, with its frozen teacher when it
has one); the suite's loop adds Avalanche's callbacks, the strategy indirection and the progress bar. Runs are
interleaved and repeated; the figure is the ratio of the median times (target <= 1.10; the default invocation is
the small-CNN CPU check the README cites).

Speed variants apply to both loops alike: ``--amp`` (autocast on CUDA; float16 with gradient scaling, as the
template), ``--channels-last`` (model and batches), ``--compile`` (``torch.compile`` of the training forward) and
``--foreach-sgd`` (torch's default SGD update instead of its fused kernel). The suite's loop gets them as
``TrainSettings`` fields (``amp``, ``amp_dtype``, ``channels_last``, ``compile``, ``fused_optimizer``); the plain
loop applies them by hand. Every variant and loop runs once unmeasured first (compilation, cuDNN's algorithm
search). Peak GPU memory is ``torch.cuda.max_memory_allocated`` of each measured run (reset before it; "n/a" off
CUDA). ``--variants`` measures fp32, bf16, bf16+channels-last, bf16+channels-last+compile and fp16 in one run, one
row each, with the speed-up of the suite's loop over its fp32 row.

``--protocol`` adds the time of the 7-task paper protocol (``configs/presets/paper.yaml`` on CIFAR-100, IAM-CL2R):
its iterations per task, counted by the engine's own ``DeviceBatches`` (docs/METHODS.md §4: task 0 ``N // 128``
batches, later tasks ``(N_new + N_mem) // 128`` with 20 exemplars per seen class), times the suite's measured
seconds per iteration, plus T evaluations (``tools/bench_evaluation.py``) and the T metrics records.
It is an estimate from measured components, not a timed run (``runner.py`` is: README, "GPU speed").

    python -m tools.bench_training_loop [--backbone small_cnn] [--images 2048] [--epochs 2] [--repeats 3]
    python -m tools.bench_training_loop --backbone resnet18 --strategy dsimplex_hoc \\
        [--amp bfloat16] [--channels-last] [--compile] [--variants] [--protocol [--eval-images N]]
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from cl2r_bench.data.datasets import ImageSet
from cl2r_bench.data.streams import task_class_counts
from cl2r_bench.data.synthetic import make_synthetic
from cl2r_bench.models import RetrievalModel, autocast_dtype, build_model
from cl2r_bench.settings import RunSettings
from cl2r_bench.strategy import Step
from cl2r_bench.training.engine import DeviceBatches, make_optimizer, scheduled_lr
from cl2r_bench.training.loop import train_task
from cl2r_bench.training_settings import TrainSettings
from strategies import Strategy, get_strategy
from tools.bench_evaluation import (
    AMP_CHOICES,
    EvaluationTiming,
    evaluation_counts,
    evaluation_images,
    memory_text,
    paper_settings,
    peak_memory,
    reset_peak_memory,
    synchronize,
    time_evaluation,
    time_records,
)

CIFAR100_TRAIN_PER_CLASS = 500
"""Training images per CIFAR-100 class (docs/METHODS.md §4: the protocol takes the first 300 of the 500)."""
TARGET_SECONDS = 120.0
"""The goal: the 7-task paper protocol with its evaluation in under 2 minutes on one H100."""


@dataclass(frozen=True)
class Variant:
    """A speed setting applied to both loops."""

    amp: str = "none"
    channels_last: bool = False
    compile: bool | str = False   # True or a torch.compile mode (training.compile)
    fused_optimizer: bool | None = None  # training.fused_optimizer; None: its default

    @property
    def name(self) -> str:
        precision = {"none": "fp32", "float16": "fp16", "bfloat16": "bf16"}[self.amp]
        compiled = [] if self.compile is False else ["compile" if self.compile is True else f"compile-{self.compile}"]
        return "+".join([precision] + ["channels-last"] * self.channels_last + compiled
                        + ["foreach-sgd"] * (self.fused_optimizer is False))

    def settings(self, base: TrainSettings) -> TrainSettings:
        """``base`` with this variant's training fields."""
        amp = self.amp != "none"
        return dataclasses.replace(base, amp=amp, amp_dtype=self.amp if amp else base.amp_dtype,
                                   channels_last=self.channels_last, compile=self.compile,
                                   fused_optimizer=base.fused_optimizer if self.fused_optimizer is None
                                   else self.fused_optimizer)


VARIANTS = (Variant(), Variant("bfloat16"), Variant("bfloat16", True), Variant("bfloat16", True, True),
            Variant("float16"))


@dataclass(frozen=True)
class LoopTime:
    """One measured training run of a loop."""

    seconds: float
    images: int
    iterations: int
    peak_memory: int | None = None


Loop = Callable[[RetrievalModel, ImageSet, TrainSettings, Strategy, RetrievalModel | None], LoopTime]


def teacher_outputs(teacher: RetrievalModel, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The frozen teacher's float32 logits and L2-normalised features, as the template computes them."""
    with torch.no_grad():
        logits, features = teacher(images)
    return logits.float(), F.normalize(features.float(), dim=1)


def plain_loop(model: RetrievalModel, data: ImageSet, settings: TrainSettings, strategy: Strategy,
               teacher: RetrievalModel | None) -> LoopTime:
    """The reference: a hand-written PyTorch loop doing the same work (the teacher frozen as the template freezes
    it), with the same autocast (and float16 gradient scaling), channels-last format and compilation as
    ``settings`` ask of the suite's loop."""
    device = data.images.device
    dtype = autocast_dtype(settings.autocast, device)
    batches = DeviceBatches(data, None, new_batch=settings.batch_size, memory_batch=0,
                            epoch_length=settings.epoch_length, channels_last=settings.channels_last)
    scaler = torch.amp.GradScaler("cuda") if dtype == torch.float16 else None
    if settings.channels_last:
        model.to(memory_format=torch.channels_last)
    forward = model if settings.compile_mode is None else torch.compile(model, mode=settings.compile_mode)
    if teacher is not None:
        teacher.eval().requires_grad_(False)
    optimizer = make_optimizer(model, settings)
    step = images_seen = 0
    model.train()
    started = time.perf_counter()
    for _ in range(settings.epochs):
        for images, labels, from_memory in batches:
            optimizer.zero_grad()
            with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
                logits, features = forward(images)
                teacher_logits, teacher_features = (None, None) if teacher is None else teacher_outputs(teacher, images)
            loss = strategy.loss(Step(labels=labels, targets=model.class_targets(labels), logits=logits.float(),
                                      features=features.float(), from_memory=from_memory,
                                      teacher_features=teacher_features, teacher_logits=teacher_logits))
            (loss if scaler is None else scaler.scale(loss)).backward()
            for group in optimizer.param_groups:
                group["lr"] = scheduled_lr(step, len(batches), settings)
            if scaler is None:
                optimizer.step()
            else:
                scaler.step(optimizer)
                scaler.update()
            step, images_seen = step + 1, images_seen + len(labels)
    synchronize(device)
    return LoopTime(time.perf_counter() - started, images_seen, step)


def suite_loop(model: RetrievalModel, data: ImageSet, settings: TrainSettings, strategy: Strategy,
               teacher: RetrievalModel | None) -> LoopTime:
    """The suite's :func:`train_task` (without a replay memory: batches of ``batch_size`` new samples)."""
    timing = train_task(model, strategy, data, None, settings, teacher=teacher)
    return LoopTime(timing["seconds"], int(timing["images"]), int(timing["iterations"]))


LOOPS: dict[str, Loop] = {"plain": plain_loop, "suite": suite_loop}


@dataclass(frozen=True)
class Bench:
    """What every measured run starts from: the initial model, the teacher (or None), the data, the base training
    settings and the strategy."""

    initial: RetrievalModel
    teacher: RetrievalModel | None
    data: ImageSet
    settings: TrainSettings
    strategy: Strategy

    def run(self, loop: Loop, variant: Variant) -> LoopTime:
        """One run of ``loop`` under ``variant`` from copies of the initial model and teacher, with its peak GPU
        memory. The teacher is in the format a run hands over from task 1 on (a copy of the trained model)."""
        device = self.data.images.device
        model, teacher = copy.deepcopy(self.initial), copy.deepcopy(self.teacher)
        if teacher is not None and variant.channels_last:
            teacher.to(memory_format=torch.channels_last)
        torch.manual_seed(1)
        reset_peak_memory(device)
        timed = loop(model, self.data, variant.settings(self.settings), self.strategy, teacher)
        return dataclasses.replace(timed, peak_memory=peak_memory(device))


def build_bench(args: argparse.Namespace) -> Bench:
    """The bench of the command line: ``--images`` generated 3x32x32 uint8 images of 20 classes on the device."""
    device = torch.device(args.device)
    source = make_synthetic(num_classes=20, train_per_class=args.images // 20 + 1)
    data = source.train.select(torch.arange(args.images))
    data = ImageSet(data.images.to(device), data.labels.to(device))
    strategy = get_strategy(args.strategy).from_params({})
    torch.manual_seed(0)
    initial = build_model(backbone=args.backbone, head=strategy.head, num_classes=20, mean=source.mean,
                          std=source.std).to(device)
    teacher = copy.deepcopy(initial) if strategy.needs_teacher else None
    settings = TrainSettings.with_defaults(epochs=args.epochs, batch_size=args.batch_size, lr=0.01, amp=False,
                                           progress=True)
    return Bench(initial, teacher, data, settings, strategy)


@dataclass(frozen=True)
class Measured:
    """The first (unmeasured: compilation, cuDNN's algorithm search) run and the measured runs of every
    ``(variant name, loop name)``."""

    first: dict[tuple[str, str], LoopTime]
    runs: dict[tuple[str, str], list[LoopTime]]


def measure(bench: Bench, variants: tuple[Variant, ...], repeats: int) -> Measured:
    """``repeats`` interleaved runs of every loop under every variant, after one unmeasured run of each."""
    first = {(v.name, name): bench.run(loop, v) for v in variants for name, loop in LOOPS.items()}
    runs: dict[tuple[str, str], list[LoopTime]] = {key: [] for key in first}
    for _ in range(repeats):
        for variant in variants:
            for name, loop in LOOPS.items():
                runs[variant.name, name].append(bench.run(loop, variant))
    return Measured(first, runs)


def median_seconds(runs: list[LoopTime]) -> float:
    return statistics.median(r.seconds for r in runs)


def images_per_second(runs: list[LoopTime]) -> float:
    return runs[0].images / median_seconds(runs)


def peak_text(runs: list[LoopTime]) -> str:
    peaks = [r.peak_memory for r in runs if r.peak_memory is not None]
    return memory_text(max(peaks) if peaks else None)


def report_single(variant: Variant, measured: Measured) -> None:
    for name in LOOPS:
        runs = measured.runs[variant.name, name]
        print(f"{name:>5}: median {median_seconds(runs):.2f}s  ({images_per_second(runs):.0f} images/s)  peak memory "
              f"{peak_text(runs)}  runs {[round(r.seconds, 2) for r in runs]}  "
              f"first run {measured.first[variant.name, name].seconds:.2f}s")
    ratio = median_seconds(measured.runs[variant.name, "suite"]) / median_seconds(measured.runs[variant.name, "plain"])
    print(f"ratio suite / plain = {ratio:.3f} (target <= 1.10)")


def variant_row(variant: Variant, measured: Measured, reference: float) -> list[str]:
    """The cells of ``variant``'s row of :func:`report_variants`."""
    suite, plain = measured.runs[variant.name, "suite"], measured.runs[variant.name, "plain"]
    first = "/".join(f"{measured.first[variant.name, name].seconds:.1f}" for name in LOOPS)
    return [variant.name, f"{images_per_second(suite):.0f}", f"{images_per_second(plain):.0f}",
            f"{median_seconds(suite) / median_seconds(plain):.3f}", peak_text(suite), peak_text(plain),
            f"{images_per_second(suite) / reference:.2f}x", first]


def report_variants(variants: tuple[Variant, ...], measured: Measured) -> None:
    """One Markdown row per variant; the speed-up is the suite's images/s over its first (fp32) row's."""
    reference = images_per_second(measured.runs[variants[0].name, "suite"])
    header = ["variant", "suite images/s", "plain images/s", "time suite/plain", "peak suite", "peak plain",
              f"suite x {variants[0].name}", f"first run {'/'.join(LOOPS)} s"]
    rows = [header] + [variant_row(v, measured, reference) for v in variants]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = [[cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths, strict=True))]
             for row in rows]
    lines.insert(1, ["-" * w for w in widths])
    print("\n".join("| " + " | ".join(line) + " |" for line in lines))


def protocol_iterations(settings: RunSettings, uses_memory: bool) -> list[int]:
    """The training iterations of each task of the protocol, counted as :func:`train_task` counts them: epochs x
    ``len(DeviceBatches)`` of the task's new images and the replay memory held before it (``memory_per_class``
    exemplars of every class seen, ``engine.update_memory``; none when the strategy does not replay)."""
    stream, training = settings.stream, settings.training
    per_class = min(stream.images_per_class or CIFAR100_TRAIN_PER_CLASS, CIFAR100_TRAIN_PER_CLASS)
    iterations, seen = [], 0
    for classes in task_class_counts(stream.initial_classes, stream.increment, stream.num_tasks):
        memory = seen * min(training.memory_per_class, per_class) if uses_memory and seen else 0
        batches = DeviceBatches(sized(classes * per_class), sized(memory) if memory else None,
                                new_batch=training.new_batch_size if memory else training.batch_size,
                                memory_batch=training.memory_batch_size, epoch_length=training.epoch_length)
        iterations.append(training.epochs * len(batches))
        seen += classes
    return iterations


def sized(count: int) -> ImageSet:
    """An image set of ``count`` items holding no pixels: all that ``len(DeviceBatches)`` reads."""
    return ImageSet(torch.empty(count, 0), torch.zeros(count, dtype=torch.long))


def time_variant_evaluation(bench: Bench, variant: Variant, evaluation: tuple[ImageSet, ImageSet], batch_size: int,
                            repeats: int) -> EvaluationTiming:
    """One evaluation's embedding time of ``(queries, gallery)`` for the bench's model under ``variant``
    (bench_evaluation.py)."""
    model = copy.deepcopy(bench.initial)
    if variant.channels_last:
        model.to(memory_format=torch.channels_last)
    return time_evaluation(model, *evaluation, batch_size=batch_size, amp=variant.settings(bench.settings).autocast,
                           repeats=repeats)


def report_protocol(bench: Bench, variants: tuple[Variant, ...], measured: Measured, args: argparse.Namespace) -> None:
    """The paper protocol's time per variant: measured seconds per iteration x its iterations, plus T evaluations
    and T metrics records (module docstring)."""
    settings = paper_settings(args.strategy)
    iterations = protocol_iterations(settings, bench.strategy.uses_memory)
    tasks, protocol_images = settings.stream.num_tasks, sum(evaluation_counts(settings))
    records, device = time_records(settings), bench.data.images.device
    evaluation_set = evaluation_images(args.eval_images or protocol_images, device)
    print(f"\npaper protocol, an ESTIMATE from measured components ({settings.scenario} / {args.strategy} on "
          f"{settings.dataset}, {tasks} tasks x {settings.training.epochs} epochs, "
          f"batch {settings.training.batch_size}):"
          f"\n  measured with backbone {args.backbone}, batch {args.batch_size} (the preset's: "
          f"{settings.model.backbone}, {settings.training.batch_size})"
          f"\n  iterations per task {iterations} = {sum(iterations)}; {tasks} evaluations of {protocol_images:,} "
          f"images; {tasks} metrics records (query bootstrap, CPU) {records:.1f}s")
    for variant in variants:
        suite = measured.runs[variant.name, "suite"]
        per_iteration = median_seconds(suite) / suite[0].iterations
        evaluation = time_variant_evaluation(bench, variant, evaluation_set, settings.evaluation.batch_size,
                                             args.repeats)
        train, evaluate = sum(iterations) * per_iteration, tasks * evaluation.seconds_for(protocol_images)
        total = train + evaluate + records
        print(f"  {variant.name}: training {per_iteration * 1000:.1f} ms/iteration -> {train:.1f}s; evaluation "
              f"{evaluation.images_per_second:.0f} images/s (peak {memory_text(evaluation.peak_memory)}) -> "
              f"{evaluate:.1f}s; total {total:.1f}s = {total / 60:.1f} min (target on one H100: < "
              f"{TARGET_SECONDS:.0f}s; {'met' if total < TARGET_SECONDS else 'not met'} on {device})")
    print(f"  not included: reading CIFAR and building the stream, start-up, the replacement models' pretraining "
          f"(cached per study) and the first run's scoring of its {len(settings.replacement.tasks)} starting models "
          f"({len(settings.replacement.tasks)} more evaluations, cached)")


def add_loop_arguments(parser: argparse.ArgumentParser, *, backbone: str, strategy: str, images: int, epochs: int,
                       amp: str) -> None:
    """The options of the bench a loop runs on (:func:`build_bench`) and of its variant, with the defaults given:
    this script's and ``tools/profile_training.py``'s."""
    parser.add_argument("--backbone", default=backbone)
    parser.add_argument("--strategy", default=strategy, help="er (no teacher) | dsimplex_hoc (the paper's: a teacher)")
    parser.add_argument("--images", type=int, default=images)
    parser.add_argument("--epochs", type=int, default=epochs)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--amp", choices=AMP_CHOICES, default=amp)
    parser.add_argument("--channels-last", action="store_true")
    parser.add_argument("--compile", nargs="?", const=True, default=False, metavar="MODE",
                        help="torch.compile the forward, in MODE if given (training.compile: reduce-overhead, ...)")
    parser.add_argument("--foreach-sgd", action="store_true",
                        help="SGD's multi-tensor update instead of the fused kernel (training.fused_optimizer: false)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")


def loop_variant(args: argparse.Namespace) -> Variant:
    """The variant the options of :func:`add_loop_arguments` ask for."""
    return Variant(args.amp, args.channels_last, args.compile, False if args.foreach_sgd else None)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_loop_arguments(parser, backbone="small_cnn", strategy="er", images=2048, epochs=2, amp="none")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--variants", action="store_true", help="fp32, bf16, bf16+channels-last, "
                        "bf16+channels-last+compile, fp16, each with the fused SGD update (ignores --amp, "
                        "--channels-last, --compile, --foreach-sgd)")
    parser.add_argument("--protocol", action="store_true", help="estimate the 7-task paper protocol's time")
    parser.add_argument("--eval-images", type=int, default=None,
                        help="images embedded to time an evaluation (default: the protocol's 60,000)")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    bench = build_bench(args)
    variants = VARIANTS if args.variants else (loop_variant(args),)
    measured = measure(bench, variants, args.repeats)
    device = bench.data.images.device
    print(f"device {device}, backbone {args.backbone}, strategy {args.strategy}, {args.images} images x "
          f"{args.epochs} epochs, batch {args.batch_size}, {args.repeats} interleaved repeats, "
          f"torch threads {torch.get_num_threads()}")
    if device.type != "cuda" and any(v.amp != "none" for v in variants):
        print("autocast runs on CUDA only (models.autocast_dtype): the fp16 / bf16 variants run in fp32 here")
    if args.variants:
        report_variants(variants, measured)
    else:
        print(f"variant {variants[0].name}")
        report_single(variants[0], measured)
    if args.protocol:
        report_protocol(bench, variants, measured, args)


if __name__ == "__main__":
    main()
