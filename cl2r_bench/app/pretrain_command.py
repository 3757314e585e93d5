"""``runner.py pretrain``: find or pretrain each asked run's starting models before the runs (the scenario's
replacement models, or model_update's old and new models)."""
from __future__ import annotations

import argparse


def command_pretrain(args: argparse.Namespace) -> int:
    """Find or pretrain the starting models of each asked run (the scenario's replacement or old/new models)."""
    from cl2r_bench.app.run_options import requested_runs
    from cl2r_bench.models import replacement_family

    done = set()
    for parts in requested_runs(args):
        settings = parts.settings
        if parts.scenario.measures_features():
            print(f"{settings.scenario} on encoder specs trains nothing: each split is embedded once per encoder into "
                  f"{settings.model_update.feature_cache} when it first runs")
            continue
        key = (settings.scenario, replacement_family(parts.head), settings.dataset,
               settings.replacement.pretrain.dataset)
        if key not in done:
            done.add(key)
            made = parts.scenario.starting_models(parts.scenario.stream(), parts.head, parts.device, print)
            if not made:
                print(f"{settings.scenario} starts from no pretrained model: nothing to pretrain (iamcl2r pretrains "
                      "its replacement models, model_update its old and new models)")
    return 0
