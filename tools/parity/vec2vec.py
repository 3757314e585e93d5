"""Parity of vec2vec with the authors' code on one step (results/parity/README.md).

    python -m tools.parity.vec2vec --vec2vec REF/vec2vec [--reference-python PYTHON] [--out results/parity/vec2vec.json]

The same unpaired batch (the old model's features of some items, the new model's of others, not normalised) and
the same translator and discriminator weights go to both codes: ``vec2vec_probe.py`` runs one step of
``rjha18/vec2vec``'s ``train.training_loop_`` on their ``TransformTranslator`` and ``LeastSquaresGAN``\\ s under the
reference's Python (``configs/unsupervised.toml`` with small widths, its depths, loss weights and optimisers;
``Dropout`` off on both sides, no warm-up so that the discriminators' first Adam step moves them), this script
the suite's :meth:`cl2r_bench.adapters.vec2vec.Vec2Vec.train_step`. The old space is their ``sup_emb``. Each row
reports the largest absolute difference: each loss term, the total, the three discriminators' losses, the
translator's gradients, each discriminator's gradients and its weights after its Adam step, the BatchNorm running
statistics after the step, and the two maps in eval mode. Each loss term moves the total by more than 0.05 on
these inputs (the ``differences`` entry; ``tests/adapters/test_vec2vec.py`` checks it), so a total that agrees checks
every term. The reference folder is an extracted copy, not a git checkout: its commit is read from ``COMMIT.txt`` when
git has none.
"""
from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F

from cl2r_bench.adapters import make_adapter
from cl2r_bench.adapters.vec2vec import LATENT, NEW, OLD, GanSide, Vec2Vec, generator_loss
from tools.parity.common import (
    ROOT,
    provenance,
    reference_checkout,
    reference_python,
    run_reference_probe,
)
from tools.parity.steps import row

OLD_WIDTH, NEW_WIDTH, WIDTH, DISC_WIDTH, BATCH = 48, 40, 32, 24, 24
"""Both spaces wider than the latent, so that the input adapters truncate their residual and the output adapters
pad theirs; the spaces of different widths."""
TOLERANCE = 1e-5
SETTINGS = {"width": WIDTH, "discriminator_width": DISC_WIDTH, "dropout": 0.0, "warmup_steps": 0,
            "lr": 2e-5, "disc_lr": 1e-3, "batch_size": BATCH}
"""The suite's settings for the check: the authors' depths (3, 4, 5), loss weights, optimisers and clipping (the
suite's defaults), small widths, no dropout, no warm-up, and a discriminator learning rate large enough for its
first step to change the generator's adversarial terms."""
REFERENCE_SETTINGS = {"sup_emb": OLD, "unsup_emb": NEW, "dataset": "fmri_parity", "mixed_precision": "no",
                      "d_adapter": WIDTH, "d_hidden": WIDTH, "d_transform": WIDTH, "disc_dim": DISC_WIDTH,
                      "warmup_length": 0, "lr": 2e-5, "disc_lr": 1e-3, "bs": BATCH}
"""The same, in ``configs/unsupervised.toml``'s names (every other value theirs)."""
TERMS = {"rec_loss": "rec", "vsp_loss": "vsp", "cc_trans_loss": "cycle", "cc_vsp_loss": "cycle_vsp",
         "gen_loss": "gen_new", "sup_gen_loss": "gen_old", "latent_gen_loss": "gen_latent"}
"""Their logged loss -> the suite's term."""
WEIGHTS = {"rec": "rec_weight", "vsp": "vsp_weight", "cycle": "cycle_weight", "cycle_vsp": "cycle_vsp_weight",
           "adversarial (both output spaces)": "adversarial_weight", "latent adversarial": "latent_adversarial_weight"}
DISCRIMINATORS = {"disc_loss": NEW, "sup_disc_loss": OLD, "latent_disc_loss": LATENT}


def batch_inputs(seed: int = 0) -> dict:
    """An unpaired batch: old features of some items and new features of others, around class directions of
    their own space, three times unit length (so that both codes' normalisation is exercised); a seeded
    translator and three seeded discriminators (moved away from their initial zero biases and unit norms)."""
    gen = torch.Generator().manual_seed(seed)
    labels = torch.arange(BATCH) % 6

    def around(width: int) -> torch.Tensor:
        directions = torch.randn(6, width, generator=gen)
        return 3.0 * F.normalize(directions[labels[torch.randperm(BATCH, generator=gen)]]
                                 + 0.6 * torch.randn(BATCH, width, generator=gen), dim=1)

    adapter = new_adapter()
    gans = discriminators(adapter)
    with torch.no_grad():
        for module in [adapter.translator, *(gan.discriminator for gan in gans.values())]:
            for name, value in module.named_parameters():
                if name.endswith("bias") or value.dim() == 1:
                    value.add_(0.1 * torch.randn(value.shape, generator=gen))
    return {"old": around(OLD_WIDTH), "new": around(NEW_WIDTH), "translator": adapter.translator.state_dict(),
            "discriminators": {space: gan.discriminator.state_dict() for space, gan in gans.items()},
            "settings": REFERENCE_SETTINGS}


def new_adapter(params: dict | None = None) -> Vec2Vec:
    torch.manual_seed(1)
    adapter = make_adapter("vec2vec", {"vec2vec": {**SETTINGS, **(params or {})}})
    adapter.dims = (OLD_WIDTH, NEW_WIDTH, 0)
    adapter.build(*adapter.dims)
    return adapter.train()


def discriminators(adapter: Vec2Vec) -> dict[str, GanSide]:
    c, device = adapter.config, torch.device("cpu")
    return {NEW: GanSide(NEW_WIDTH, c, device), OLD: GanSide(OLD_WIDTH, c, device), LATENT: GanSide(c.width, c, device)}


def suite_step(inputs: dict, params: dict | None = None) -> dict:
    """One step of the suite's fit on the batch: the loss and its terms, the discriminators' losses, the
    gradients, the discriminators after their step, the running statistics and the two maps (eval mode, before
    the step)."""
    adapter = new_adapter(params)
    adapter.translator.load_state_dict(inputs["translator"])
    gans = discriminators(adapter)
    for space, gan in gans.items():
        gan.discriminator.load_state_dict(inputs["discriminators"][space])
    adapter.eval()
    with torch.no_grad():
        maps = {"backward": adapter.backward(inputs["new"]), "forward": adapter.forward(inputs["old"])}
    adapter.train()
    ins = {OLD: F.normalize(inputs["old"], dim=1), NEW: F.normalize(inputs["new"], dim=1)}
    loss, terms = adapter.train_step(ins, gans)
    adapter.translator.zero_grad(set_to_none=True)
    loss.backward()
    state = adapter.translator.state_dict()
    return {"loss": float(loss.detach()), "terms": {k: float(v.detach()) for k, v in terms.items()},
            "discriminator_losses": {space: gan.last_loss for space, gan in gans.items()},
            "translator_grads": {n: p.grad for n, p in adapter.translator.named_parameters() if p.grad is not None},
            "discriminator_grads": {space: {n: p.grad for n, p in gan.discriminator.named_parameters()}
                                    for space, gan in gans.items()},
            "discriminators_after": {space: gan.discriminator.state_dict() for space, gan in gans.items()},
            "running_statistics": {k: v for k, v in state.items()
                                   if k.endswith(("running_mean", "running_var", "num_batches_tracked"))},
            "maps": maps}


def largest(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], relative: bool = False) -> float:
    """The largest absolute difference of same-named tensors (``relative``: divided by ``max(1, |b|)``); infinite
    when the names differ."""
    if set(a) != set(b):
        return float("inf")
    return max(float(((a[name].double() - b[name].double()).abs()
                      / (b[name].double().abs().clamp(min=1) if relative else 1)).max()) for name in b)


def unstepped_terms(inputs: dict) -> dict[str, float]:
    """The generator's adversarial terms had the suite read the discriminators before their step."""
    adapter = new_adapter()
    adapter.translator.load_state_dict(inputs["translator"])
    gans = discriminators(adapter)
    for space, gan in gans.items():
        gan.discriminator.load_state_dict(inputs["discriminators"][space])
    ins = {OLD: F.normalize(inputs["old"], dim=1), NEW: F.normalize(inputs["new"], dim=1)}
    with torch.no_grad():
        _, translations, latents = adapter.translator(ins)
        fakes = {NEW: translations[NEW][OLD], OLD: translations[OLD][NEW], LATENT: latents[NEW]}
        return {f"gen_{space}": float(generator_loss(gans[space].discriminator(fake))) for space, fake in fakes.items()}


def term_moves(inputs: dict) -> dict:
    """How much each term moves the total on these inputs: the total less the total with that weight at 0."""
    full = suite_step(inputs)["loss"]
    return {term: full - suite_step(inputs, {weight: 0.0})["loss"] for term, weight in WEIGHTS.items()}


def compare(reference: dict, inputs: dict) -> tuple[list[dict], list[dict]]:
    ours, theirs = suite_step(inputs), reference["losses"]
    rows = []
    for name, term in TERMS.items():
        rows.append(row(f"vec2vec: {name} ({term})", abs(ours["terms"][term] - theirs[name]), TOLERANCE,
                        f"theirs {theirs[name]:.6f}, ours {ours['terms'][term]:.6f}"))
    rows.append(row("vec2vec: generator loss (the total)", abs(ours["loss"] - theirs["loss"]), TOLERANCE,
                    f"rec + vsp + 10 cc_vsp + 10 cc_trans + gen + sup_gen + latent_gen; theirs {theirs['loss']:.6f}, "
                    f"ours {ours['loss']:.6f}; their zero-weight terms cc_rec {theirs['cc_rec_loss']:.4f} and "
                    f"reverse_rec {theirs['reverse_rec_loss']:.4f} are not computed by the suite"))
    for name, space in DISCRIMINATORS.items():
        ours_value = ours["discriminator_losses"][space]
        rows.append(row(f"vec2vec: {name} (the {space} discriminator's least-squares loss, before its step)",
                        abs(ours_value - theirs[name]), TOLERANCE, f"theirs {theirs[name]:.6f}, ours {ours_value:.6f}"))
    rows.append(row(f"vec2vec: the translator's gradients ({len(ours['translator_grads'])} tensors)",
                    largest(ours["translator_grads"], reference["translator_grads"]), TOLERANCE,
                    f"their generator's gradient norm {reference['grad_norm']:.4g} (clipped above 1000)"))
    for space in (NEW, OLD, LATENT):
        rows.append(row(f"vec2vec: the {space} discriminator's gradients", largest(
            ours["discriminator_grads"][space], reference["discriminator_grads"][space]), TOLERANCE,
            "from its least-squares loss on the detached batch"))
        rows.append(row(f"vec2vec: the {space} discriminator's weights after its Adam step", largest(
            ours["discriminators_after"][space], reference["discriminators_after"][space]), TOLERANCE,
            f"lr {SETTINGS['disc_lr']}, betas (0.5, 0.999), eps 6.25e-10; the generator's adversarial term reads "
            "these weights"))
    rows.append(row("vec2vec: BatchNorm running statistics and batch counts after the step (difference relative to "
                    "max(1, |value|))", largest(ours["running_statistics"], reference["running_statistics"],
                                                relative=True), TOLERANCE,
                    "their order of adapter calls, the cycle's reconstructions included; the running variances "
                    "reach about 40, where float32 steps are about 4e-6"))
    for direction, (source, target) in (("backward", (NEW, OLD)), ("forward", (OLD, NEW))):
        rows.append(row(f"vec2vec: the {direction} map in eval mode (their translate_embeddings {source} -> "
                        f"{target})", float((ours["maps"][direction] - reference["maps"][direction]).abs().max()),
                        TOLERANCE, "before the step; BatchNorm from its running statistics"))
    before = unstepped_terms(inputs)
    differences = [{"name": "how much each term moves the total on these inputs (each above 0.05, so the total's "
                            "row checks it)", **term_moves(inputs),
                    "note": "the total less the total with that weight at 0"},
                   {"name": "the generator's adversarial terms had the suite read the discriminators before their "
                            "step", "max_abs_diff": max(abs(before[k] - ours["terms"][k]) for k in before),
                    "note": "so the rows of those terms check that each discriminator steps first"}]
    return rows, differences


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vec2vec", required=True, help="a checkout (or extracted copy) of rjha18/vec2vec")
    parser.add_argument("--reference-python", help="a Python with torch, accelerate, toml, tqdm, wandb, datasets, "
                                                   "scikit-learn, matplotlib and seaborn (default: venv/bin/python "
                                                   "beside the checkout)")
    parser.add_argument("--out", default=str(ROOT / "results/parity/vec2vec.json"))
    args = parser.parse_args(argv)
    vec2vec = reference_checkout(args.vec2vec, "utils/gan.py", "rjha18/vec2vec")
    python = reference_python(args.reference_python, vec2vec, "make the reference's environment")
    inputs = batch_inputs()
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        torch.save(inputs, work / "inputs.pt")
        reference = run_reference_probe(python, "vec2vec_probe.py", "--vec2vec", vec2vec, work)
    rows, differences = compare(reference, inputs)
    record = provenance({"vec2vec": ("rjha18/vec2vec", vec2vec)})
    commit_file = vec2vec / "COMMIT.txt"
    if record["references"]["vec2vec"]["commit"].startswith("unknown") and commit_file.is_file():
        record["references"]["vec2vec"]["commit"] = commit_file.read_text().split()[-1]
    Path(args.out).write_text(json.dumps({**record, "rows": rows, "differences": differences}, indent=1) + "\n")
    for r in rows:
        print(f"{'ok ' if r['agree'] else 'NO '} {r['name']}: {r['max_abs_diff']} (tolerance {r['tolerance']})")
    for difference in differences:
        print(f"    {difference['name']}: " + ", ".join(f"{k} {v:.4g}" for k, v in difference.items()
                                                        if isinstance(v, float)))


if __name__ == "__main__":
    main()
