"""The BCT line's two-model protocol (``--scenario upgrade``, METHODS.md §6c): the old model as pretrained, the new
one from scratch against it on every class, the leave-one-out cases and their flips, the leaderboard's table."""
import json

import pytest
import torch

from benchmarks.record import record_problem, unpack_hits
from cl2r_bench.app import cli as runner
from cl2r_bench.data.streams import evaluation_sets
from cl2r_bench.data.synthetic import make_synthetic
from cl2r_bench.reporting.leaderboard import build
from cl2r_bench.reporting.published_tables import published_tables

UPGRADE = ["--scenario", "upgrade", "--set", "stream.num_tasks=2", "--set", "replacement.tasks=[]",
           "--set", "stream.initial_classes=6", "--set", "stream.increment=6", "--set", "evaluation.dataset=stream"]


def upgrade_run(tiny, tmp_path, strategy, monkeypatch=None, calls=None):
    if calls is not None:
        from cl2r_bench.training.trainers import StrategyTrainer
        original = StrategyTrainer.train

        def spy(self, model, task, memory, **kwargs):
            calls.append({"task": task.index, "labels": sorted(set(task.train.labels.tolist())),
                          "images": len(task.train), "teacher": kwargs["teacher"],
                          "teacher_classes": kwargs["teacher_classes"], "independent": kwargs.get("independent"),
                          "start": {k: v.clone() for k, v in model.state_dict().items()}})
            return original(self, model, task, memory, **kwargs)

        monkeypatch.setattr(StrategyTrainer, "train", spy)
    out = tmp_path / "out"
    assert runner.main(["--config", str(tiny), *UPGRADE, "--strategy", strategy, "--output", str(out)]) == 0
    return json.loads((out / f"upgrade/synthetic/{strategy}/seed42/metrics.json").read_text()), out


def test_the_new_model_trains_from_scratch_on_every_class_against_the_old_one(tiny, tmp_path, monkeypatch):
    calls = []
    record, out = upgrade_run(tiny, tmp_path, "bct", monkeypatch, calls)
    assert [c["task"] for c in calls] == [1], "the old model is pretrained, never trained by the strategy"
    call = calls[0]
    assert call["labels"] == list(range(12)) and call["images"] == 12 * 24
    assert call["teacher_classes"] == 6
    old = torch.load(out / "upgrade/synthetic/bct/seed42/checkpoints/task0.pt", weights_only=True)
    assert torch.equal(call["teacher"].state_dict()["head.classifier.weight"], old["head.classifier.weight"])
    assert not torch.equal(call["start"]["backbone.features.0.weight"], old["backbone.features.0.weight"])
    assert record["timings"]["tasks"][0]["iterations"] == 0 and record["timings"]["tasks"][1]["iterations"] > 0
    assert record_problem(record) is None
    assert runner.main(["--config", str(tiny), *UPGRADE, "--strategy", "bct", "--output", str(out), "--overwrite",
                        "--set", "evaluation.plots=true"]) == 0
    assert {p.name for p in (out / "upgrade/synthetic/bct/seed42").glob("*.png")} == {"compatibility_matrix.png",
                                                                                     "aa_per_task.png"}


def test_the_two_model_protocol_is_leave_one_out_on_the_test_split_with_its_flips(tiny, tmp_path, monkeypatch):
    from cl2r_bench.models import RetrievalModel
    from scenarios.upgrade import Upgrade
    seen: dict[int, int] = {}
    finish = Upgrade.finish

    def count(module, inputs, _output):
        if isinstance(module, RetrievalModel):
            seen[id(module)] = seen.get(id(module), 0) + len(inputs[0])

    def counted_finish(self, finished):
        hook = torch.nn.modules.module.register_module_forward_hook(count)
        try:
            return finish(self, finished)
        finally:
            hook.remove()

    monkeypatch.setattr(Upgrade, "finish", counted_finish)
    record, _ = upgrade_run(tiny, tmp_path, "lce")
    assert sorted(seen.values()) == [12 * 6, 12 * 6], \
        "each model runs over the test split once, for its features and its classifier's flips together"
    two = record["two_model"]
    assert set(two["cases"]) == {"old/old", "new/old", "new/new"}
    assert two["queries"] == 12 * 6                    # every test image of the 12 classes is a query
    old, cross = (unpack_hits(two["query_top1"][case], two["queries"]) for case in ("old/old", "new/old"))
    assert two["cases"]["old/old"]["top1"] == pytest.approx(100 * old.mean())
    assert two["negative_flips"]["cross"] == [pytest.approx(float((old & ~cross).mean()))]
    assert len(record["compatibility_matrix"]) == 2 and record["evaluation"]["queries"] == 12 * 6
    classification = two["classification"]
    assert 0 <= classification["nfr"] <= classification["old_top1"] <= 0.5   # the old classifier knows 6 of 12


def test_leaderboard_has_the_two_model_table_and_bt2_published_rows(tiny, tmp_path):
    record, _ = upgrade_run(tiny, tmp_path, "er")
    built = {**build([record]), "published": published_tables([record])}
    (table,) = built["two_model"]
    (row,) = table.rows
    assert row[:3] == ["upgrade", "synthetic", "er"]
    assert row[4][0] == pytest.approx(record["two_model"]["cases"]["new/old"]["top1"])
    assert row[-2][0] == pytest.approx(100 * record["two_model"]["classification"]["nfr"])
    published = [r for t in built["published"] for r in t.rows if r[-1].startswith("YifeiZhou02/BT-2")]
    assert ["bt2", "new/old", 38.7, 64.6, 27.7] == published[-2][1:6]
    ml_fct = [r for t in built["published"] for r in t.rows if r[-1] == "apple/ml-fct README"]
    assert [r[1:6] for r in ml_fct] == [["er", "old/old", 32.9, 59.3, 16.1], ["er", "new/new", 56.4, 77.5, 36.5]]
    from cl2r_bench.reporting.stream_verdict import two_model_verdict

    cases = record["two_model"]["cases"]
    verdict = two_model_verdict([record])
    gap = cases["new/old"]["top1"] - cases["old/old"]["top1"]
    assert verdict.startswith("1 of 1 experiments meet" if gap > 0 else "no experiment meets the BCT criterion")
    assert f"Closest: er, new/old {cases['new/old']['top1']:.2f} against old/old {cases['old/old']['top1']:.2f}" \
        in verdict, "an upgrade section's answer is the two-model protocol, not its two-task matrix's AC"
    per_task = int(record["metrics"]["AC"] == 1.0)
    assert verdict.endswith(f"there {per_task} of 1 have new/old above old/old in every seed."), \
        "the per-task matrix's different question is named beside the answer, not left to contradict it"
    twin = json.loads(json.dumps(record))
    twin["strategy"] = twin["method"] = twin["config"]["strategy"] = "fd"
    assert two_model_verdict([record, twin]).endswith(f"there {per_task} of 1 have new/old above old/old in every "
                                                      "seed."), "twins are one result here, as on the leaderboard"


def test_an_upgrade_report_section_opens_with_the_two_model_table(tiny, tmp_path):
    from cl2r_bench.reporting.report import section

    record, out = upgrade_run(tiny, tmp_path, "er")
    path = out / "upgrade/synthetic/er/seed42/metrics.json"
    part = section("upgrade", "synthetic", [(path, record)], tmp_path)
    titles = [table.title for table in part.tables]
    assert titles[0].startswith("Two-model protocol")
    assert any(title.startswith("Per-task matrix: AC / AA / ACA") for title in titles)
    assert "Leaderboard" not in titles


@pytest.mark.parametrize("flags, message", [
    (["--set", "stream.num_tasks=3"], "upgrade needs stream.num_tasks = 2"),
    (["--set", "replacement.tasks=[0]"], "upgrade pretrains its old model itself"),
])
def test_settings_it_cannot_run_are_one_line(tiny, tmp_path, capsys, flags, message):
    args = ["--config", str(tiny), *UPGRADE, *flags, "--strategy", "bct", "--output", str(tmp_path / "out")]
    assert runner.main(args) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_the_stream_evaluation_set_is_the_classes_test_images_against_their_train_images():
    data = make_synthetic(num_classes=10, train_per_class=5, test_per_class=3)
    order = list(range(10))
    query, gallery, reserved = evaluation_sets(data, order, 4, eval_dataset="stream", heldout_classes=0,
                                               queries_per_class=None, data_root="", download=False, verify="off",
                                               image_size=32, images_per_class=4)
    assert sorted(set(query.labels.tolist())) == [0, 1, 2, 3] and len(query) == 4 * 3
    assert len(gallery) == 4 * 4 and reserved == [0, 1, 2, 3]


def test_bt2_widens_the_new_model_and_ranks_its_old_frame_against_the_old_gallery(tiny, tmp_path, monkeypatch):
    calls = []
    record, out = upgrade_run(tiny, tmp_path, "bt2", monkeypatch, calls)
    independent = calls[0]["independent"]
    assert independent is not None and independent.head.classifier.out_features == 12
    old = torch.load(out / "upgrade/synthetic/bt2/seed42/checkpoints/task0.pt", weights_only=True)
    new = torch.load(out / "upgrade/synthetic/bt2/seed42/checkpoints/task1.pt", weights_only=True)
    assert "head.old_branch.weight" not in old and "head.old_branch.weight" in new
    width = old["head.classifier.weight"].shape[1]
    assert new["head.old_basis.parametrizations.weight.original"].shape == (width, width)   # the old frame
    two = record["two_model"]
    assert all(two["cases"][case] is not None for case in ("old/old", "new/old", "new/new"))
    assert len(record["compatibility_matrix"][1]) == 2 and record_problem(record) is None
