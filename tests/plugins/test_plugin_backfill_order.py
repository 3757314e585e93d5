"""A user's own backfilling order, one file in a temporary folder and nothing else touched (docs/plugins.md):
`runner.py adapt --plugin FILE` measures its curve beside the built-in ones, the record holds it under its name,
and the leaderboard's backfilling table gives it its own columns."""
import json

import numpy as np
import pytest
from helpers.adapt_inputs import adapt, arrays, backfilling_row, plugin_file

PLUGIN = '''
import torch
from benchmarks.backfill_orders import BackfillOrder, register_backfill_order


@register_backfill_order("last_first")
class LastFirst(BackfillOrder):
    """The gallery's items from the last to the first."""

    def rank(self, gallery, adapter, generator):
        return torch.arange(len(gallery.stale) - 1, -1, -1, device=gallery.stale.device)
'''


def leave_one_out_top1(queries: np.ndarray, gallery: np.ndarray, labels: np.ndarray) -> float:
    """Percent of queries whose most similar other gallery item (cosine) shares their label."""
    unit = lambda x: x / np.linalg.norm(x, axis=1, keepdims=True)  # noqa: E731
    similarity = unit(queries) @ unit(gallery).T
    np.fill_diagonal(similarity, -np.inf)
    return 100.0 * float(np.mean(labels[similarity.argmax(axis=1)] == labels))


def test_a_plugin_backfill_order_is_measured_recorded_and_tabled(rotated, tmp_path, capsys):
    train, test = rotated
    plugin = plugin_file(tmp_path, "my_order.py", PLUGIN)
    out_dir = tmp_path / "results"
    code, out = adapt("--train", train, "--test", test, "--adapter", "none", "--plugin", plugin,
                      "--set", "model_update.backfill_orders=[random,last_first]",
                      "--set", "model_update.backfill_steps=4",
                      "--output", out_dir, "--seeds", 1, capsys=capsys)
    assert code == 0, out.err
    backfilling = json.loads((out_dir / "adapt/train/none/seed1/metrics.json").read_text())["retrieval"]["backfilling"]
    assert list(backfilling["curves"]) == ["random", "last_first"]

    old, new, labels = arrays(test)
    expected = []
    for beta in backfilling["betas"]:
        gallery = old.copy()
        fresh = np.arange(len(old) - 1, -1, -1)[:round(beta * len(old))]
        gallery[fresh] = new[fresh]
        expected.append(leave_one_out_top1(new, gallery, labels))
    assert backfilling["curves"]["last_first"]["top1"] == pytest.approx(expected, abs=1e-3)
    assert expected[0] < expected[-1], "a stale gallery of the old model answers the new queries worse"

    row = backfilling_row(out_dir, capsys, "| none")
    assert "AUC class_mean_cosine top-1" not in row, "columns only for the orders the records hold"
    area = backfilling["auc"]["last_first"]["top1_auc"]
    assert area == pytest.approx(float(np.trapezoid(expected, backfilling["betas"])), abs=1e-3)
    assert row["AUC last_first top-1"] == f"{area:.2f}"


def test_an_unknown_backfill_order_is_one_line_before_any_fit(rotated, tmp_path, capsys):
    train, test = rotated
    code, out = adapt("--train", train, "--test", test, "--adapter", "procrustes", "--output", tmp_path / "r",
                      "--set", "model_update.backfill_orders=[random,last_first]", capsys=capsys)
    assert code == 2 and "model_update.backfill_orders = ['random', 'last_first']; give a list from" in out.err
    assert not (tmp_path / "r").exists()
