"""The frozen models' tables of a task on features: the same outputs as running the models on each batch."""
from __future__ import annotations

import copy

import pytest
import torch

from cl2r_bench.data.datasets import ImageSet
from cl2r_bench.models import build_model, head_over
from cl2r_bench.training import template
from cl2r_bench.training.engine import DeviceBatches, ReplayMemory
from cl2r_bench.training.frozen_outputs import FrozenOutputs, frozen_outputs
from cl2r_bench.training.loop import train_task
from cl2r_bench.training_settings import TrainSettings
from strategies import TaskContext, get_strategy

OLD, NEW, FEATURES = 4, 4, 48


def features(classes: range, per_class: int, seed: int) -> ImageSet:
    generator = torch.Generator().manual_seed(seed)
    labels = torch.tensor(classes).repeat_interleave(per_class)
    centres = torch.randn(max(classes) + 1, FEATURES, generator=generator)
    return ImageSet(centres[labels] + torch.randn(len(labels), FEATURES, generator=generator), labels)


def test_each_batch_names_its_items_as_rows_of_new_then_memory():
    new, memory = features(range(OLD, OLD + NEW), 16, 0), features(range(OLD), 3, 1)
    batches = DeviceBatches(new, memory, new_batch=8, memory_batch=8, epoch_length="reference")
    items = torch.cat([new.images, memory.images])
    labels = torch.cat([new.labels, memory.labels])
    for batch_items, batch_labels, from_memory in batches:
        assert torch.equal(batch_items, items[batches.last_rows])
        assert torch.equal(batch_labels, labels[batches.last_rows])
        assert torch.equal(from_memory, batches.last_rows >= len(new))


def test_a_table_holds_the_models_outputs_of_every_item():
    torch.manual_seed(0)
    model = build_model(head="learnable", num_classes=OLD, backbone="frozen_encoder", feature_dim=FEATURES).eval()
    new, memory = features(range(OLD, OLD + NEW), 5, 0), features(range(OLD), 2, 1)
    outputs = frozen_outputs(model, new, memory, None)
    rows = torch.tensor([0, 19, 20, 27])
    with torch.no_grad():
        logits, raw = model(torch.cat([new.images, memory.images])[rows])
    assert outputs.table is not None
    read_logits, read_raw = outputs(torch.full((len(rows), FEATURES), float("nan")), rows)
    assert torch.allclose(read_logits, logits, atol=1e-5)
    assert torch.allclose(read_raw, raw, atol=1e-5)


def test_images_are_cropped_at_every_draw_so_the_model_runs_on_each_batch():
    images = ImageSet(torch.zeros(4, 3, 32, 32, dtype=torch.uint8), torch.arange(4))
    model = build_model(head="learnable", num_classes=4, backbone="small_cnn").eval()
    outputs = frozen_outputs(model, images, None, None)
    batch = torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        logits, raw = model(batch)
    assert outputs.table is None
    assert all(torch.equal(a, b) for a, b in zip(outputs(batch, torch.tensor([0, 1])), (logits, raw), strict=True))


def trained(name: str, tables: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[torch.nn.Module, dict, int, int]:
    """Strategy ``name`` trained 2 epochs on an upgrade-like task of features, with or without the tables: the model,
    its loss terms, the iterations and the teacher's forwards during training."""
    if not tables:
        monkeypatch.setattr(template, "frozen_outputs",
                            lambda model, *args: None if model is None else FrozenOutputs(model, None, None))
    torch.manual_seed(0)
    options = {"backbone": "frozen_encoder", "feature_dim": FEATURES}
    old = build_model(head="learnable", num_classes=OLD, **options).eval()
    cls = get_strategy(name)
    strategy = cls.from_params({})
    head, head_options = head_over(cls.head, old.head.feature_width)
    model = build_model(head=head, num_classes=OLD + NEW, head_options={**strategy.head_options(), **head_options},
                        **options)
    independent = build_model(head="learnable", num_classes=OLD + NEW, **options).eval() \
        if cls.needs_independent else None
    data = features(range(OLD + NEW), 24, 0)
    strategy.before_task(TaskContext(index=1, num_old_classes=OLD, num_new_classes=NEW, teacher_classes=OLD,
                                     teacher=old, new_data=data, memory=None, amp=None, model=model,
                                     independent=independent))
    settings = TrainSettings.with_defaults(epochs=2, lr=0.01, batch_size=32, progress=False)
    teacher, forwards = copy.deepcopy(old), []
    teacher.register_forward_hook(lambda *args: forwards.append(1))
    result = train_task(model, strategy, data, ReplayMemory(20, 0), settings, teacher=teacher,
                        independent=independent)
    return model, result["loss_terms"], result["iterations"], len(forwards)


@pytest.mark.parametrize("name", ["bct", "bt2"])
def test_training_with_the_tables_ends_where_training_on_each_batch_ends(name, monkeypatch):
    with_tables, terms, iterations, table_forwards = trained(name, True, monkeypatch)
    without, terms_without, _, batch_forwards = trained(name, False, monkeypatch)
    assert (table_forwards, batch_forwards) == (1, iterations)
    assert terms.keys() == terms_without.keys() and len(terms) > 1
    for term in terms:
        assert terms[term] == pytest.approx(terms_without[term], rel=1e-4, abs=1e-5)
    for (key, a), (_, b) in zip(with_tables.state_dict().items(), without.state_dict().items(), strict=True):
        assert torch.allclose(a.float(), b.float(), atol=1e-4), key
