"""The fidelity study's machinery: pretraining until a plateau (resumable), open-set CIFAR-10 evaluation of any
stream."""
import json
import warnings
from pathlib import Path

import pytest
import torch
import yaml
from helpers.data_files import write_cifar10, write_tiny_imagenet

from cl2r_bench.app import cli as runner
from cl2r_bench.config import resolve
from cl2r_bench.data.datasets import DataNotice
from cl2r_bench.data.synthetic import make_synthetic
from cl2r_bench.training.pretrain import PlateauProgress, load_cached_model, pretrain_model
from cl2r_bench.training_settings import PlateauSettings, TrainSettings


def test_plateau_rule_decays_then_stops():
    rule = PlateauSettings.with_defaults(patience=2, decay=0.1, drops=1, min_delta=0.01)
    progress = PlateauProgress(lr=0.1)
    accuracies = [0.30, 0.40, 0.405, 0.41, 0.50, 0.505, 0.50]
    improved = [progress.update(a, rule, max_epochs=20) for a in accuracies]
    # 0.405 and 0.41 are within min_delta of 0.40: two epochs without gain -> lr x 0.1 after epoch 4;
    # 0.50 improves; 0.505 and 0.50 do not -> second plateau with no decay left -> finished after epoch 7
    assert improved == [True, True, False, False, True, False, False]
    assert [h["lr"] for h in progress.history] == pytest.approx([0.1] * 4 + [0.01] * 3)
    assert progress.finished and progress.best_epoch == 5 and progress.best_accuracy == 0.50
    capped = PlateauProgress(lr=0.1)
    assert [capped.update(0.1 * i, rule, max_epochs=3) or capped.finished for i in range(1, 4)][-1]
    assert capped.finished and capped.epochs_done == 3


def test_plateau_pretraining_resumes_from_its_last_epoch(tmp_path):
    data = make_synthetic(num_classes=4, train_per_class=16, test_per_class=4, image_size=16)
    kwargs = dict(head="learnable", model_kwargs={"backbone": "small_cnn", "small_width": 4, "small_out_dim": 8},
                  images_per_class=None, device=torch.device("cpu"), seed=0, partial=tmp_path / "m.partial.pt",
                  plateau=PlateauSettings.with_defaults(patience=50), log=lambda message: logged.append(message))
    logged = []
    settings = TrainSettings.with_defaults(epochs=2, batch_size=16, lr=0.05, progress=False, amp=False)
    _, first = pretrain_model(data, [0, 1, 2, 3], settings=settings, **kwargs)
    assert first["epochs_done"] == 2 and first["finished"] and first["validation_images"] == 16
    saved = torch.load(tmp_path / "m.partial.pt", weights_only=True)
    assert saved["progress"]["epochs_done"] == 2 and set(saved) == {"model", "best_model", "optimizer", "progress"}
    logged.clear()
    _, resumed = pretrain_model(data, [0, 1, 2, 3],
                                settings=TrainSettings.with_defaults(**{**settings.__dict__, "epochs": 3}),
                                **kwargs)
    assert any("after epoch 2" in m for m in logged)
    assert resumed["epochs_done"] == 3 and [h["epoch"] for h in resumed["history"]] == [1, 2, 3]
    assert resumed["history"][:2] == first["history"]


def test_plateau_schedule_is_validated(tiny, tmp_path, capsys):
    code = runner.main(["--config", str(tiny), "--output", str(tmp_path / "o"), "--set",
                        "replacement.pretrain.schedule=step"])
    assert code == 2 and "['cosine', 'plateau']" in capsys.readouterr().err


def test_fidelity_preset_is_the_issue_protocol():
    cfg = resolve([("command line", {"preset": "fidelity"})])
    assert cfg["dataset"] == "tinyimagenet" and cfg["evaluation"]["dataset"] == "cifar10"
    assert cfg["evaluation"]["queries_per_class"] is None and cfg["stream"]["images_per_class"] == 300
    assert (cfg["stream"]["initial_classes"], cfg["stream"]["increment"], cfg["stream"]["num_tasks"]) == (10, 15, 7)
    pre = cfg["replacement"]["pretrain"]
    assert pre["schedule"] == "plateau" and pre["class_counts"] == [25, 50, 100] and pre["images_per_class"] is None
    assert cfg["model"]["backbone"] == "resnet18" and cfg["training"]["epochs"] == 70


def test_cifar10_evaluation_of_a_synthetic_stream_with_a_notice(tiny, tmp_path, monkeypatch):
    write_cifar10(tmp_path / "data", per_class=4)
    out = tmp_path / "out"
    monkeypatch.setattr(warnings, "formatwarning", warnings.formatwarning)
    with pytest.warns(DataNotice) as notices:
        code = runner.main(["--config", str(tiny), "--strategy", "er", "--scenario", "cl2r",
                            "--set", "replacement.tasks=[]", "--output", str(out),
                            "--data-root", str(tmp_path / "data"), "--eval-dataset", "cifar10"])
    assert code == 0
    record = json.loads((out / "cl2r/synthetic/er/seed42/metrics.json").read_text())
    assert record["config"]["evaluation"]["dataset"] == "cifar10"
    assert record["evaluation"]["queries"] == 5 * 10 * 4 and record["evaluation"]["gallery_images"] == 10 * 4
    line = warnings.formatwarning(notices[0].message, DataNotice, "datasets.py", 1)
    assert line.startswith("notice: cifar10: 7 of 7 files") and line.count("\n") == 1
    assert "differ from the official release" in line and "verify=strict" in line


def test_cifar10_evaluation_needs_the_streams_image_size(tiny, tmp_path, capsys):
    write_cifar10(tmp_path / "data")
    code = runner.main(["--config", str(tiny), "--output", str(tmp_path / "o"), "--data-root", str(tmp_path / "data"),
                        "--eval-dataset", "cifar10", "--set", "data.image_size=16", "--set", "data.verify=off"])
    err = capsys.readouterr().err
    assert code == 2 and "data.image_size=32" in err and len(err.strip().splitlines()) == 1


def _pretrained(cache: Path) -> list[tuple[int, int]]:
    """(classes, seed) of each model in a replacement cache."""
    specs = [json.loads(p.read_text()) for p in cache.glob("*.json")]
    return sorted((len(spec["classes"]), spec["seed"]) for spec in specs)


def test_replacement_models_get_one_seed_each_from_a_list(tiny, tmp_path):
    cache = tmp_path / "cache"
    assert runner.main(["pretrain", "--config", str(tiny), "--set", "replacement.pretrain.seed=[3,4]"]) == 0
    assert _pretrained(cache) == [(3, 3), (6, 4)]
    assert runner.main(["pretrain", "--config", str(tiny), "--set", "replacement.pretrain.seed=3"]) == 0
    assert _pretrained(cache) == [(3, 3), (6, 3), (6, 4)]  # the first model is shared, hence reused
    assert len(list(cache.glob("*.pt"))) == 3


def test_a_short_seed_list_is_a_usage_error(tiny, capsys):
    assert runner.main(["pretrain", "--config", str(tiny), "--set", "replacement.pretrain.seed=[3]"]) == 2
    assert "one int, or a list of 2 ints" in capsys.readouterr().err


def test_cross_model_table_has_own_accuracy_on_its_diagonal(tiny, tmp_path, capsys):
    from benchmarks.retrieval import CompatibilityEvaluator
    from cl2r_bench.app.assembly import assemble
    from tools import cross_model

    assert runner.main(["pretrain", "--config", str(tiny), "--set", "replacement.pretrain.seed=[3,4]"]) == 0
    paths = sorted((tmp_path / "cache").glob("*.pt"))
    stream = assemble(resolve([("tiny", yaml.safe_load(tiny.read_text()))])).scenario.stream()
    models = [load_cached_model(p, mean=stream.mean, std=stream.std)[0] for p in paths]
    table = cross_model.cross_accuracies(models + models[:1], stream.query, stream.gallery, mode="templates")
    evaluator = CompatibilityEvaluator(stream.query, stream.gallery, amp=False)
    assert [table[i][i] for i in range(2)] == [evaluator.self_test(m) for m in models]
    assert table[2] == table[0] and [row[2] for row in table] == [row[0] for row in table]
    capsys.readouterr()
    assert cross_model.main(["--config", str(tiny), *map(str, paths), "--queries", "20"]) == 0
    out = capsys.readouterr().out
    assert "20 queries" in out and "3 cls, seed 3" in out and "6 cls, seed 4" in out


def test_scale_summary_has_one_row_per_seed_from_its_metrics(tiny, tmp_path, capsys):
    from tools import scale_summary

    out = tmp_path / "study" / "tiny-e1"
    assert runner.main(["run", "--config", str(tiny), "--strategy", "er", "--seeds", "1", "2",
                        "--output", str(out)]) == 0
    capsys.readouterr()
    scale_summary.main(str(tmp_path / "study"))
    lines = capsys.readouterr().out.splitlines()
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:]]
    assert [r[:6] for r in rows] == [["tiny-e1", "er", "small_cnn", "1", str(s), "independent"] for s in (1, 2)]
    for seed, r in zip((1, 2), rows, strict=True):
        record = json.loads(next(out.rglob(f"seed{seed}/metrics.json")).read_text())
        assert r[7] == f"{record['metrics']['AC']:.3f}" and r[-3] == f"{record['metrics']['AA']:.2f}"
        assert r[-1] == str(record["noise"]["queries"])


def test_feature_geometry_measures_spread_and_pairing_by_hand():
    from tools.feature_geometry import mean_resultant_length, paired_cosine

    assert mean_resultant_length(torch.tensor([[3.0, 0.0], [0.0, 0.5]])) == pytest.approx(0.5 ** 0.5)
    assert mean_resultant_length(torch.tensor([[1.0, 1.0], [2.0, 2.0]])) == pytest.approx(1.0)
    assert paired_cosine(torch.tensor([[1.0, 0.0], [1.0, 0.0]]),
                         torch.tensor([[2.0, 0.0], [1.0, 1.0]])) == pytest.approx((1 + 0.5 ** 0.5) / 2)


def test_a_common_shift_sends_every_query_to_one_class_and_removing_it_recovers_them():
    from tools.feature_geometry import pair_diagnosis, searchable_gallery

    old = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    new = torch.nn.functional.normalize(old + torch.tensor([2.0, 0.0, 0.0]), dim=1)
    labels = torch.tensor([0, 1])
    gallery = searchable_gallery(old, labels, "templates")
    # class 1's query moves to (2, 1, 0)/sqrt(5): nearer template 0 (cosine 0.894) than template 1 (0.447)
    assert pair_diagnosis(new, old, labels, gallery) == pytest.approx(
        {"accuracy": 0.5, "top_class_share": 1.0, "accuracy_shift_removed": 1.0})
    assert pair_diagnosis(old, old, labels, gallery)["accuracy"] == 1.0


def test_feature_geometry_reads_a_run_and_matches_its_matrix(tiny, tmp_path, capsys):
    from tools import feature_geometry

    out = tmp_path / "runs"
    assert runner.main(["run", "--config", str(tiny), "--strategy", "dsimplex_fd", "--output", str(out)]) == 0
    run = next(out.rglob("seed*/metrics.json")).parent
    matrix = json.loads((run / "metrics.json").read_text())["compatibility_matrix"]
    capsys.readouterr()
    assert feature_geometry.main([str(run)]) == 0
    lines = capsys.readouterr().out.splitlines()
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines if line.startswith("| ")]
    models = [c for c in cells if c[0].isdigit()]
    pairs = {c[0]: c for c in cells if c[0].startswith("(")}
    assert [m[1] for m in models] == [f"{100 * matrix[t][t]:.1f}" for t in range(3)]
    assert models[0][3] == "-" and all(0 < float(m[2]) <= 1 for m in models)
    assert sorted(pairs) == ["(1,0)", "(2,0)", "(2,1)"]
    assert all(pairs[f"({t},{k})"][1] == f"{100 * matrix[t][k]:.1f}" for t, k in ((1, 0), (2, 0), (2, 1)))
    assert feature_geometry.main([str(tmp_path / "nowhere")]) == 2
    assert "pass a run folder" in capsys.readouterr().err


def test_any_data_set_with_a_profile_is_an_open_set_evaluation_not_only_cifar10(tiny, tmp_path):
    """Tiny ImageNet's train images (3 classes x 4) are the queries and its val images (1 per class) the class
    templates' images, read at the stream's 32x32."""
    write_tiny_imagenet(tmp_path / "data", classes=3, train_per_class=4)
    out = tmp_path / "out"
    code = runner.main(["--config", str(tiny), "--strategy", "er", "--scenario", "cl2r", "--set",
                        "replacement.tasks=[]", "--output", str(out), "--data-root", str(tmp_path / "data"),
                        "--eval-dataset", "tinyimagenet"])
    assert code == 0
    record = json.loads((out / "cl2r/synthetic/er/seed42/metrics.json").read_text())
    assert record["config"]["evaluation"]["dataset"] == "tinyimagenet"
    assert record["evaluation"]["queries"] == 3 * 4 and record["evaluation"]["gallery_images"] == 3
