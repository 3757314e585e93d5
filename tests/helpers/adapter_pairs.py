"""A rotated pair of feature sets of four classes, and an adapter fitted on it in a few steps."""
import torch
import torch.nn.functional as F

from benchmarks.adapted_cases import PairedFeatures
from cl2r_bench.adapters import FeaturePair, fit_adapter, make_adapter

FEW_ROUNDS = {"mini_vec2vec": {"anchor_runs": 2, "qap_runs": 2, "refine_iterations": 2}}
"""mini-vec2vec in 2 of its 30 anchor runs and 2 of its 100 refinements: a fit that exercises the code (its quality
needs the reference's 30 runs, so the tests of what it recovers keep them)."""
FEW_STEPS = {"lambda_orth": {"max_steps": 4}, "fct": {"max_steps": 4}, "fastfill": {"max_steps": 4},
             "drift_adapter": {"max_steps": 4}, "vec2vec": {"max_steps": 4, "width": 16, "discriminator_width": 16},
             **FEW_ROUNDS}
"""The learned adapters in a few steps: fits that exercise the code, not ones that converge."""
SHORT_FITS = {"lambda_orth": {"max_steps": 240, "batch_size": 256, "lr": 0.01, "holdout": 0.0},
              "fct": {"max_steps": 240, "hidden": 128, "holdout": 0.0},
              "fastfill": {"max_steps": 240, "hidden": 128, "holdout": 0.0},
              "drift_adapter": {"max_steps": 240, "hidden": 128, "holdout": 0.0},
              "vec2vec": {"max_steps": 20, "width": 16, "discriminator_width": 16, "holdout": 0.0}}
"""The learned adapters to a usable fit on small pairs, without a held-out share; vec2vec in a few steps of a small
translator only, a fit that exercises the code (its GAN needs far more steps, and recovers no correspondence on
such pairs: tests/adapters/test_adapters.py)."""


def few_steps_options() -> list[str]:
    """:data:`FEW_STEPS` as the command line's ``--set adapter_params.<name>.<key>=<value>`` options."""
    return [option for name, params in FEW_STEPS.items() for key, value in params.items()
            for option in ("--set", f"adapter_params.{name}.{key}={value}")]


def rotated_pair(n: int = 120, dim: int = 8, seed: int = 0) -> tuple[PairedFeatures, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    labels = torch.arange(n) % 4
    old = torch.randn(4, dim, generator=generator)[labels] + 0.5 * torch.randn(n, dim, generator=generator)
    rotation = torch.linalg.qr(torch.randn(dim, dim, generator=generator))[0]
    return PairedFeatures.normalised(old, old @ rotation, labels), rotation


def fitted(name: str, pair: PairedFeatures):
    adapter = make_adapter(name, FEW_STEPS)
    rows = F.normalize(torch.stack([pair.new[pair.labels == c].mean(0) for c in range(4)]), dim=1)
    fit_adapter(adapter, FeaturePair(pair.old, pair.new, pair.labels, new_classifier=rows), seed=0)
    return adapter
