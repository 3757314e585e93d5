"""The reference side of vec2vec's parity check: run under a Python environment with torch, accelerate, toml,
tqdm, wandb, datasets, scikit-learn, matplotlib and seaborn.

    <reference venv>/bin/python tools/parity/vec2vec_probe.py --vec2vec PATH --work DIR

``DIR/inputs.pt`` (written by ``tools/parity/vec2vec.py``) holds one batch of each space (the old model's
features of some items, the new model's of others: unpaired, not normalised), the translator's and the three
discriminators' weights, and the settings that differ from ``configs/unsupervised.toml`` (small widths, the
learning rates, no warm-up, no dropout). This script builds the authors' own objects (``rjha18/vec2vec``):
``utils.utils.load_n_translator`` (their ``TransformTranslator`` of ``MLPWithResidual`` adapters and
backbone), three ``translators.Discriminator.Discriminator`` with Adam optimisers and ``LambdaLR`` schedules as
``train.py``'s ``main`` makes them, wrapped in ``utils.gan.LeastSquaresGAN``, and runs one step of
``train.training_loop_`` on a one-batch loader of each space (their precomputed-embeddings path: a ``dataset``
name that starts with ``fmri``). The old space is their ``sup_emb``, the new one ``unsup_emb``.

It writes to ``DIR/reference.pt``: the losses their loop logs (each term, the total, the three discriminators'),
the translator's gradients (the generator's optimiser is a stand-in that keeps them), the discriminators'
gradients and their weights after their Adam step, the translator's BatchNorm running statistics after the step,
and ``translate_embeddings`` in both directions, in eval mode, before the step. It imports nothing of the suite and
copies none of the authors' code. Stand-ins: the generator's optimiser; their wandb logger (a recorder of
``logkv``); the similarity GAN (weight 0: their loop only reads its discriminator's gradient norm); and modules
their packages import for code this check never runs (``nltk``, ``evaluate``, ``sentence_transformers``,
``vec2text``, ``beir``, ``diffusers``, ``transformers``: encoders, text inversion, retrieval data sets, UNet
backbones). ``Dropout``'s ``p`` is set to 0 in their translator (the masks are random draws, and their loop draws
noise between the two passes).
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import types
from pathlib import Path

import torch
from torch import nn

STUBBED = ("nltk", "evaluate", "sentence_transformers", "vec2text", "vec2text.models", "beir", "beir.datasets",
           "beir.datasets.data_loader_hf", "diffusers", "transformers")


def stand_in_imports() -> None:
    """Modules their packages import for code this check never runs (module docstring): any attribute is a class."""
    def stand_in(attribute: str) -> type:
        if attribute.startswith("__"):
            raise AttributeError(attribute)
        return type(attribute, (), {})

    for name in STUBBED:
        module = types.ModuleType(name)
        module.__getattr__ = stand_in
        sys.modules.setdefault(name, module)


class KeepGradients:
    """The generator's optimiser: ``zero_grad`` clears, ``step`` does nothing, so the gradients stay."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.param_groups = [{"lr": 0.0}]

    def zero_grad(self) -> None:
        self.model.zero_grad(set_to_none=True)

    def step(self) -> None:
        pass


class Recorder:
    """Their ``Logger``: every ``logkv`` kept (the last value of each key)."""

    def __init__(self) -> None:
        self.values: dict[str, float] = {}

    def logkv(self, key: str, value) -> None:
        self.values[key] = float(value)

    def dumpkvs(self, force: bool = False) -> None:
        pass


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--vec2vec", required=True)
    parser.add_argument("--work", required=True)
    args = parser.parse_args()
    work, checkout = Path(args.work), Path(args.vec2vec).resolve()
    inputs = torch.load(work / "inputs.pt", weights_only=False)
    stand_in_imports()
    sys.path.insert(0, str(checkout))
    import accelerate
    import toml
    from torch.optim.lr_scheduler import LambdaLR
    from train import training_loop_
    from translators.Discriminator import Discriminator
    from utils.gan import LeastSquaresGAN
    from utils.utils import load_n_translator

    sections = toml.load(checkout / "configs" / "unsupervised.toml")
    cfg = types.SimpleNamespace(**{**{k: v for section in sections.values() for k, v in section.items()},
                                   **inputs["settings"]})
    torch.manual_seed(0)
    dims = {cfg.sup_emb: inputs["old"].shape[1], cfg.unsup_emb: inputs["new"].shape[1]}
    translator = load_n_translator(cfg, dims)
    translator.load_state_dict(inputs["translator"])
    for module in translator.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
    translator.eval()
    with torch.no_grad():
        old, new = (v / (v.norm(p=2, dim=1, keepdim=True) + 1e-12) for v in (inputs["old"], inputs["new"]))
        maps = {"backward": translator.translate_embeddings(new, cfg.unsup_emb, cfg.sup_emb),
                "forward": translator.translate_embeddings(old, cfg.sup_emb, cfg.unsup_emb)}
    translator.train()

    def lr_lambda(step: int) -> float:   # train.py's, with its no_scheduler
        if step < cfg.warmup_length:
            return min(1, step / cfg.warmup_length)
        return 1

    accelerator = accelerate.Accelerator(cpu=True)
    gans = {}
    for space, width in (("new", dims[cfg.unsup_emb]), ("old", dims[cfg.sup_emb]), ("latent", cfg.d_adapter)):
        disc = Discriminator(latent_dim=width, discriminator_dim=cfg.disc_dim, depth=cfg.disc_depth,
                             weight_init=cfg.weight_init)
        disc.load_state_dict(inputs["discriminators"][space])
        opt = torch.optim.Adam(disc.parameters(), lr=cfg.disc_lr, eps=cfg.eps, betas=(0.5, 0.999))
        gans[space] = LeastSquaresGAN(cfg=cfg, generator=translator, discriminator=disc, discriminator_opt=opt,
                                      discriminator_scheduler=LambdaLR(opt, lr_lambda=lr_lambda),
                                      accelerator=accelerator)
    recorder, similarity = Recorder(), types.SimpleNamespace(discriminator=nn.Linear(1, 1))
    with tempfile.TemporaryDirectory() as save_dir:
        training_loop_(save_dir=save_dir + "/", accelerator=accelerator, gan=gans["new"], sup_gan=gans["old"],
                       latent_gan=gans["latent"], similarity_gan=similarity, translator=translator,
                       sup_dataloader=[{cfg.sup_emb: inputs["old"]}], sup_iter=None,
                       unsup_dataloader=[{cfg.unsup_emb: inputs["new"]}], sup_encs={}, unsup_enc={}, cfg=cfg,
                       gen_optimizers=[KeepGradients(translator)], gen_schedulers=[], logger=recorder)
    names = ("rec_loss", "vsp_loss", "cc_trans_loss", "cc_vsp_loss", "gen_loss", "sup_gen_loss", "latent_gen_loss",
             "loss", "disc_loss", "sup_disc_loss", "latent_disc_loss", "cc_rec_loss", "reverse_rec_loss")
    torch.save({"losses": {name: recorder.values[name] for name in names},
                "translator_grads": {n: p.grad.clone() for n, p in translator.named_parameters()
                                     if p.grad is not None},
                "discriminator_grads": {space: {n: p.grad.clone() for n, p in gan.discriminator.named_parameters()}
                                        for space, gan in gans.items()},
                "discriminators_after": {space: {k: v.clone() for k, v in gan.discriminator.state_dict().items()}
                                         for space, gan in gans.items()},
                "running_statistics": {k: v.clone() for k, v in translator.state_dict().items()
                                       if k.endswith(("running_mean", "running_var", "num_batches_tracked"))},
                "maps": maps, "grad_norm": float(recorder.values["grad_norm_generator"])},
               work / "reference.pt")


if __name__ == "__main__":
    main()
