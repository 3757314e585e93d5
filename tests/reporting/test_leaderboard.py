"""How the leaderboard names and summarises experiments (cl2r_bench/reporting/leaderboard.py): encoders by short name,
no
spread for a value that no seed changes, and the negative flip rates of measured and published rows."""
import math

import pytest
from helpers.records import DELETE, MATRIX, changed, valid_record

from cl2r_bench.reporting import published_tables
from cl2r_bench.reporting.experiments import experiment_groups, models_label, short_model_name, study_groups
from cl2r_bench.reporting.leaderboard import MAIN_COLUMNS, _spread, build, leaderboard_rows, replacement_rows
from cl2r_bench.reporting.published_tables import PUBLISHED_MAIN_COLUMNS, published_case_rows, published_main_rows
from cl2r_bench.reporting.tables import Column, Kind, Table, cell_text, render


@pytest.mark.parametrize("spec, name", [
    ("timm:tf_efficientnet_lite0@results/pretrained/weights/tf_efficientnet_lite0.pth", "Lite0"),
    ("timm:tf_efficientnet_lite2", "Lite2"),
    ("suite:results/pretrained/models/learnable-resnet18-200cls-b3c40a4bcac8.pt", "ResNet-18"),
    ("torchvision:resnet50:IMAGENET1K_V2", "ResNet-50"),
    ("timm:efficientnet_b3", "EfficientNet-B3"),
    ("efficientnet_lite:lite1", "Lite1"),
    ("timm:vit_small_patch14_dinov2.lvd142m", "vit_small_patch14_dinov2.lvd142m"),
])
def test_encoders_get_short_names(spec, name):
    assert short_model_name(spec) == name


def test_a_study_is_labelled_by_its_encoders_short_names():
    record = {"models": {"old": {"spec": "timm:tf_efficientnet_lite0@w0.pth"},
                         "new": {"spec": "timm:tf_efficientnet_lite2"}}}
    assert models_label(record) == "Lite0 → Lite2" and models_label({"models": {"train": "a.npz"}}) == "embeddings"
    assert models_label({"protocol": "stream"}) == "trained on the stream"
    assert models_label({"models": {"train": "a.npz", "unseen_classes_drawn": 4}}) == "embeddings, open set"
    unpaired = {**record, "config": {"model_update": {"pairing": "unpaired"}}}
    assert models_label(unpaired) == "Lite0 → Lite2, unpaired", "never summarised with the paired study"


def test_studies_of_one_pair_with_other_fitting_splits_are_answered_apart():
    """The open set fitted on 10 and on 20 images per class: one pair of models, two studies; the adapters and seeds
    within a study stay together."""
    models = {"old": {"spec": "timm:tf_efficientnet_lite0@w0.pth"}, "new": {"spec": "timm:tf_efficientnet_lite2"}}

    def record(adapter: str, seed: int, per_class: int) -> dict:
        return {"models": models, "scenario": "model_update", "dataset": "tinyimagenet", "method": adapter,
                "seed": seed, "config": {"seed": seed, "adapter": {"name": adapter},
                                         "adapter_params": {adapter: {"steps": seed}},
                                         "model_update": {"fit_per_class": per_class}}}

    records = [record(a, s, n) for n in (10, 20) for a in ("procrustes", "fct") for s in (0, 1)]
    groups = study_groups(records)
    assert {label: [(r["method"], r["seed"]) for r in runs] for label, runs in groups.items()} == {
        f"Lite0 → Lite2 [model_update.fit_per_class={n}]": [("procrustes", 0), ("procrustes", 1), ("fct", 0),
                                                            ("fct", 1)] for n in (10, 20)}
    assert list(study_groups(records[:4])) == ["Lite0 → Lite2"], "one study keeps the models' label"


def test_a_value_no_seed_changes_has_no_spread():
    column = Column("old/old top-1", "x", Kind.SPREAD)
    assert cell_text(_spread([51.7, 51.7, 51.7]), column) == "51.70"
    assert cell_text(_spread([51.0, 52.0]), column) == "51.50 ± 0.71"
    assert _spread([51.7]) == (51.7, None) and _spread([]) is None


def test_the_main_table_shows_the_negative_flip_rates_in_percent_mean_and_std_over_seeds():
    """Seed 1 flips 2.5 % (self) and 7.5 % (cross) of the queries on average, seed 2 7.5 % and 12.5 %; a run
    without flips (a record before them) adds nothing, and an experiment with none shows '-'."""
    second = changed(valid_record(2), "negative_flips", {"self": [0.15, 0.0], "cross": [0.1, 0.15],
                                                         "mean_self": 0.075, "mean_cross": 0.125})
    older = changed(valid_record(3), "negative_flips", DELETE)
    (row,) = leaderboard_rows([valid_record(1), second, older])
    assert [c.name for c in MAIN_COLUMNS[6:8]] == ["NFR_self", "NFR_cross"]
    assert row[6] == pytest.approx((5.0, 5 / math.sqrt(2))) and row[7] == pytest.approx((10.0, 5 / math.sqrt(2)))
    assert row[8] == "40.0 / 50.0" and row[9] == 3  # each replacement's own top-1, mean over seeds (no family: older)
    text = render(build([valid_record(1), second], names=["main"])["main"])
    header, _, cells = text.splitlines()
    assert [h.strip() for h in header.split("|")[7:9]] == ["NFR self (%)", "NFR cross (%)"]
    assert [c.strip() for c in cells.split("|")[7:9]] == ["5.00 ± 3.54", "10.00 ± 3.54"]
    (alone,) = leaderboard_rows([older])
    assert alone[6] is None and alone[7] is None and "| -" in render([Table(MAIN_COLUMNS, [alone])])


def test_published_rows_take_the_negative_flips_a_paper_gives(monkeypatch):
    figures = {**published_tables.IAMCL2R_31_TASKS,
               "negative_flips": {"er": {"mean_self": 0.02, "mean_cross": 0.3}}}
    monkeypatch.setattr(published_tables, "IAMCL2R_31_TASKS", figures)
    rows = {(row[1], row[2]): row for row in published_main_rows({"iamcl2r"})}
    assert [c.name for c in PUBLISHED_MAIN_COLUMNS[6:8]] == ["NFR_self", "NFR_cross"]
    assert rows[(figures["setting"], "er")][6:8] == pytest.approx([2.0, 30.0])
    assert rows[(figures["setting"], "dsimplex_hoc")][6:8] == [None, None]
    assert all(row[6:8] == [None, None] for (setting, _), row in rows.items() if setting != figures["setting"])


def test_the_adapter_papers_rows_stand_beside_model_update_only():
    assert published_case_rows({"model_update"}) and published_case_rows({"adapt"}) == []


def test_a_setting_a_run_predates_splits_its_seeds_only_when_the_other_run_left_its_default():
    """Seed 1 ran before ``model_update.unseen_classes`` existed (its config lacks it), seed 2 with the default 0.0:
    one experiment of two seeds. Seed 3 held half the classes out (0.5): an experiment of its own, though seed 1
    lacks the key. A part's parameter one record lacks (its default is the part's, not in default.yaml) splits."""
    older = changed(valid_record(1), "config.model_update", {"head": "learnable"})
    newer = changed(valid_record(2), "config.model_update", {"head": "learnable", "unseen_classes": 0.0})
    other = changed(valid_record(3), "config.model_update", {"head": "learnable", "unseen_classes": 0.5})
    groups = experiment_groups([older, newer, other])
    assert sorted((label, [r["seed"] for r in runs]) for (_, _, label), runs in groups.items()) == [
        ("er [model_update.unseen_classes=0.0]", [1, 2]), ("er [model_update.unseen_classes=0.5]", [3])]
    param = changed(valid_record(4), "config.strategy_params", {"er": {"new_param": "x"}})
    assert len(experiment_groups([older, param])) == 2
    assert len(experiment_groups([older, newer, other, param])) == 3, "a key two groups both lack"


def test_seeds_run_under_other_speed_options_are_one_experiment():
    fused = changed(valid_record(1), "config.training.fused_optimizer", True)
    foreach = changed(changed(valid_record(2), "config.training.fused_optimizer", False),
                      "config.training.compile", "reduce-overhead")
    assert [[r["seed"] for r in runs] for runs in experiment_groups([fused, foreach]).values()] == [[1, 2]]


def test_experiments_that_differ_beyond_the_first_three_settings_of_their_tag_keep_their_own_runs():
    """Two experiments of one name that agree on the first three settings that tell the group apart and differ on a
    fourth: each keeps its own seeds under its own label (one overwrote the other, and the report lost its runs)."""
    def run(seed: int, unseen: float, pairing: str) -> dict:
        return changed(valid_record(seed), "config.model_update",
                       {"a": 1, "b": 2, "c": 3, "unseen_classes": unseen, "pairing": pairing})

    runs = [run(1, 0.0, "paired"), run(2, 0.5, "paired"), run(3, 0.0, "unpaired"),
            changed(changed(run(4, 0.0, "paired"), "config.model_update.a", 9), "config.model_update.b", 9)]
    runs[3] = changed(runs[3], "config.model_update.c", 9)
    groups = experiment_groups(runs)
    assert sorted(r["seed"] for members in groups.values() for r in members) == [1, 2, 3, 4]
    assert len(groups) == 4 and all(len(members) == 1 for members in groups.values())


def renamed(record: dict, name: str) -> dict:
    return {**record, "strategy": name, "method": name, "config": {**record["config"], "strategy": name}}


def test_experiments_that_measured_the_same_seed_for_seed_are_one_row_naming_both():
    same = [renamed(valid_record(seed), name) for name in ("bct", "bct_er") for seed in (1, 2)]
    other = renamed(changed(valid_record(1), "compatibility_matrix", [[0.4, None, None], [0.5, 0.6, None],
                                                                     [0.5, 0.6, 0.7]]), "er")
    rows = leaderboard_rows([*same, other])
    assert sorted(row[2] for row in rows) == ["bct = bct_er", "er"]
    assert next(row for row in rows if row[2] == "bct = bct_er")[-1] == 2
    one_seed_apart = [*same[:2], renamed(valid_record(1), "bct_er")]        # bct_er lacks seed 2: not the same
    assert sorted(row[2] for row in leaderboard_rows(one_seed_apart)) == ["bct", "bct_er"]


def test_the_main_table_names_each_rows_starting_models_family_encoder_and_own_accuracy():
    record = valid_record(1)
    for model, encoder in zip(record["replacement_models"], ("efficientnet_lite:lite0", "efficientnet_lite:lite1"),
                              strict=True):
        model.update(family="learnable", encoder=encoder)
    (row,) = leaderboard_rows([record, valid_record(2)])
    assert row[8] == "learnable: Lite0 40.0 / Lite1 50.0"


def test_experiments_that_started_from_the_same_replacement_models_share_their_rows():
    """Two teacher arms of one strategy read the same replacement models: one set of rows names both; another
    family's models keep their own rows."""
    def record(strategy: str, seed: int, accuracy: float, first_entry: float) -> dict:
        out = changed(changed(valid_record(seed), "strategy", strategy), "method", strategy)
        out["config"] = {**out["config"], "strategy": strategy, "strategy_params": {strategy: {}}}
        out["compatibility_matrix"] = [[first_entry, None, None], *MATRIX[1:]]
        out["replacement_models"][0]["own_accuracy"] = accuracy
        return out

    rows = replacement_rows([record(name, seed, accuracy, first_entry)
                             for name, accuracy, first_entry in (("bct", 0.4, 0.5), ("lwf", 0.4, 0.45),
                                                                 ("dsimplex_hoc", 0.3, 0.4))
                             for seed in (1, 2)])
    assert [row[2:5] for row in rows] == [["bct, lwf", 0, 3], ["bct, lwf", 2, 6], ["dsimplex_hoc", 0, 3],
                                          ["dsimplex_hoc", 2, 6]]
    assert [round(row[5], 6) for row in rows] == [40.0, 50.0, 30.0, 50.0] and rows[0][7] == 2
