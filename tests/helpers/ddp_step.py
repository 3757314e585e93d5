"""One training step of each named strategy with a teacher and a replay memory, in one process or under torchrun;
saves each one's loss and every parameter's change as ``FOLDER/<strategy>.pt``
(``tests/training/test_distributed.py``): one launch serves every strategy.

The model has no batch norm: with it, plain DDP normalises each rank's share by its own statistics, which one
process on the global batch cannot reproduce (``distributed.sync_batchnorm`` syncs them, on GPUs only).
"""
import copy
import sys
from pathlib import Path

import torch
from torch import nn

from cl2r_bench.data.datasets import ImageSet
from cl2r_bench.distributed import connect, place
from cl2r_bench.models import build_model
from cl2r_bench.settings import DistributedSettings
from cl2r_bench.training.engine import ReplayMemory
from cl2r_bench.training.loop import train_task
from cl2r_bench.training_settings import TrainSettings
from strategies import TaskContext, get_strategy


def without_batch_norm(module: nn.Module) -> nn.Module:
    for name, child in module.named_children():
        setattr(module, name, nn.Identity() if isinstance(child, nn.BatchNorm2d) else without_batch_norm(child))
    return module


PARAMS = {"bt2": {"added_dims": 8}}
"""BT² adds fewer dimensions than the 16-d features: with as many or more, the old frame is the old branch alone and
the new basis P never meets a loss (a property of the method's widths, as in the authors' code)."""


def main(folder: str, *names: str) -> None:
    for name in names:
        one_step(Path(folder) / f"{name}.pt", name)


def one_step(out: Path, name: str) -> None:
    strategy = get_strategy(name).from_params(PARAMS.get(name, {}))
    torch.manual_seed(0)
    def plain(head: str, **options) -> nn.Module:
        return without_batch_norm(build_model(backbone="small_cnn", head=head, num_classes=8, small_width=8,
                                              small_out_dim=16, simplex_vertices_count=16, **options))

    model = plain(strategy.head, head_options=strategy.head_options())
    teacher, independent = copy.deepcopy(model), None
    if strategy.needs_independent:                  # BT²: a 16-d old model under a wider head, and an independent one
        teacher, independent = plain("learnable"), plain("learnable")
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    new = ImageSet(torch.randint(0, 256, (96, 3, 32, 32), dtype=torch.uint8), torch.randint(4, 8, (96,)))
    memory = ReplayMemory(per_class=10, run_seed=0, items=ImageSet(
        torch.randint(0, 256, (40, 3, 32, 32), dtype=torch.uint8), torch.arange(40) % 4))
    settings = TrainSettings.with_defaults(epochs=1, new_batch_size=64, memory_batch_size=64, lr=0.5, lr_min=0.5,
                                           weight_decay=0.0, amp=False, progress=False)
    distributed = DistributedSettings(sync_batchnorm=False, connect_timeout=30.0, timeout=120.0)
    processes, device = place(distributed, torch.device("cpu"))
    connect(processes, distributed, device)
    strategy.before_task(TaskContext(index=1, num_old_classes=4, num_new_classes=4, replacement=False,
                                     teacher_classes=4, teacher=teacher, new_data=new, memory=memory.items,
                                     amp=False, model=model, independent=independent))
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    torch.manual_seed(1)
    timing = train_task(model, strategy, new, memory, settings, teacher=teacher, independent=independent,
                        processes=processes)
    if processes.is_main:
        torch.save({"loss": timing["final_loss"], "iterations": timing["iterations"], "images": timing["images"],
                    "world_size": processes.world_size,
                    "change": {name: p.detach() - before[name] for name, p in model.named_parameters()}}, out)


if __name__ == "__main__":
    main(*sys.argv[1:])
