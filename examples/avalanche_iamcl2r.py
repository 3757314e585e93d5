"""Measure your own Avalanche strategy for compatibility on the suite's IAM-CL2R benchmark.

For an Avalanche user, four steps (CPU, generated data, well under a minute)::

    python examples/avalanche_iamcl2r.py [--epochs 1] [--tiny]

1. **The benchmark.** The suite builds the IAM-CL2R stream from its settings (``resolve`` then ``assemble``:
   scenario ``iamcl2r``, data set ``synthetic``, preset ``quick``: 10 + 5 x 6 classes). ``stream.benchmark`` is a
   plain Avalanche class-incremental benchmark whose experiences carry the images: items ``(uint8 image, label,
   task label 0)``, with random crop and flip in the ``train`` transform group. ``stream.query`` and
   ``stream.gallery`` are the retrieval evaluation sets (held-out classes, never trained on).
2. **The model.** A suite ``RetrievalModel`` (backbone + growing linear head) returns ``(logits, features)`` and
   normalises its own uint8 input; ``LogitsOnly`` wraps it so that ``forward`` returns the logits Avalanche
   strategies expect. Its head is grown to the classes seen so far before each experience.
3. **The strategy.** Any ``SupervisedTemplate`` you like, here Avalanche's ``Naive`` (fine-tuning), with your own
   optimizer and settings; add ``CompatibilityPlugin`` to its plugins.
4. **The measurement.** After each ``strategy.train(experience)`` the plugin deploys the model: it embeds the
   gallery once (kept) and the queries, and appends row t of the compatibility matrix, ``M[t][k]`` = top-1
   retrieval accuracy of queries embedded by model t against the gallery embedded by model k (docs/METHODS.md §1, §3).
   ``plugin.metrics()`` gives AC (the share of pairs t > k where model t is compatible with model k), AA and the
   rest (docs/METHODS.md §2). With loggers on the strategy's evaluator, AC_t and AA_t are logged after each experience.

IAM-CL2R also replaces the model by an improved pretrained one at ``stream.replacement_tasks`` (docs/METHODS.md §4).
To include that, load the new model before training on such an experience and hand it over between ``train()``
calls: ``strategies.avalanche.rebind(strategy, new_model, torch.optim.SGD(new_model.parameters(), ...))``. This
example keeps one model throughout (fine-tuning only), so on these short runs expect AC near 0: plain
fine-tuning is not compatible, which is what the benchmark is there to show.
"""
from __future__ import annotations

import argparse
import time

import torch

from benchmarks.avalanche_plugin import CompatibilityPlugin
from cl2r_bench.assembly import assemble
from cl2r_bench.config import resolve
from strategies.avalanche import LogitsOnly
from scenarios.streams import avalanche_warnings_filtered

TINY = {"data": {"synthetic_classes": 24, "synthetic_train_per_class": 24, "synthetic_test_per_class": 6},
        "stream": {"initial_classes": 4, "increment": 4, "num_tasks": 3, "images_per_class": 24},
        "replacement": {"tasks": [0, 2], "pretrain": {"class_counts": [3, 6]}},
        "model": {"small_width": 8, "small_out_dim": 16},
        "evaluation": {"heldout_classes": 6, "queries_per_class": None}}


def main(argv: list[str] | None = None) -> dict:
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
    torch.manual_seed(0)
    model = suite.new_model(len(stream.tasks[0].new_classes), stream.mean, stream.std)

    with avalanche_warnings_filtered():
        from avalanche.training import Naive
        from avalanche.training.plugins import EvaluationPlugin

        compatibility = CompatibilityPlugin.from_stream(stream)
        strategy = Naive(model=LogitsOnly(model), optimizer=torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
                         criterion=torch.nn.CrossEntropyLoss(), train_mb_size=64, train_epochs=args.epochs,
                         eval_mb_size=256, device="cpu", evaluator=EvaluationPlugin(loggers=[]),
                         plugins=[compatibility])

        for experience in stream.benchmark.train_stream:
            model.head.grow(len(experience.classes_seen_so_far))
            strategy.train(experience, eval_streams=[])
            print(f"experience {experience.current_experience}: classes {min(experience.classes_in_this_experience)}"
                  f"-{max(experience.classes_in_this_experience)}, row "
                  + " ".join(f"{100 * v:5.1f}" for v in compatibility.matrix[-1] if v is not None))

    metrics = compatibility.metrics()
    print("compatibility matrix (%), row t = model t's queries against model k's gallery:")
    for row in compatibility.matrix:
        print("  " + " ".join(f"{100 * v:5.1f}" for v in row if v is not None))
    print(f"AC {metrics['AC']:.3f}  AA {metrics['AA']:.2f}  ACA {metrics['ACA']:.2f}  "
          f"({time.perf_counter() - started:.0f} s)")
    return metrics


if __name__ == "__main__":
    main()
