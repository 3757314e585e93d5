"""``seed_scope``: what a run's seed draws. ``training`` (the papers') fixes the class order and the query sample
across seeds; ``split`` draws both from the seed, so that seeds vary what a reviewer expects."""
import pytest
import torch
from helpers.runs import TINY

from cl2r_bench.app.assembly import assemble
from cl2r_bench.config import resolve
from cl2r_bench.errors import ConfigError
from cl2r_bench.scenario import items_read
from cl2r_bench.settings import RunSettings


def stream(seed: int, scope: str, tmp_path, **evaluation):
    config = resolve([("tiny", dict(TINY, seed=seed, seed_scope=scope, output=str(tmp_path),
                                    evaluation={**TINY["evaluation"], "queries_per_class": 3, **evaluation}))])
    return assemble(config).scenario.stream()


def test_training_scope_keeps_the_class_order_and_the_first_queries_for_every_seed(tmp_path):
    first, second = stream(1, "training", tmp_path), stream(2, "training", tmp_path)
    assert first.class_order == second.class_order == list(range(24))
    assert torch.equal(first.query.images, second.query.images)
    assert torch.equal(first.query.labels, torch.arange(6).repeat_interleave(3))


def test_split_scope_draws_the_class_order_and_the_query_sample_from_the_seed(tmp_path):
    first, again, second = (stream(seed, "split", tmp_path) for seed in (1, 1, 2))
    assert first.class_order == again.class_order != second.class_order
    assert sorted(first.class_order) == list(range(24))
    assert torch.equal(first.query.images, again.query.images)
    every = stream(1, "split", tmp_path, queries_per_class=None).query
    assert len(first.query) == 18 and len(every) == 6 * 24
    for label in range(6):  # a random 3 of each held-out class's 24 training images, in data set order
        drawn = first.query.images[first.query.labels == label]
        pool = every.images[every.labels == label]
        assert all(any(torch.equal(image, other) for other in pool) for image in drawn)
    assert any(not torch.equal(first.query.images[first.query.labels == c], every.images[every.labels == c][:3])
               for c in range(6))


def test_split_scope_is_checked_against_an_explicit_class_order():
    with pytest.raises(ConfigError, match="seed_scope=split draws the class order from the seed"):
        RunSettings.from_config(resolve([("unit", {"seed_scope": "split", "stream": {"class_order": [3, 1, 2]}})]))
    with pytest.raises(ConfigError, match=r"seed_scope = 'data'; choose from \['training', 'split'\]"):
        RunSettings.from_config(resolve([("unit", {"seed_scope": "data"})]))


def test_a_seeded_query_sample_reads_every_item_of_the_query_split():
    training = RunSettings.from_config(resolve([("unit", {"dataset": "tinyimagenet", "evaluation": {
        "queries_per_class": 40}, "stream": {"images_per_class": 30}, "replacement": {"tasks": []}})]))
    split = RunSettings.from_config(resolve([("unit", {"dataset": "tinyimagenet", "seed_scope": "split",
                                                       "evaluation": {"queries_per_class": 40},
                                                       "stream": {"images_per_class": 30},
                                                       "replacement": {"tasks": []}})]))
    assert items_read(training, "tinyimagenet") == {"train": 40, "test": None}
    assert items_read(split, "tinyimagenet") == {"train": None, "test": None}
