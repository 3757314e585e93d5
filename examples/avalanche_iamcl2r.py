"""Measure your own Avalanche strategy for compatibility on the suite's IAM-CL2R benchmark, replacements included.

For an Avalanche user, five steps (CPU, generated data; under a minute on 2 cores, the first run's pretraining of
the replacement models included)::

    python examples/avalanche_iamcl2r.py [--epochs 1] [--tiny]

1. **The benchmark.** The suite builds the IAM-CL2R stream from its settings (``resolve`` then ``assemble``:
   scenario ``iamcl2r``, data set ``synthetic``, preset ``quick``: 10 + 5 x 6 classes, replacements at experiences
   0, 2 and 4). ``stream.benchmark`` is a plain Avalanche class-incremental benchmark whose experiences carry the
   images: items ``(uint8 image, label, task label 0)``, with random crop and flip in the ``train`` transform
   group. ``stream.query`` and ``stream.gallery`` are the retrieval evaluation sets (held-out classes, never
   trained on).
2. **The replacement models.** IAM-CL2R replaces the model at ``stream.replacement_tasks`` by an improved
   pretrained one and goes on training it (docs/METHODS.md §4).
   ``suite.scenario.starting_models(stream, suite.head, suite.device, print)`` returns one
   ``{"task", "path", ...}`` per replacement: your own files (``replacement.checkpoints``) or models the suite
   pretrains on growing class sets disjoint from the stream and the evaluation classes, cached in
   ``results/replacement_models/`` under the working directory (the first run pretrains them: about half a minute
   more).
3. **The model.** A suite ``RetrievalModel`` (backbone + growing linear head, ``suite.new_model``) returns
   ``(logits, features)`` and normalises its own uint8 input; ``LogitsOnly`` wraps it so that ``forward`` returns
   the logits Avalanche strategies expect. With a replacement at experience 0 the model you build the strategy
   with is only a placeholder: it is replaced before anything is trained.
4. **The strategy.** Any ``SupervisedTemplate`` you like, here Avalanche's ``Naive`` (fine-tuning) with your own
   optimizer and settings, and two plugins:
   ``ReplacementPlugin.from_files({task: path}, build, load=suite.scenario.load_starting_model)`` from
   ``cl2r_bench.training.avalanche`` swaps in ``build()`` with the file loaded (classifier dropped) at each replacement
   experience, re-points your optimizer at the new parameters, and grows the head to the classes seen so far
   before every experience (no ``model.head.grow`` by hand); ``CompatibilityPlugin`` from
   ``benchmarks.avalanche_plugin`` measures.
5. **The measurement.** After each ``strategy.train(experience)`` the compatibility plugin deploys
   ``strategy.model`` (the replacement, at a replacement experience): it embeds the gallery once (kept) and the
   queries, and appends row t of the compatibility matrix, ``M[t][k]`` = top-1 retrieval accuracy of queries
   embedded by model t against the gallery embedded by model k (docs/METHODS.md §1, §3). ``plugin.metrics()`` gives
   AC (the share of pairs t > k where model t is compatible with model k), AA, ACA and the rest (docs/METHODS.md
   §2). With loggers on the strategy's evaluator, AC_t and AA_t are logged after each experience.

Plain fine-tuning across independently pretrained replacements is not compatible, so expect AC near 0 and low
entries left of each replacement's diagonal: the baseline a compatibility strategy has to beat.
"""
from __future__ import annotations

import argparse
import time

import torch

from benchmarks.avalanche_plugin import CompatibilityPlugin
from cl2r_bench.app.assembly import assemble
from cl2r_bench.config import resolve
from cl2r_bench.data.avalanche_import import avalanche_warnings_filtered
from cl2r_bench.models import RetrievalModel
from cl2r_bench.training.avalanche import LogitsOnly, ReplacementPlugin

TINY = {"data": {"synthetic_classes": 24, "synthetic_train_per_class": 24, "synthetic_test_per_class": 6},
        "stream": {"initial_classes": 4, "increment": 4, "num_tasks": 3, "images_per_class": 24},
        "replacement": {"tasks": [0, 2], "pretrain": {"class_counts": [3, 6], "epochs": 1}},
        "model": {"small_width": 8, "small_out_dim": 16},
        "evaluation": {"heldout_classes": 6, "queries_per_class": None}}


def main(argv: list[str] | None = None) -> dict:
    """Run Naive with replacements on the suite's IAM-CL2R stream, print each experience's matrix row, the matrix
    and AC / AA / ACA, and return the metrics (``CompatibilityPlugin.metrics``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=1, help="training epochs per experience (default 1)")
    parser.add_argument("--tiny", action="store_true", help="a 3-experience stream on a few images (tests)")
    args = parser.parse_args(argv)
    started = time.perf_counter()

    layers = [("example", {"scenario": "iamcl2r", "strategy": "avalanche:Naive", "dataset": "synthetic",
                           "preset": "quick"})]
    if args.tiny:
        layers.append(("example --tiny", TINY))
    suite = assemble(resolve(layers))
    stream = suite.scenario.stream()
    starting = suite.scenario.starting_models(stream, suite.head, suite.device, print)
    torch.manual_seed(0)

    def build() -> RetrievalModel:
        return suite.new_model(len(stream.tasks[0].new_classes), stream.mean, stream.std)

    model = build()
    with avalanche_warnings_filtered():
        from avalanche.training import Naive
        from avalanche.training.plugins import EvaluationPlugin

        replacement = ReplacementPlugin.from_files({m["task"]: m["path"] for m in starting}, build,
                                                   load=suite.scenario.load_starting_model)
        compatibility = CompatibilityPlugin.from_stream(stream)
        strategy = Naive(model=LogitsOnly(model), optimizer=torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
                         criterion=torch.nn.CrossEntropyLoss(), train_mb_size=64, train_epochs=args.epochs,
                         eval_mb_size=256, device=suite.device, evaluator=EvaluationPlugin(loggers=[]),
                         plugins=[replacement, compatibility])

        for experience in stream.benchmark.train_stream:
            strategy.train(experience, eval_streams=[])
            t = experience.current_experience
            how = "replaced, then trained" if t in replacement.replaced else "fine-tuned"
            print(f"experience {t}: classes {min(experience.classes_in_this_experience)}"
                  f"-{max(experience.classes_in_this_experience)}, {how}, row "
                  + " ".join(f"{100 * v:5.1f}" for v in compatibility.matrix[-1] if v is not None))

    metrics = compatibility.metrics()
    print(f"compatibility matrix (%), replacements at experiences {replacement.replaced}, "
          "row t = model t's queries against model k's gallery:")
    for row in compatibility.matrix:
        print("  " + " ".join(f"{100 * v:5.1f}" for v in row if v is not None))
    print(f"AC {metrics['AC']:.3f}  AA {metrics['AA']:.2f}  ACA {metrics['ACA']:.2f}  "
          f"({time.perf_counter() - started:.0f} s)")
    return metrics


if __name__ == "__main__":
    main()
