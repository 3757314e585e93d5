"""Adapters in runs (METHODS.md §7): the adapted matrix along a stream follows the adapter chain, each adapter's
defaults are written once and saved with the run, and the model_update scenario runs every adapter end to end."""
import dataclasses
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import yaml
from helpers.adapter_pairs import FEW_ROUNDS, SHORT_FITS
from helpers.runs import interrupt_run_at
from torch import nn

from benchmarks.record import CROSS_CASES, cross_case, unpack_hits
from benchmarks.retrieval import CompatibilityEvaluator, gallery_accuracy
from cl2r_bench.adapters import AdapterError, FeaturePair, fit_adapter, get_adapter, list_adapters, make_adapter
from cl2r_bench.app import cli as runner
from cl2r_bench.app.assembly import assemble
from cl2r_bench.config import CONFIG_DIR, resolve
from cl2r_bench.data.datasets import ImageSet
from cl2r_bench.models import normalize


def run_cli(*args):
    return runner.main([str(a) for a in args])


class LinearFeatures(nn.Module):
    """A frozen 'model' whose features are a fixed linear map of the normalised pixels (for exact adapter checks)."""

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)

    def forward(self, x):
        features = normalize(x, (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)).flatten(1) @ self.weight
        return torch.zeros(len(x), 1), features


def test_adapted_matrix_along_a_stream_follows_the_adapter_chain():
    torch.manual_seed(0)
    images = torch.randint(0, 256, (60, 3, 2, 2), dtype=torch.uint8)
    labels = torch.arange(60) % 4
    data = ImageSet(images, labels)
    base = torch.randn(12, 6)
    rotations = [torch.linalg.qr(torch.randn(6, 6))[0] for _ in range(2)]
    models = [LinearFeatures(base), LinearFeatures(base @ rotations[0]),
              LinearFeatures(base @ rotations[0] @ rotations[1])]
    kw = {"amp": False}
    results = {}
    for direction in ("backward", "forward"):
        evaluator = CompatibilityEvaluator(data, data, adapted=direction, adapter_factory=lambda: make_adapter(
            "procrustes", {}), **kw)
        evaluator.deploy(models[0])
        for t in (1, 2):
            adapter = make_adapter("procrustes", {})
            pair = FeaturePair(*(F.normalize(models[i](data.images)[1], dim=1) for i in (t - 1, t)), labels)
            fit_adapter(adapter, pair, seed=0)
            evaluator.deploy(models[t], adapter if t == 2 else None)
        results[direction] = evaluator
    plain = results["backward"].matrix
    own = plain[0][0]
    assert plain[2][1] < own - 0.2
    backward = results["backward"].adapted_matrix
    assert [backward[t][t] for t in range(3)] == [plain[t][t] for t in range(3)]
    assert backward[1] == plain[1]
    assert backward[2][1] == pytest.approx(plain[1][1]) and backward[2][0] == pytest.approx(plain[1][0])
    forward = results["forward"].adapted_matrix
    assert forward[2][1] == pytest.approx(plain[2][2]) and forward[1] == plain[1]
    state = results["backward"].state_dict()
    restored = CompatibilityEvaluator(data, data, adapted="backward",
                                      adapter_factory=lambda: make_adapter("procrustes", {}), **kw)
    restored.load_state_dict(state)
    assert restored.adapted_matrix == backward
    assert torch.equal(restored.adapters[2].to_old.weight, results["backward"].adapters[2].to_old.weight)


def test_gallery_accuracy_templates_and_images():
    gallery = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.8, 0.6]])
    g_labels = torch.tensor([0, 1, 1])
    queries = torch.tensor([[0.9, 0.45]])
    assert gallery_accuracy(queries, torch.tensor([1]), gallery, g_labels, "images") == 1.0
    assert gallery_accuracy(queries, torch.tensor([1]), gallery, g_labels, "templates") == 0.0


def test_each_adapter_default_is_written_once_and_saved_with_the_run_config():
    assert yaml.safe_load((CONFIG_DIR / "default.yaml").read_text())["adapter_params"] == {}
    for name in list_adapters():
        defaults = {f.name: f.default for f in dataclasses.fields(get_adapter(name).Config)}
        resolved = assemble(resolve([("test", {"scenario": "model_update", "adapter": {"name": name}})])).config
        assert resolved["adapter_params"] == {name: defaults}, name


def test_adapter_errors_name_the_setting():
    with pytest.raises(AdapterError, match="adapter_params.lambda_orth.constraint"):
        make_adapter("lambda_orth", {"lambda_orth": {"constraint": "loose"}})
    with pytest.raises(AdapterError, match="adapter_params.irp: unknown parameter"):
        make_adapter("irp", {"irp": {"omega": 3}})
    with pytest.raises(AdapterError, match="unknown adapter 'nope'"):
        get_adapter("nope")


def model_update_config(tiny, tmp_path):
    cfg = yaml.safe_load(tiny.read_text())
    cfg.update(scenario="model_update", adapter_params=SHORT_FITS | FEW_ROUNDS)
    cfg["stream"]["num_tasks"] = 2
    path = tmp_path / "update.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_model_update_runs_every_adapter_and_reports_its_cases(tiny, tmp_path, capsys):
    out = tmp_path / "out"
    config = model_update_config(tiny, tmp_path)
    assert run_cli("--config", config, "--adapter", "all", "--output", out, "--set", "evaluation.plots=true") == 0
    printed = capsys.readouterr().out
    records = {p.parent.parent.name: json.loads(p.read_text())
               for p in (out / "model_update" / "synthetic").rglob("metrics.json")}
    assert set(records) == {"none", *list_adapters()}
    for name, record in records.items():
        top1 = {case: None if v is None else v["top1"] for case, v in record["retrieval"]["cases"].items()}
        fill = record["retrieval"]["backfilling"]
        assert record["complete"] and record["method"] == name and record["protocol"] == "stream"
        cross = top1[cross_case(record["retrieval"]["cases"])]
        assert record["compatibility_matrix"] == [[top1["old/old"] / 100, None], [cross / 100, top1["new/new"] / 100]]
        assert record["metrics"]["AC"] == float(cross > top1["old/old"])
        assert set(record["retrieval"]["query_top1"]) <= {"old/old", *CROSS_CASES, "new/new"}
        hits = {case: unpack_hits(packed, record["retrieval"]["queries"])
                for case, packed in record["retrieval"]["query_top1"].items()}
        flips = record["retrieval"]["negative_flips"]
        lost = hits["old/old"] & ~hits[cross_case(record["retrieval"]["cases"])]
        assert flips["cross"] == pytest.approx([lost.mean()]) and len(flips["self"]) == 1
        for curve in fill["curves"].values():
            if curve is not None:
                start = next(top1[k] for k in ("new/F", "B/F", "new/old") if top1[k] is not None)
                end = top1["B/B"] if name == "lambda_orth" else top1["new/new"]
                assert curve["top1"][0] == start and curve["top1"][-1] == end
        assert (out / "model_update/synthetic" / name / "seed42" / "backfilling.png").is_file()
    assert records["lambda_orth"]["adapter"]["fits"][-1]["f_W"] >= 0
    assert records["fastfill"]["retrieval"]["backfilling"]["curves"]["uncertainty"] is not None
    assert records["fct"]["retrieval"]["backfilling"]["curves"]["uncertainty"] is None
    old_paths = {r["replacement_models"][0]["path"] for r in records.values()}
    assert len(old_paths) == 1
    assert "B/old top-1" in printed and "| lambda_orth" in printed and "recommendation" in printed.lower()
    assert run_cli("leaderboard", "--results", out) == 0
    assert "AUC random top-1" in capsys.readouterr().out


def test_stream_run_with_an_adapter_reports_the_adapted_matrix_and_resumes(tiny, tmp_path, monkeypatch):
    args = ["--config", tiny, "--strategy", "er", "--adapter", "procrustes", "--set", "adapter.at=every_task"]
    clean, broken = tmp_path / "clean", tmp_path / "broken"
    assert run_cli(*args, "--output", clean) == 0
    record = json.loads((clean / "iamcl2r/synthetic/er+procrustes/seed42/metrics.json").read_text())
    adapted, plain = record["compatibility_matrix"], record["unadapted_matrix"]
    assert [adapted[t][t] for t in range(3)] == [plain[t][t] for t in range(3)]
    assert adapted != plain and record["method"] == "er+procrustes"
    assert [f["task"] for f in record["adapter"]["fits"]] == [1, 2] and record["adapter"]["direction"] == "backward"
    assert record["unadapted_metrics"]["AA"] == pytest.approx(all_aa(plain))
    undo = interrupt_run_at(monkeypatch, 2)
    assert run_cli(*args, "--output", broken) == 130
    undo()
    assert run_cli(*args, "--output", broken, "--resume") == 0
    resumed = json.loads((broken / "iamcl2r/synthetic/er+procrustes/seed42/metrics.json").read_text())
    assert resumed["compatibility_matrix"] == adapted and resumed["unadapted_matrix"] == plain


def all_aa(matrix):
    return 100 * float(np.mean([v for row in matrix for v in row if v is not None]))


@pytest.mark.parametrize("args, fragment", [
    (["--adapter", "nope"], "unknown adapter 'nope'"),
    (["--adapter", "lambda_orth", "--set", "adapter.direction=forward"], "cannot fill a forward matrix"),
    (["--adapter", "fct", "--set", "adapter.direction=backward"], "cannot fill a backward matrix"),
    (["--adapter", "irp", "--set", "adapter_params.irp.delta=2"], "adapter_params.irp.delta"),
])
def test_bad_adapter_settings_are_one_line_errors(args, fragment, tiny, tmp_path, capsys):
    assert run_cli("--config", tiny, "--strategy", "er", "--output", tmp_path / "o", *args) == 2
    err = capsys.readouterr().err
    assert fragment in err and err.count("\n") == 1
