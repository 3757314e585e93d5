"""vec2vec (Jha, Zhang, Shmatikov, Morris, "Harnessing the Universal Geometry of Embeddings", arXiv 2505.12540,
2025; reference code ``rjha18/vec2vec`` at 5efb3c0: ``train.py``, ``translators/``, ``utils/gan.py``,
``utils/train_utils.py``, ``configs/unsupervised.toml``): a non-linear translation between two embedding spaces
learned **without paired items** by adversarial training with cycle-consistency and vector-space-preservation
losses (METHODS.md §7).

Fitted as :mod:`.mini_vec2vec` is: under ``model_update.pairing: unpaired`` (or ``runner.py adapt --train-old OLD
--train-new NEW``) on the old model's features of some items and the new model's of others; under ``paired`` it
gets both sides of the same items and uses no correspondence, not even to decide when to stop. The authors' two
spaces are ``sup_emb`` and ``unsup_emb``; here ``sup`` is the old space (the one whose latents are "real" to the
latent discriminator) and ``unsup`` the new one, so the backward map new → old is their ``unsup → sup``
translation, the direction of the paper's attack (an unknown model's database into a known model's space; their
``eval.py`` scores both directions, in eval mode). The forward map old → new is their ``sup → unsup``.

**Translator** (their ``TransformTranslator`` with ``style = 'res_mlp'``). Inputs are L2-normalised. Each space
``s`` has an input adapter ``A_s`` (``R^{d_s} → R^w``) and an output adapter ``B_s`` (``R^w → R^{d_s}``), and a
shared backbone ``T`` (``R^w → R^w``); all three are their ``MLPWithResidual``: ``depth`` blocks, each
``x ← block(x) + x`` with ``x`` zero-padded or truncated to the block's width; block 1 ``Linear, SiLU``, middle
blocks ``Linear, SiLU, norm, Dropout(0.1)``, the last ``Linear, Dropout(0.1), SiLU, Linear`` (Kaiming-normal
weights, zero biases; BatchNorm scale ~ N(1, 0.02), shift ~ N(0, 0.02)). The output is L2-normalised::

    z_s(x) = T(A_s(x))          F_{s→t}(x) = N(B_t(z_s(x)))          R_s(x) = F_{s→s}(x)

**Losses of a step** (``train.py``'s ``training_loop_``), with ``x`` a batch of the old space and ``y`` one of the
new, drawn independently, ``c(a, b) = 1 - mean_i cos(a_i, b_i)`` and, for row-normalised ``a`` and ``b``
(``b`` detached), ``V(b, a) = mean |b bᵀ - a aᵀ| + mean |b bᵀ - a bᵀ|``:

* reconstruction ``L_rec = ½ [c(x, R_old(x)) + c(y, R_new(y))]``, weight ``rec_weight`` 1;
* VSP of the reconstructions ``L_vsp = ½ [V(x, R_old(x)) + V(y, R_new(y))]``, weight ``vsp_weight`` 1;
* cycle consistency ``L_cc = ½ [c(x, F_{new→old}(sg F_{old→new}(x))) + c(y, F_{old→new}(sg F_{new→old}(y)))]``,
  weight ``cycle_weight`` 10, and the VSP of the same cycles ``L_ccvsp``, weight ``cycle_vsp_weight`` 10
  (``sg``: the first translation is detached, as theirs is);
* least-squares GANs (``LeastSquaresGAN``), three discriminators: ``D_new`` on ``y`` (real) against
  ``F_{old→new}(x)`` (fake), ``D_old`` on ``x`` against ``F_{new→old}(y)``, and ``D_lat`` on the old latents
  ``z_old(x)`` (real) against the new ones ``z_new(y)`` (fake). Each discriminator first takes one Adam step on
  ``½ [mean D(real)² + mean (D(fake) - 1)²]`` (real → 0, fake → 1; fakes detached); then, with its updated
  weights, the generator's term is ``½ mean D(fake)²``, weight ``adversarial_weight`` 1 for the two output-space
  GANs and ``latent_adversarial_weight`` 1 for the latent one;
* the generator (translator) takes one Adam step on ``L_rec + L_vsp + 10 L_cc + 10 L_ccvsp + G_new + G_old +
  G_lat``, its gradient norm clipped at ``max_grad_norm`` (1000). Discriminators: their ``Discriminator``, depth
  ``discriminator_depth`` (``Linear``, then ``SiLU, Linear, LayerNorm`` blocks, ``SiLU, Linear(·, 1)``; Kaiming
  weights), Adam ``disc_lr``, betas (0.5, 0.999), eps 6.25e-10, clipped at the same norm; the generator's Adam has
  betas (0.5, 0.999). Both learning rates rise linearly from 0 over ``warmup_steps`` (their ``LambdaLR``).

Their configuration's other terms have weight 0 there and are not computed here (reverse reconstruction, the cycle
reconstruction, the similarity GAN, the R1/R2 gradient penalty, noise); the cycle reconstructions are still
computed, without gradient, because they move the BatchNorm running statistics of the output adapters, as theirs do.

**Readings of the code, and where it departs from the paper** (the code is followed; docs/METHODS.md §7; the
paper's side as we read its §3 [not re-checked against the PDF here, which was not at hand]):

* The paper writes the reconstruction and cycle losses as squared distances and the VSP loss as squared
  differences of inner products between the inputs and their *translations*; the code uses ``1 - cos`` (for the
  unit outputs, half the squared distance), mean *absolute* differences, adds the "reflected" term ``a bᵀ``, and
  applies VSP to the reconstructions (weight 1) and to the cycles (weight 10), never to a translation.
* The code detaches the first translation of a cycle, so ``L_cc`` trains only the way back.
* One latent discriminator (``sup`` latents real, ``unsup`` fake), so only the new space's latents are pushed
  towards the old space's, not both towards each other.
* The least-squares labels are inverted (real → 0, fake → 1) and the configuration's label smoothing (``smooth``)
  is not read by the least-squares GAN.
* Stopping: their ``EarlyStopper`` watches the mean of the validation keys containing ``top_rank``, which none
  does, so the score is NaN, the patience runs out 20 epochs after ``min_epochs`` (80) and the last epoch's weights
  are the ones saved: in effect a fixed budget of epochs, last weights kept.

**Defaults scaled to a CPU** [choice] (each a setting; the authors' value in brackets): ``width`` 128 for the
adapters, the backbone and their hidden layers [1024], ``discriminator_width`` 128 [1024], ``adapter_depth`` 3 [3],
``transform_depth`` 4 [4], ``discriminator_depth`` 5 [5], ``batch_size`` 256 [256], ``dropout`` 0.1 [0.1], ``lr``
5e-4 [2e-5], ``disc_lr`` 2.5e-4 [1e-5], ``warmup_steps`` 30 [2000], ``max_steps`` 600 [at most 99 epochs of their
data], float32 [fp16 mixed precision]. The widths give the square layers 64 times fewer multiply-adds; the
learning rates (25 times theirs, in their 2:1 ratio) and the short warm-up let a budget of a few
hundred steps move the weights as far as the geometry losses settle (with theirs, most of it would be warm-up).
Measured on one core shared with another job: 0.12 s a step with 2,000 items a side of 128 dimensions, 0.25 s at
1,280, so 1 to 2.5 minutes for the budget. What such a fit does: the adversarial terms match the two
distributions (translated features land on the other space's clusters), but on symmetric synthetic clusters not
their correspondence: each cluster is mapped onto another one (``tests/adapters/test_adapters.py``; METHODS.md §7).

**Stopping rule** [choice]: a GAN has no loss that falls as the translation improves, and an unpaired fit has no
pairs to score retrieval on, so the caller's held-out retrieval watch is not used (under ``paired`` either: the fit
uses no correspondence). ``holdout`` of each side's items (seeded draws) are kept out of training and, every
``check_every`` steps, scored in eval mode on the part of the loss that needs no discriminator, ``L_rec + L_vsp +
10 L_cc + 10 L_ccvsp`` (each side's terms in chunks of ``batch_size``): the translator's geometry. A check that
lowers the reference score by ``min_improvement`` (relative) resets the patience; after ``patience`` (5) checks
without one the fit has converged and stops, but never before ``min_steps`` (300; their ``min_epochs``). The
**last** weights are kept, as the authors keep theirs: the geometry score is not a measure of alignment, and its
best value can come before the adversarial terms have moved the translation, so restoring it could undo them.
With fewer than 2 held-out items on a side the mean of the same loss on the training batches since the last
check is watched. The fit log has the usual ``steps``, ``converged``, ``best_step``, ``holdout_items``,
``watched`` and ``loss_curve`` (``[step, training geometry loss since the last check, watched score]``), the two
sides' item counts and the discriminators' last losses; progress is reported to the fit's
:class:`~cl2r_bench.adapters.learned.FitProgress` at each check.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from cl2r_bench.plugin_settings import WIDTH_MAX, setting

from .base import AdapterError, FeaturePair, in_memory, register_adapter
from .learned import LearnedAdapter, StepBudget, split_held_out

OLD, NEW, LATENT = "old", "new", "latent"
"""The two spaces (the authors' ``sup_emb`` and ``unsup_emb``) and the latent discriminator's name."""
NORMS = ("batch", "layer")
VSP_EPS = 1e-10
WATCHED = "held-out reconstruction, cycle and VSP loss"


@dataclass(frozen=True)
class Vec2VecConfig(StepBudget):
    max_steps: int = setting(600, at_least=1)            # translator steps at most (module docstring)
    min_steps: int = setting(300, at_least=0)            # no stop before (their min_epochs)
    patience: int = setting(5, at_least=1)               # checks without a relative fall: converged, stop
    batch_size: int = setting(256, at_least=2)           # items of each side per step (BatchNorm needs 2) [256]
    lr: float = setting(5e-4, above=0)                   # the translator's Adam [2e-5]
    disc_lr: float = setting(2.5e-4, above=0)            # the discriminators' Adam [1e-5]
    warmup_steps: int = setting(30, at_least=0)          # linear warm-up of both learning rates [2000]
    width: int = setting(128, at_least=1, at_most=WIDTH_MAX)   # d_adapter = d_hidden = d_transform [1024]
    adapter_depth: int = setting(3, at_least=1, at_most=64)    # blocks of each input and output adapter [3]
    transform_depth: int = setting(4, at_least=1, at_most=64)  # blocks of the shared backbone [4]
    norm: str = setting("batch", choices=NORMS)          # the middle blocks' normalisation [batch]
    dropout: float = setting(0.1, at_least=0, below=1)   # the translator's dropout [0.1]
    discriminator_width: int = setting(128, at_least=1, at_most=WIDTH_MAX)   # [1024]
    discriminator_depth: int = setting(5, at_least=1, at_most=64)            # [5]
    rec_weight: float = 1.0                  # L_rec
    vsp_weight: float = 1.0                  # L_vsp (of the reconstructions)
    cycle_weight: float = 10.0               # L_cc
    cycle_vsp_weight: float = 10.0           # L_ccvsp
    adversarial_weight: float = 1.0          # G_new and G_old
    latent_adversarial_weight: float = 1.0   # G_lat
    max_grad_norm: float = setting(1000.0, above=0)   # gradient clipping, translator and discriminators


def residual(inputs: torch.Tensor, outputs: torch.Tensor) -> torch.Tensor:
    """Their ``add_residual``: ``outputs + inputs``, the inputs zero-padded or truncated to the outputs' width."""
    width = outputs.shape[1]
    if inputs.shape[1] < width:
        inputs = F.pad(inputs, (0, width - inputs.shape[1]))
    return outputs + inputs[:, :width]


def kaiming(module: nn.Module) -> None:
    """Their ``initialize_weights('kaiming')``: Kaiming-normal linear weights (fan-in, ReLU gain), zero biases;
    BatchNorm scale ~ N(1, 0.02) and shift ~ N(0, 0.02); LayerNorm 1 and 0."""
    for part in module.modules():
        if isinstance(part, nn.Linear):
            nn.init.kaiming_normal_(part.weight, a=0, mode="fan_in", nonlinearity="relu")
            part.bias.data.fill_(0)
        elif isinstance(part, nn.BatchNorm1d):
            nn.init.normal_(part.weight, mean=1.0, std=0.02)
            nn.init.normal_(part.bias, mean=0.0, std=0.02)
        elif isinstance(part, nn.LayerNorm):
            nn.init.constant_(part.bias, 0)
            nn.init.constant_(part.weight, 1.0)


class ResidualMLP(nn.Module):
    """Their ``MLPWithResidual`` (module docstring), block for block, so the weights have their names."""

    def __init__(self, depth: int, in_dim: int, hidden: int, out_dim: int, norm: str, dropout: float) -> None:
        super().__init__()
        norm_layer = nn.BatchNorm1d if norm == "batch" else nn.LayerNorm
        blocks = []
        for index in range(depth):
            if index == 0:
                blocks.append(nn.Sequential(nn.Linear(in_dim, out_dim if depth == 1 else hidden), nn.SiLU()))
            elif index < depth - 1:
                blocks.append(nn.Sequential(nn.Linear(hidden, hidden), nn.SiLU(), norm_layer(hidden),
                                            nn.Dropout(dropout)))
            else:
                blocks.append(nn.Sequential(nn.Linear(hidden, hidden), nn.Dropout(dropout), nn.SiLU(),
                                            nn.Linear(hidden, out_dim)))
        self.layers = nn.ModuleList(blocks)
        kaiming(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.layers:
            x = residual(x, block(x))
        return x


class Discriminator(nn.Module):
    """Their ``Discriminator``: ``Linear(d, w)``, ``depth - 2`` blocks ``SiLU, Linear(w, w), LayerNorm(w)``, then
    ``SiLU, Linear(w, 1)`` (depth 1: ``Linear(d, 1)``); their ``Dropout(0.0)`` layers are kept so the weights
    have their names."""

    def __init__(self, in_dim: int, width: int, depth: int) -> None:
        super().__init__()
        if depth == 1:
            layers: list[nn.Module] = [nn.Linear(in_dim, 1)]
        else:
            layers = [nn.Linear(in_dim, width), nn.Dropout(0.0)]
            for _ in range(depth - 2):
                layers += [nn.SiLU(), nn.Linear(width, width), nn.LayerNorm(width), nn.Dropout(0.0)]
            layers += [nn.SiLU(), nn.Linear(width, 1)]
        self.layers = nn.ModuleList([nn.Sequential(*layers)])
        kaiming(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers[0](x)


class Translator(nn.Module):
    """Their ``TransformTranslator``: input adapters, the shared backbone ``transform``, output adapters."""

    def __init__(self, dims: dict[str, int], config: Vec2VecConfig) -> None:
        super().__init__()
        c = config
        self.in_adapters = nn.ModuleDict({flag: ResidualMLP(c.adapter_depth, dim, c.width, c.width, c.norm,
                                                            c.dropout) for flag, dim in dims.items()})
        self.transform = ResidualMLP(c.transform_depth, c.width, c.width, c.width, c.norm, c.dropout)
        self.out_adapters = nn.ModuleDict({flag: ResidualMLP(c.adapter_depth, c.width, c.width, dim, c.norm,
                                                             c.dropout) for flag, dim in dims.items()})

    def latent(self, x: torch.Tensor, flag: str) -> torch.Tensor:
        """``z_s(x) = T(A_s(x))``."""
        return self.transform(self.in_adapters[flag](x))

    def project(self, latent: torch.Tensor, flag: str) -> torch.Tensor:
        """``N(B_s(z))``: their ``_out_project`` (divided by the norm, no epsilon)."""
        out = self.out_adapters[flag](latent)
        return out / out.norm(dim=1, keepdim=True)

    def translate(self, x: torch.Tensor, source: str, target: str) -> torch.Tensor:
        return self.project(self.latent(x, source), target)

    def forward(self, ins: dict[str, torch.Tensor], recons_grad: bool = True
                ) -> tuple[dict[str, torch.Tensor], dict[str, dict[str, torch.Tensor]], dict[str, torch.Tensor]]:
        """Their ``forward(ins, include_reps=True)``, in their order (it moves the BatchNorm running statistics):
        ``(recons, translations[target][source], latents)``; ``recons_grad=False`` computes the reconstructions
        without gradient (the cycle pass, where their weight is 0)."""
        recons: dict[str, torch.Tensor] = {}
        translations: dict[str, dict[str, torch.Tensor]] = {}
        latents: dict[str, torch.Tensor] = {}
        for flag, x in ins.items():
            latents[flag] = self.latent(x, flag)
            for target in ins:
                if target == flag:
                    with torch.set_grad_enabled(recons_grad and torch.is_grad_enabled()):
                        recons[flag] = self.project(latents[flag], target)
                else:
                    translations.setdefault(target, {})[flag] = self.project(latents[flag], target)
        return recons, translations, latents


def cosine_loss(target: torch.Tensor, output: torch.Tensor) -> torch.Tensor:
    """``c(a, b) = 1 - mean_i cos(a_i, b_i)`` (their ``rec_loss_fn`` / ``trans_loss_fn`` term)."""
    return 1 - F.cosine_similarity(target, output, dim=1).mean()


def vsp_loss(target: torch.Tensor, output: torch.Tensor) -> torch.Tensor:
    """Their ``vsp_loss_fn`` term: ``mean |b bᵀ - a aᵀ| + mean |b bᵀ - a bᵀ|``, ``b`` the target rows (detached)
    and ``a`` the output rows, each divided by its norm plus 1e-10."""
    b = target.detach()
    b = b / (b.norm(dim=1, keepdim=True) + VSP_EPS)
    a = output / (output.norm(dim=1, keepdim=True) + VSP_EPS)
    inner = b @ b.T
    return (inner - a @ a.T).abs().mean() + (inner - a @ b.T).abs().mean()


def discriminator_loss(real: torch.Tensor, fake: torch.Tensor) -> torch.Tensor:
    """Their ``LeastSquaresGAN`` discriminator loss on the scores: ``½ [mean real² + mean (fake - 1)²]``."""
    return ((real ** 2).mean() + ((fake - 1) ** 2).mean()) / 2


def generator_loss(fake: torch.Tensor) -> torch.Tensor:
    """Their ``LeastSquaresGAN`` generator loss on the fakes' scores: ``½ mean fake²``."""
    return 0.5 * (fake ** 2).mean()


def geometry_losses(ins: dict[str, torch.Tensor], recons: dict[str, torch.Tensor],
                    cycles: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``L_rec``, ``L_vsp``, ``L_cc`` and ``L_ccvsp`` (module docstring): ``cycles[s]`` is ``ins[s]`` translated to
    the other space and back. Each is the mean over the spaces given."""
    n = len(ins)
    return {"rec": sum(cosine_loss(ins[s], recons[s]) for s in ins) / n,
            "vsp": sum(vsp_loss(ins[s], recons[s]) for s in ins) / n,
            "cycle": sum(cosine_loss(ins[s], cycles[s]) for s in ins) / n,
            "cycle_vsp": sum(vsp_loss(ins[s], cycles[s]) for s in ins) / n}


def other(space: str) -> str:
    return NEW if space == OLD else OLD


class GanSide:
    """One discriminator with its optimiser (their ``LeastSquaresGAN`` around a ``Discriminator``)."""

    def __init__(self, in_dim: int, config: Vec2VecConfig, device: torch.device) -> None:
        self.discriminator = Discriminator(in_dim, config.discriminator_width, config.discriminator_depth).to(device)
        self.optimizer = torch.optim.Adam(self.discriminator.parameters(), lr=config.disc_lr, eps=6.25e-10,
                                          betas=(0.5, 0.999))
        self.max_grad_norm = config.max_grad_norm
        self.last_loss = math.nan

    def step(self, real: torch.Tensor, fake: torch.Tensor) -> torch.Tensor:
        """Their ``step``: one discriminator step on the detached batch, then the generator's loss on ``fake``
        under the updated discriminator (whose weights take no gradient from it)."""
        self.discriminator.requires_grad_(True)
        loss = discriminator_loss(self.discriminator(real.detach()), self.discriminator(fake.detach()))
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(self.discriminator.parameters(), self.max_grad_norm)
        self.optimizer.step()
        self.last_loss = float(loss.detach())
        self.discriminator.requires_grad_(False)
        return generator_loss(self.discriminator(fake))


def warmed_up(optimizer: torch.optim.Optimizer, base_lr: float, step: int, warmup: int) -> None:
    """Their ``lr_lambda`` without decay: ``base · min(1, step / warmup)`` for the ``step``-th update (from 0)."""
    for group in optimizer.param_groups:
        group["lr"] = base_lr * (min(1.0, step / warmup) if step < warmup else 1.0)


class Batches:
    """One side's training items in seeded shuffled passes, ``size`` at a time (a short remainder is dropped,
    as their loaders' ``drop_last``)."""

    def __init__(self, items: torch.Tensor, size: int, generator: torch.Generator) -> None:
        self.items, self.size, self.generator = items, size, generator
        self.order, self.position = items[:0], 0

    def next(self) -> torch.Tensor:
        if self.position + self.size > len(self.order):
            shuffle = torch.randperm(len(self.items), generator=self.generator, device=self.generator.device).cpu()
            self.order, self.position = self.items[shuffle], 0
        self.position += self.size
        return self.order[self.position - self.size:self.position]


@register_adapter("vec2vec")
class Vec2Vec(LearnedAdapter):
    """A GAN-trained translator between the two spaces, fitted without pairs (module docstring)."""
    fitted_by = ('adversarial translation through a shared latent, with cycle and VSP losses, **without pairs** '
                 '(`--train-old OLD --train-new NEW`)')
    reference = 'Jha et al., arXiv 2505.12540, 2025'

    Config = Vec2VecConfig
    directions = ("backward", "forward")
    fits_unpaired = True

    def build(self, old_dim: int, new_dim: int, side_dim: int = 0) -> None:
        self.translator = Translator({OLD: old_dim, NEW: new_dim}, self.config)

    def backward(self, new: torch.Tensor) -> torch.Tensor:
        return self.translator.translate(F.normalize(new.float(), dim=1), NEW, OLD)

    def forward(self, old: torch.Tensor, side: torch.Tensor | None = None) -> torch.Tensor:
        return self.translator.translate(F.normalize(old.float(), dim=1), OLD, NEW)

    def train_step(self, ins: dict[str, torch.Tensor], gans: dict[str, GanSide]
                   ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """One step of their ``training_loop_`` on ``ins`` (old first): the three discriminator steps and the
        generator's loss and its terms (the caller steps the translator)."""
        c = self.config
        recons, translations, latents = self.translator(ins)
        adversarial = {NEW: gans[NEW].step(ins[NEW], translations[NEW][OLD]),
                       OLD: gans[OLD].step(ins[OLD], translations[OLD][NEW]),
                       LATENT: gans[LATENT].step(latents[OLD], latents[NEW])}
        cycle_ins = {target: translations[target][other(target)].detach() for target in translations}
        _, cycle_translations, _ = self.translator(cycle_ins, recons_grad=False)
        terms = geometry_losses(ins, recons, {s: cycle_translations[s][other(s)] for s in ins})
        loss = (c.rec_weight * terms["rec"] + c.vsp_weight * terms["vsp"] + c.cycle_vsp_weight * terms["cycle_vsp"]
                + c.cycle_weight * terms["cycle"] + c.adversarial_weight * (adversarial[NEW] + adversarial[OLD])
                + c.latent_adversarial_weight * adversarial[LATENT])
        return loss, {**terms, "gen_new": adversarial[NEW], "gen_old": adversarial[OLD],
                      "gen_latent": adversarial[LATENT]}

    def geometry(self, ins: dict[str, torch.Tensor]) -> torch.Tensor:
        """``L_rec + L_vsp + 10 L_cc + 10 L_ccvsp`` (their weights) of ``ins``, spaces taken one at a time."""
        c, total = self.config, 0.0
        for space, x in ins.items():
            recons, translations, _ = self.translator({space: x})
            back = self.translator.translate(self.translator.translate(x, space, other(space)), other(space), space)
            terms = geometry_losses({space: x}, recons, {space: back})
            total = total + (c.rec_weight * terms["rec"] + c.vsp_weight * terms["vsp"]
                             + c.cycle_weight * terms["cycle"] + c.cycle_vsp_weight * terms["cycle_vsp"]) / len(ins)
        return total

    def held_out_geometry(self, sides: dict[str, torch.Tensor]) -> float:
        """:meth:`geometry` of the held-out items in eval mode, each side in chunks of ``batch_size``."""
        self.eval()
        try:
            with torch.no_grad():
                total = 0.0
                for space, x in sides.items():
                    chunks = x.split(self.config.batch_size)
                    total += sum(float(self.geometry({space: chunk})) * len(chunk) for chunk in chunks) / len(x)
                return total / len(sides)
        finally:
            self.train()

    def fit(self, pair: FeaturePair, generator: torch.Generator) -> dict[str, Any]:
        c = self.config
        sides = {OLD: F.normalize(in_memory(pair.old).float(), dim=1),
                 NEW: F.normalize(in_memory(pair.new).float(), dim=1)}
        if min(len(x) for x in sides.values()) < 2:
            raise AdapterError(f"adapter 'vec2vec' needs at least 2 items of each model to fit (got "
                               f"{len(sides[OLD])} old, {len(sides[NEW])} new)")
        device = sides[OLD].device
        split = {space: split_held_out(len(x), c.holdout, generator) for space, x in sides.items()}
        held = {space: sides[space][split[space][1].to(device)] for space in sides}
        watch_held_out = all(len(x) >= 2 for x in held.values())
        size = min(c.batch_size, *(len(split[space][0]) for space in sides))
        batches = {space: Batches(split[space][0], size, generator) for space in sides}
        gans = {NEW: GanSide(self.dims[1], c, device), OLD: GanSide(self.dims[0], c, device),
                LATENT: GanSide(c.width, c, device)}
        optimizer = torch.optim.Adam(self.translator.parameters(), lr=c.lr, betas=(0.5, 0.999))
        progress, curve, window = self.fit_progress, [], []
        best, best_step, reference, waited, converged, step = math.inf, 0, math.inf, 0, False, 0
        while step < c.max_steps and not converged:
            for gan in gans.values():
                warmed_up(gan.optimizer, c.disc_lr, step, c.warmup_steps)
            warmed_up(optimizer, c.lr, step, c.warmup_steps)
            ins = {space: sides[space][batches[space].next().to(device)] for space in (OLD, NEW)}
            loss, terms = self.train_step(ins, gans)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(self.translator.parameters(), c.max_grad_norm)
            optimizer.step()
            step += 1
            window.append(float((c.rec_weight * terms["rec"] + c.vsp_weight * terms["vsp"] + c.cycle_weight
                                 * terms["cycle"] + c.cycle_vsp_weight * terms["cycle_vsp"]).detach()))
            if step % c.check_every and step != c.max_steps:
                continue
            train_geometry = sum(window) / len(window)
            value = self.held_out_geometry(held) if watch_held_out else train_geometry
            curve.append([step, train_geometry, value])
            window = []
            if value < best:
                best, best_step = value, step
            if math.isinf(reference) or value < reference - c.min_improvement * abs(reference):
                reference, waited = value, 0
            else:
                waited += 1
            converged = waited >= c.patience and step >= c.min_steps
            if progress is not None:
                progress.check(step, c.max_steps, WATCHED if watch_held_out else "training geometry loss", value,
                               best, best_step)
        log = {"steps": step, "converged": converged, "best_step": best_step,
               "holdout_items": sum(len(x) for x in held.values()) if watch_held_out else 0,
               "loss_curve": curve, "watched": WATCHED, "old_items": float(len(sides[OLD])),
               "new_items": float(len(sides[NEW])),
               **{f"discriminator_loss_{space}": gan.last_loss for space, gan in gans.items()}}
        if progress is not None:
            progress.done(log)
        return log
