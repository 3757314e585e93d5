"""IAM-CL2R: CL2R in which the model is replaced at ``replacement.tasks`` by an improved pretrained one
(docs/METHODS.md §4).

A replacement task starts from the user's checkpoint or a pretrained encoder named by spec (``replacement.checkpoints``:
a file, or ``timm:...`` / ``torchvision:...`` / ``suite:...`` of :mod:`cl2r_bench.encoders`, whose trunk and
preprocessing get the strategy's head: for the d-Simplex family a fresh lift of its features) or from a model the suite
pretrains on growing class subsets disjoint from the stream and its evaluation classes (``replacement.pretrain``),
cached and shared by every strategy and seed of a study; its classifier is dropped and a new one grown. On the
pretrained-backbone track (``model.encoders``, docs/METHODS.md §4b) the suite pretrains each replacement's embedding
network on the features of its own, improved encoder.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from cl2r_bench.data.streams import Stream
from cl2r_bench.encoders import is_spec
from cl2r_bench.models import replacement_family
from cl2r_bench.scenario import Scenario, register_scenario
from cl2r_bench.training.pretrain import pretrained_replacement


@register_scenario("iamcl2r")
class IAMCL2R(Scenario):
    """Fine-tuning with replacements by improved pretrained models."""

    def starting_models(self, stream: Stream, head: str, device: torch.device,
                        log: Callable[[str], None]) -> list[dict[str, Any]]:
        """The user's files, or suite-pretrained models; paths are absolute, so a run resumed from another working
        directory finds them. Counts of checkpoints and classes are checked by :func:`cl2r_bench.config.validate`."""
        rep, s = self.settings.replacement, self.settings
        tasks = stream.replacement_tasks
        if rep.checkpoints:
            return [{"task": t, "path": p, "source": "encoder"} if is_spec(p) else
                    {"task": t, "path": str(Path(p).resolve()), "source": "user"}
                    for t, p in zip(tasks, rep.checkpoints, strict=True)]
        pre = rep.pretrain
        same = pre.dataset == s.dataset
        reserved = set(stream.reserved_classes) if same else set()
        order = stream.class_order if same else list(range(self.read_data(pre.dataset).num_classes))
        pool = [c for c in order if c not in reserved]
        out = []
        for task, count, seed in zip(tasks, pre.class_counts, pre.seeds(len(tasks)), strict=True):
            source = self.read_data(pre.dataset, self.model_encoder(task))
            path, cached = pretrained_replacement(
                source, pool[:count], head=replacement_family(head), model_kwargs=s.model.build_kwargs,
                settings=pre.train_settings(s.training), images_per_class=pre.images_per_class, device=device,
                seed=seed, cache_dir=pre.cache_dir, plateau=pre.plateau, log=log)
            log(f"replacement model for task {task}: {path} ({'cached' if cached else 'pretrained now'})")
            out.append({"task": task, "path": str(path.resolve()), "source": "cached" if cached else "pretrained",
                        "classes": count, "family": replacement_family(head),
                        **self.encoder_entry(task)})
        return out
