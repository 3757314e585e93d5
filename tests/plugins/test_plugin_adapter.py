"""A user's own adapter, one file in a temporary folder and nothing else touched (docs/plugins.md): `runner.py adapt
--plugin FILE` fits and measures it, its record carries the diagnostics it declares, and the leaderboard's
backfilling table shows them as columns under the titles it gave."""
import json

import numpy as np
import pytest
from helpers.adapt_inputs import adapt, arrays, backfilling_row, plugin_file

PLUGIN = '''
import torch
from cl2r_bench.adapters.base import Adapter, register_adapter


@register_adapter("mean_norm_identity")
class MeanNormIdentity(Adapter):
    """The identity map; its fit logs the mean cosine between each fitting item's old and new feature."""
    directions = ("backward",)
    diagnostics = {"pair_cosine": "old-new cosine"}

    def build(self, old_dim, new_dim, side_dim=0):
        self.register_buffer("unit", torch.ones(()))

    def fit(self, pair, generator):
        cosine = torch.nn.functional.cosine_similarity(pair.old, pair.new, dim=1)
        return {"pair_cosine": float(cosine.mean())}

    def backward(self, new):
        return new * self.unit
'''


def test_a_plugin_adapter_runs_and_its_declared_diagnostics_are_leaderboard_columns(rotated, tmp_path, capsys):
    train, test = rotated
    plugin = plugin_file(tmp_path, "my_adapter.py", PLUGIN)
    out_dir = tmp_path / "results"
    code, out = adapt("--train", train, "--test", test, "--adapter", "mean_norm_identity", "--plugin", plugin,
                      "--output", out_dir, "--seeds", 1, capsys=capsys)
    assert code == 0, out.err
    record = json.loads((out_dir / "adapt/train/mean_norm_identity/seed1/metrics.json").read_text())
    old, new, _ = arrays(train)
    unit = lambda x: x / np.linalg.norm(x, axis=1, keepdims=True)  # noqa: E731
    expected = float(np.mean(np.sum(unit(old) * unit(new), axis=1)))
    assert record["adapter"]["diagnostics"] == {"pair_cosine": "old-new cosine"}
    assert record["adapter"]["fits"][0]["pair_cosine"] == pytest.approx(expected, rel=1e-4, abs=1e-5)
    assert (out_dir / "adapt/train/mean_norm_identity/seed1/config.yaml").read_text().count(str(plugin)) == 1

    row = backfilling_row(out_dir, capsys, "mean_norm_identity")
    assert "f(W)" not in row, "a diagnostic column only where an adapter declares it"
    assert row["old-new cosine"] == f"{expected:.2f}"
