"""Learned adapters (λ-orthogonal, FCT, FastFill) trained to convergence: a step budget, stopped early when a
held-out share of the fitting set stops improving (METHODS.md §7, [choice]).

Why steps and not epochs: an epoch count makes the amount of training shrink with the fitting set. The papers'
"80 epochs" are about 3,900 Adam steps on CIFAR-100 (50,000 items, batch 1,024) and about 100,000 on ImageNet, but
only 160 on 1,200 items, where λ-orth reached B/old 23.1 on a noisy rotation that Procrustes recovers at 76.8
(800 epochs: 79.5). So every learned adapter trains for at most ``max_steps`` steps, the papers' order on small
sets, and stops sooner once it has converged:

* ``holdout`` of the fitting items (a seeded draw) are kept out of training; every ``check_every`` steps they are
  scored: by the caller's *watch* when it gives one (``runner.py adapt`` and the runs give
  :func:`benchmarks.adapted_cases.held_out_error`, 100 - the leave-one-out mAP of the adapter's cross case on
  them), else by the training loss (no gradient, in fixed chunks of ``batch_size``). Retrieval is watched because
  the losses mislead on small sets: on 1,800 real fitting items FastFill's uncertainty-weighted loss and λ-orth's
  contrastive term bottom out on held-out items after 100-200 steps while the maps still improve
  (``results/pretrained/README.md``);
* a check that lowers the best score by at least ``min_improvement`` (relative) resets the patience; after
  ``patience`` checks without such a fall the fit has **converged** and stops;
* the weights of the best score are restored at the end, whether it converged or ran out of steps;
* with fewer than 2 held-out items (a tiny set, or ``holdout: 0``) the mean training loss between two checks is
  watched instead;
* held-out items are scored in eval mode (a network with batch norm reads its running statistics there, as the
  fitted map does, and moves none of them), and an adapter that normalises each batch sets
  :meth:`LearnedAdapter.min_batch`: the last items of an epoch too few for a batch wait for the next epoch's draw.

A fit that used its whole budget without converging is reported by :func:`convergence_note`, one line saying how
to give it more. The fit log (``runner.py adapt``'s records, ``adapter.fits`` of a run) carries ``steps``,
``converged``, ``best_step``, ``holdout_items``, ``watched`` (what was scored) and ``loss_curve``: ``[step, mean
training loss since the last check, held-out score]`` per check.

A learned adapter subclasses :class:`LearnedAdapter`, gives its ``Config`` the fields of :class:`StepBudget` (by
inheriting it) and implements :meth:`LearnedAdapter.batch_loss`.
"""
from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from cl2r_bench.plugin_settings import setting

from .base import Adapter, AdapterError, FeaturePair

MIN_HELD_OUT = 2


@dataclass(frozen=True)
class StepBudget:
    """How long a learned adapter trains (module docstring); its ``Config`` inherits these fields."""

    max_steps: int = setting(4000, at_least=1)   # Adam steps at most: the λ-orth paper's CIFAR-100 order (3,900)
    holdout: float = setting(0.1, at_least=0, below=1)   # share of the fitting items held out to decide when to stop
    check_every: int = setting(50, at_least=1)   # steps between two held-out checks
    patience: int = setting(10, at_least=1)      # checks without a relative fall of min_improvement: converged, stop
    min_improvement: float = setting(0.001, at_least=0, below=1)   # the relative fall that counts as progress
    batch_size: int = setting(256, at_least=1)
    lr: float = setting(0.001, above=0)          # Adam


def split_held_out(n: int, share: float, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``(training, held_out)`` item indices: a seeded draw of ``round(share * n)`` items held out, or none when
    that leaves fewer than 2 to watch or fewer than 2 to train on."""
    order = torch.randperm(n, generator=generator, device=generator.device).cpu()
    held = round(share * n)
    if held < MIN_HELD_OUT or n - held < MIN_HELD_OUT:
        return order, order[:0]
    return order[held:], order[:held]


class _Monitor:
    """The early-stopping rule of the module docstring: the best loss, its step and weights, and the patience."""

    def __init__(self, module: torch.nn.Module, budget: StepBudget) -> None:
        self.module, self.budget = module, budget
        self.best, self.best_step, self.best_state = math.inf, 0, None
        self.reference, self.waited = math.inf, 0

    def check(self, step: int, loss: float) -> bool:
        """Record the monitored ``loss`` at ``step``; True when the fit has converged."""
        if loss < self.best:
            self.best, self.best_step = loss, step
            self.best_state = copy.deepcopy(self.module.state_dict())
        if math.isinf(self.reference) or loss < self.reference - self.budget.min_improvement * abs(self.reference):
            self.reference, self.waited = loss, 0
        else:
            self.waited += 1
        return self.waited >= self.budget.patience

    def restore_best(self) -> None:
        if self.best_state is not None:
            self.module.load_state_dict(self.best_state)


def _held_out_loss(batch_loss: Callable[[torch.Tensor], torch.Tensor], held_out: torch.Tensor,
                   batch_size: int) -> float:
    total = 0.0
    with torch.no_grad():
        for chunk in held_out.split(batch_size):
            total += float(batch_loss(chunk)) * len(chunk)
    return total / len(held_out)


PROGRESS_SECONDS = 5.0
"""At most one progress line per this many seconds while a learned adapter fits (:class:`FitProgress`)."""


class FitProgress:
    """One line every :data:`PROGRESS_SECONDS` (at a held-out check) while a fit runs, through ``write`` (stderr in
    ``runner.py adapt``, also when it is not a terminal): the adapter, the step of the budget, the watched score
    and the best so far, the time spent and the most the rest of the budget can take at the pace so far; and one
    line when the fit ends. A slow fit is then told apart from a hung one."""

    def __init__(self, label: str, write: Callable[[str], None], clock: Callable[[], float] = time.monotonic) -> None:
        self.label, self.write, self.clock = label, write, clock
        self.started = self.last = clock()

    def check(self, step: int, max_steps: int, watched: str, value: float, best: float, best_step: int) -> None:
        now = self.clock()
        if now - self.last < PROGRESS_SECONDS:
            return
        self.last, spent = now, now - self.started
        self.write(f"{self.label}: step {step} of {max_steps}, {watched} {value:.4g} (best {best:.4g} at step "
                   f"{best_step}), {spent:.0f} s, at most {spent / step * (max_steps - step):.0f} s more")

    def done(self, log: dict[str, Any]) -> None:
        state = "converged" if log["converged"] else "used its whole budget"
        self.write(f"{self.label}: {state} after {log['steps']} steps in {self.clock() - self.started:.0f} s "
                   f"(best at step {log['best_step']})")


def train_to_convergence(module: torch.nn.Module, batch_loss: Callable[[torch.Tensor], torch.Tensor], n: int,
                         budget: StepBudget, generator: torch.Generator,
                         watch: Callable[[torch.Tensor], float] | None = None,
                         progress: FitProgress | None = None, min_batch: int = 1) -> dict[str, Any]:
    """Train ``module``'s parameters with Adam on ``batch_loss(item indices)`` over ``n`` fitting items under
    ``budget`` (module docstring), judging convergence by ``watch(held-out indices)`` (lower is better; default:
    the mean held-out ``batch_loss``), both in eval mode, and reporting to ``progress`` at each check; an epoch's
    last items fewer than ``min_batch`` are left to the next epoch. Returns the convergence log: ``steps``,
    ``converged``, ``best_step``, ``holdout_items`` and ``loss_curve``."""
    def watched(held_out: torch.Tensor) -> float:
        module.eval()
        try:
            return _held_out_loss(batch_loss, held_out, budget.batch_size) if watch is None else watch(held_out)
        finally:
            module.train()

    training, held_out = split_held_out(n, budget.holdout, generator)
    optimizer = torch.optim.Adam(module.parameters(), lr=budget.lr)
    monitor, curve = _Monitor(module, budget), []
    order, position, window, step, converged = training[:0], 0, [], 0, False
    while step < budget.max_steps and not converged:
        if len(order) - position < min(min_batch, len(training)):
            order = training[torch.randperm(len(training), generator=generator, device=generator.device).cpu()]
            position = 0
        idx = order[position:position + budget.batch_size]
        position += budget.batch_size
        loss = batch_loss(idx)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        step += 1
        window.append(loss.detach())
        if step % budget.check_every == 0 or step == budget.max_steps:
            train_loss = float(torch.stack(window).mean())
            value = watched(held_out) if len(held_out) else train_loss
            curve.append([step, train_loss, value])
            converged = monitor.check(step, value)
            window = []
            if progress is not None:
                what = ("held-out " + ("retrieval error" if watch is not None else "loss") if len(held_out)
                        else "training loss")
                progress.check(step, budget.max_steps, what, value, monitor.best, monitor.best_step)
    monitor.restore_best()
    log = {"steps": step, "converged": converged, "best_step": monitor.best_step, "holdout_items": len(held_out),
           "loss_curve": curve}
    if progress is not None:
        progress.done(log)
    return log


def convergence_note(name: str, fit: dict[str, Any], where: str = "") -> str | None:
    """One line for a fit that used its whole step budget without converging: when its watched score was best,
    that it had not yet stayed flat for ``patience`` checks, and the ``--set`` that gives it 4 times the steps;
    None for a fit that converged or has no convergence log (closed-form adapters)."""
    if fit.get("converged", True):
        return None
    steps = int(fit["steps"])
    watched = fit.get("watched", "held-out loss") if fit.get("holdout_items") else "training loss"
    best = next((value for step, _, value in fit.get("loss_curve") or [] if step == fit.get("best_step")), None)
    improving = (f": its {watched} was best at step {fit['best_step']} ({best:.4g}) and had not yet stayed flat for "
                 f"adapter_params.{name}.patience checks" if best is not None else "")
    return (f"warning: adapter {name}{where} did not converge in {steps} steps{improving}; give it more with --set "
            f"adapter_params.{name}.max_steps={4 * steps}")


class LearnedAdapter(Adapter):
    """An adapter trained by gradient descent under a :class:`StepBudget` (module docstring): subclasses prepare
    their fitting tensors in :meth:`fitting_data` and give the loss of a mini-batch in :meth:`batch_loss`."""

    Config = StepBudget

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> Adapter:
        if "epochs" in params:
            raise AdapterError(f"adapter_params.{cls.name}.epochs: learned adapters train by a step budget now; set "
                               f"adapter_params.{cls.name}.max_steps instead (about epochs x fitting items / "
                               f"batch_size; docs/adapters.md)")
        return super().from_params(params)

    def fitting_data(self, pair: FeaturePair) -> FeaturePair:
        """The fitting tensors as :meth:`batch_loss` reads them (default: ``pair`` itself)."""
        return pair

    def batch_loss(self, data: FeaturePair, idx: torch.Tensor) -> torch.Tensor:
        """The scalar training loss of the items ``idx`` of ``data``."""
        raise NotImplementedError

    def min_batch(self) -> int:
        """The fewest items a training batch may hold (default 1; 2 for a network that normalises each batch)."""
        return 1

    def fit_log(self, data: FeaturePair) -> dict[str, float]:
        """Numbers worth logging about the trained adapter on its fitting tensors ``data`` (default: none)."""
        return {}

    def fit(self, pair: FeaturePair, generator: torch.Generator) -> dict[str, Any]:
        data = self.fitting_data(pair)
        if len(data.old) < self.min_batch():
            raise AdapterError(f"adapter {self.name!r}: {len(data.old)} fitting item(s); its network normalises each "
                               f"batch and needs at least {self.min_batch()}")
        device = data.old.device
        watch = None
        if self.held_out_watch is not None:
            def watch(idx: torch.Tensor) -> float:
                idx = idx.to(device)
                return self.held_out_watch(self, pair.old[idx], pair.new[idx], pair.labels[idx])
        log = train_to_convergence(self, lambda idx: self.batch_loss(data, idx.to(device)), len(data.old),
                                   self.config, generator, watch, self.fit_progress, self.min_batch())
        with torch.no_grad():
            extra = self.fit_log(data)
        return {**extra, **log, "watched": "held-out loss" if watch is None else "held-out retrieval error"}
