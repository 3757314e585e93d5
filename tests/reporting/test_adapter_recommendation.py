"""The answer of an adapter study (cl2r_bench/reporting/adapter_recommendation.py): the paired interval over seeds and
queries, the share of the gallery to re-embed, one row per adapter and the recommendation, on records whose values
are known."""
import numpy as np
import pytest

from benchmarks.record import pack_hits, unpack_hits
from cl2r_bench.reporting.adapter_answer import summary_json, summary_text
from cl2r_bench.reporting.adapter_recommendation import paired_gain_interval, recommendation, reembed_share, summarise

N = 400


def test_hits_survive_packing():
    hits = np.random.default_rng(0).random(1001) < 0.3
    assert np.array_equal(unpack_hits(pack_hits(hits), 1001), hits)


def test_the_paired_interval_is_the_mean_difference_over_queries():
    baseline = np.arange(N) % 2 == 0                                   # 50 %
    gain, (low, high) = paired_gain_interval(np.ones((1, N), bool), baseline)
    assert gain == pytest.approx(50.0) and low < 50 < high and high - low < 12   # 1.96 * 2.5 points either side
    gain, interval = paired_gain_interval(baseline[None, :], baseline)
    assert gain == 0 and interval == (0.0, 0.0)
    two_seeds = np.stack([np.ones(N, bool), np.zeros(N, bool)])        # each query: a hit in one seed of two
    assert paired_gain_interval(two_seeds, np.zeros(N, bool))[0] == pytest.approx(50.0)


def test_the_gain_interval_holds_the_seeds_spread_and_the_shared_queries_noise():
    from benchmarks.noise import bootstrap_accuracies

    baseline = np.arange(N) < N // 2                                   # old/old 50 %
    seeds = np.stack([baseline | (np.arange(N) < 220), baseline | (np.arange(N) < 219),
                      baseline & (np.arange(N) >= 5)])                  # gains +5, +4.75, -1.25 points
    gain, (low, high) = paired_gain_interval(seeds, baseline)
    gains = np.array([5.0, 4.75, -1.25])
    queries = np.var(bootstrap_accuracies(seeds.astype(float) - baseline, 2000, 0).mean(axis=0) * 100, ddof=1)
    half = 4.302652729911275 * np.sqrt(np.var(gains, ddof=1) / 3 + queries)   # t(0.975, 2)
    assert gain == pytest.approx(gains.mean()) and (low, high) == pytest.approx((gain - half, gain + half))
    assert low < 0 < high, "three seeds this spread are within noise, whatever the queries say"
    one_fit = paired_gain_interval(np.stack([seeds[0]] * 3), baseline, one_fit=True)
    assert one_fit == paired_gain_interval(seeds[:1], baseline)        # one draw, however many seeds name it


def test_the_share_to_re_embed_is_the_first_beta_within_95_percent_of_full_backfilling():
    assert reembed_share([0, 0.5, 1], [10.0, 60.0, 62.0]) == 0.5      # 0.95 x 62 = 58.9
    assert reembed_share([0, 0.5, 1], [59.0, 60.0, 62.0]) == 0.0
    assert reembed_share([0, 0.5, 1], [10.0, 20.0, 62.0]) == 1.0
    assert reembed_share([0, 0.5, 1], [10.0, 60.0, 62.0], full=70.0) is None      # one target: 0.95 x new/new 70
    assert reembed_share([0, 0.5, 1], [10.0, 60.0, 67.0], full=70.0) == 1.0


def record(method: str, seed: int, *, cross: str | None, cross_top1: float, hits: np.ndarray, auc: float,
           curve: list[float], fit: dict | None = None) -> dict:
    old = np.arange(N) < N // 2                                        # old/old: 50.0 top-1
    cases = {"old/old": {"top1": 50.0, "top5": 70.0, "mAP": 30.0}, "new/new": {"top1": 70.0, "top5": 80.0,
                                                                             "mAP": 45.0}}
    top1 = {"old/old": pack_hits(old)}
    if cross:
        cases[cross] = {"top1": cross_top1, "top5": 75.0, "mAP": 31.0}
        top1[cross] = pack_hits(hits)
    return {"method": method, "seed": seed, "adapter": None if fit is None else {"name": method, "fits": [fit]},
            "timings": {"adapter_fit_seconds": 2.0 if fit else 0.0},
            "retrieval": {"cases": cases, "query_top1": top1, "queries": N,
                          "backfilling": {"betas": [0, 0.5, 1], "curves": {"random": {"top1": curve, "mAP": curve}},
                                          "auc": {"random": {"top1_auc": auc, "mAP_auc": auc}}}}}


def study() -> list[dict]:
    better = np.arange(N) < int(N * 0.6)                               # 60 %: +10 points on every query it adds
    return [record("none", 0, cross="new/old", cross_top1=1.0, hits=np.arange(N) < 4, auc=40.0,
                   curve=[1.0, 40.0, 70.0]),
            *[record("lambda_orth", s, cross="B/old", cross_top1=60.0, hits=better, auc=66.0,
                     curve=[60.0, 67.0, 70.0], fit={"converged": True, "steps": 900}) for s in (0, 1, 2)],
            record("procrustes", 0, cross="B/old", cross_top1=50.0, hits=np.arange(N) < N // 2, auc=60.0,
                   curve=[50.0, 60.0, 70.0], fit={"anchors": 100.0})]


def test_one_row_per_adapter_says_whether_it_is_compatible():
    rows = {r.adapter: r for r in summarise(study())}
    lam = rows["lambda_orth"]
    assert (lam.seeds, lam.cross_case, lam.compatible, lam.converged) == (3, "B/old", "yes", True)
    assert lam.top1_gain == pytest.approx(10.0) and lam.mAP_gain == pytest.approx(1.0)
    assert lam.top1_interval[0] > 0 and (lam.backfill_order, lam.backfill_auc, lam.reembed_share) == ("random", 66.0,
                                                                                                       0.5)
    assert rows["procrustes"].compatible == "within noise" and rows["procrustes"].converged is None
    assert rows["none"].compatible == "no" and rows["none"].reembed_share == 1.0


def test_the_recommendation_names_the_compatible_adapter_and_its_backfilling():
    line = recommendation(summarise(study()))
    assert line.startswith("deploy lambda_orth: its B/old beats old/old by +10.0 top-1 points (95% interval")
    assert "re-embedding 50% of the gallery (random order) reaches 95% of new/new's top-1" in line
    text = summary_text(study())
    assert text.splitlines()[0].split()[:4] == ["adapter", "compatible", "top-1", "gain"], "deciding columns first"
    assert text.splitlines()[-1] == f"recommendation: {line}"
    assert summary_json(study())["recommendation"] == line


def test_without_a_compatible_adapter_the_recommendation_says_so_and_how_to_move():
    records = [r for r in study() if r["method"] != "lambda_orth"]
    line = recommendation(summarise(records))
    assert line.startswith("no adapter is compatible here (best cross case: procrustes's B/old, +0.0 top-1 points")
    assert line.endswith("with procrustes, re-embedding 100% of the gallery (random order) reaches 95% of "
                         "new/new's top-1")


def test_a_variant_measured_on_fewer_seeds_is_named_apart_not_recommended():
    luckier = np.arange(N) < int(N * 0.7)
    variant = record("lambda_orth-lam22", 0, cross="B/old", cross_top1=70.0, hits=luckier, auc=67.0,
                     curve=[70.0, 70.0, 70.0], fit={"converged": True, "steps": 800})
    line = recommendation(summarise([*study(), variant]))
    assert line.startswith("deploy lambda_orth: its B/old beats old/old by +10.0 top-1 points")
    assert line.endswith("; not ranked, measured on fewer seeds: lambda_orth-lam22 (+20.0, 1 seed)")
    alone = [r for r in study() if r["method"] != "lambda_orth"] + [variant]
    assert recommendation(summarise(alone)).startswith("deploy lambda_orth-lam22")


def with_new_new(records: list[dict], hits: np.ndarray) -> list[dict]:
    """The records with new/new's per-query hits and its top-1 from them."""
    for r in records:
        r["retrieval"]["query_top1"]["new/new"] = pack_hits(hits)
        r["retrieval"]["cases"]["new/new"]["top1"] = 100 * float(hits.mean())
    return records


def test_the_answer_shows_both_models_and_says_do_not_upgrade_when_the_new_one_is_not_better():
    better = with_new_new(study(), np.arange(N) < int(N * 0.7))          # new/new 70 against old/old 50
    answer = summary_json(better)
    assert answer["models"]["old_old"] == 50.0 and answer["models"]["new_new"] == pytest.approx(70.0)
    assert answer["models"]["upgrade"] == "yes" and answer["models"]["interval"][0] > 0
    assert "the models: old/old top-1 50.0, new/new 70.0" in summary_text(better)
    assert answer["recommendation"].startswith("deploy lambda_orth")
    worse = with_new_new(study(), np.arange(N) < int(N * 0.48))          # new/new 48 against old/old 50
    answer = summary_json(worse)
    assert answer["models"]["upgrade"] == "no"
    assert answer["recommendation"].startswith("do not upgrade: the new model with every item re-embedded "
                                               "(new/new 48.0) is not above the old model on its own (old/old 50.0)")


def test_a_cross_case_above_new_new_is_flagged():
    records = with_new_new(study(), np.arange(N) < int(N * 0.55))          # B/old 60 beats new/new 55
    line = summary_json(records)["recommendation"]
    assert "B/old (60.0) is above new/new (55.0)" in line and "fitting and test classes differ" in line
    assert "is above new/new" not in summary_json(with_new_new(study(), np.arange(N) < int(N * 0.7)))[
        "recommendation"]


@pytest.mark.parametrize("fitted, start", [(80, "closed set: all the 80"), (30, "closed set: 30 of the 80"),
                                           (0, "open set: none of the 80")])
def test_the_answer_says_whether_the_test_classes_were_fitted(fitted, start):
    records = study()
    records[0]["models"] = {"test_classes": 80, "test_classes_fitted": fitted}
    assert summary_json(records)["classes"].startswith(start)
    assert start in summary_text(records)


def test_each_deployment_comes_with_its_cost():
    records = with_new_new(study(), np.arange(N) < int(N * 0.7))
    plan = summary_json(records)["deployments"]["lambda_orth"]
    assert [(d["case"], d["top1"], d["query_encoders"], d["vectors_rewritten"], d["images_reembedded"]) for d in plan] \
        == [("old/old", 50.0, "old", 0, 0), ("B/old", 60.0, "new + B", 0, 0),
            ("backfilled", 67.0, "new + B", 0, N // 2), ("new/new", 70.0, "new", 0, N)]
    assert plan[1]["fit_seconds"] == 2.0 and plan[0]["fit_seconds"] == 0.0
    assert "deployments with lambda_orth, and what each costs:" in summary_text(records)
    chosen = "re-embed 50% of the images (random order), the others as stored (backfilled, top-1 67.0)"
    assert summary_json(records)["deployment"].startswith(chosen), "B/old's 60.0 is short of 0.95 × 70.0 = 66.5"
    assert f"deployment: {chosen}" in summary_text(records)


def test_the_chosen_deployment_is_the_cheapest_that_reaches_95_percent_of_new_new_above_old_old():
    from cl2r_bench.reporting.adapter_recommendation import ModelsVerdict
    from cl2r_bench.reporting.deployments import Deployment, chosen_deployment

    def plan(b_old: float, new_f: float, backfilled: float) -> list:
        return [Deployment("keep the old model", "old/old", 50.0, "old", 0, 0, 0.0),
                Deployment("through B", "B/old", b_old, "new + B", 0, 0, 3.0),
                Deployment("through F", "new/F", new_f, "new", 1000, 0, 3.0),
                Deployment("re-embed 40%", "backfilled", backfilled, "new + B", 600, 400, 3.0),
                Deployment("re-embed all", "new/new", 62.0, "new", 0, 1000, 0.0)]

    upgrade = ModelsVerdict(50.0, 62.0, 12.0, (9.0, 15.0), "yes")
    target = "95% of new/new (58.9) above old/old (50.0)"          # 0.95 × 62.0 = 58.9
    assert chosen_deployment(plan(60.0, 61.0, 61.5), upgrade).startswith(
        f"through B (B/old, top-1 60.0): the cheapest that reaches {target}; it costs new + B per query, "
        "0 vectors rewritten, 0 images re-embedded")
    assert chosen_deployment(plan(56.0, 59.0, 61.5), upgrade).startswith("through F (new/F, top-1 59.0)")
    assert chosen_deployment(plan(56.0, 58.0, 60.0), upgrade).startswith("re-embed 40% (backfilled, top-1 60.0)")
    assert chosen_deployment(plan(56.0, 58.0, 58.5), upgrade).startswith(
        f"re-embed all (new/new, top-1 62.0): no cheaper deployment reaches {target}")
    stay = ModelsVerdict(50.0, 50.5, 0.5, (-1.0, 2.0), "no")
    assert chosen_deployment(plan(60.0, 61.0, 61.5), stay).startswith("keep the old model (old/old, top-1 50.0)")
    low_target = plan(49.0, 48.0, 47.0)
    low_target[-1] = Deployment("re-embed all", "new/new", 51.0, "new", 0, 1000, 0.0)   # target 48.5 < old/old
    assert chosen_deployment(low_target, upgrade).startswith("re-embed all"), "below old/old is no upgrade"


@pytest.mark.parametrize("adapted, reaches", [(66.6, True), (66.4, False)])
def test_the_recommendation_and_the_deployment_read_one_estimate_at_the_boundary(adapted, reaches):
    """An adapter with both maps (λ-orth): its backfilling curve at β = 0 is B/F, the stored vectors rewritten
    through F and queries through B, a deployment of its own beside B/old. B/old (66.4) is short of 0.95 × 70.0 =
    66.5; B/F at 66.6 reaches it, at 66.4 it does not: the recommendation and the chosen deployment say the same
    either way (they once read B/F's curve and B/old's case and disagreed, seen at 53.9 against a target of 54.0)."""
    records = with_new_new([record("lambda_orth", s, cross="B/old", cross_top1=66.4, hits=np.arange(N) < int(N * 0.664),
                                   auc=68.0, curve=[adapted, 68.0, 70.0], fit={"converged": True, "steps": 900})
                            for s in (0, 1)], np.arange(N) < int(N * 0.7))
    for r in records:
        r["retrieval"]["cases"].update({"F/F": {"top1": 60.0}, "B/F": {"top1": adapted}})
    answer = summary_json(records)
    plan = {d["case"]: d for d in answer["deployments"]["lambda_orth"]}
    assert list(plan) == ["old/old", "B/old", "B/F" if reaches else "backfilled", "new/new"]
    if reaches:
        assert "the adapted gallery already gives 95% of new/new's top-1 with nothing re-embedded" in \
            answer["recommendation"]
        assert (plan["B/F"]["top1"], plan["B/F"]["vectors_rewritten"], plan["B/F"]["images_reembedded"]) == \
            (66.6, N, 0)
        assert answer["deployment"].startswith("rewrite every stored vector through F, no image read, new queries "
                                               "through B (B/F, top-1 66.6): the cheapest that reaches 95%")
    else:
        assert "re-embedding 50% of the gallery (random order) reaches 95% of new/new's top-1" in \
            answer["recommendation"]
        assert answer["deployment"].startswith("re-embed 50% of the images (random order), the others through F "
                                               "(backfilled, top-1 68.0)")


def test_the_negative_flips_stand_beside_the_gain_for_the_cross_case_and_every_deployment():
    """old/old hits the first half of the queries; the cross case hits the first 60 %: it flips none of old/old's
    hits. A case that hits queries 100-339 instead loses old/old's queries 0-99: 100 of 400, 25 %."""
    records = with_new_new(study(), np.arange(N) < int(N * 0.7))
    case_hits = (np.arange(N) >= 100) & (np.arange(N) < 340)
    for seed in (r for r in records if r["method"] == "lambda_orth"):
        seed["retrieval"]["case_flips"] = {"B/old": float(np.mean((np.arange(N) < N // 2) & ~case_hits)),
                                           "new/new": 0.0}
    row = next(r for r in summary_json(records)["summary"] if r["adapter"] == "lambda_orth")
    assert row["negative_flips"] == pytest.approx(25.0)
    plan = {d["case"]: d["negative_flips"] for d in summary_json(records)["deployments"]["lambda_orth"]}
    assert plan["old/old"] is None and plan["B/old"] == pytest.approx(25.0) and plan["new/new"] == 0.0
    assert "negative flips %" in summary_text(records)


def test_a_dual_query_is_the_cross_case_and_a_deployment_that_keeps_the_old_encoder_running():
    records = with_new_new([record("slerp", 0, cross="old+new/old", cross_top1=68.0,
                                   hits=np.arange(N) < int(N * 0.68), auc=0.0, curve=[0.0, 0.0, 0.0],
                                   fit={"seconds": 0.3})], np.arange(N) < int(N * 0.7))
    records[0]["retrieval"]["backfilling"] = {"betas": [0, 0.5, 1], "curves": {"random": None},
                                              "auc": {"random": None}}
    row = summary_json(records)["summary"][0]
    assert row["cross_case"] == "old+new/old" and row["compatible"] == "yes"
    plan = summary_json(records)["deployments"]["slerp"]
    assert [(d["case"], d["query_encoders"], d["vectors_rewritten"], d["images_reembedded"]) for d in plan] == [
        ("old/old", "old", 0, 0), ("old+new/old", "old + new", 0, 0), ("new/new", "new", 0, N)]
    assert summary_json(records)["deployment"].startswith(
        "embed each query with both models against the untouched index (the old encoder keeps running) "
        "(old+new/old, top-1 68.0")


def test_the_cost_figure_puts_each_deployment_at_its_step_of_cost_cheapest_first():
    from cl2r_bench.reporting.cost_figure import COST_ORDER, deployment_cost_figure, deployment_points
    from cl2r_bench.reporting.plots import png_bytes

    records = with_new_new(study(), np.arange(N) < int(N * 0.7))
    rows = summarise(records)
    points = deployment_points(rows, records)
    assert COST_ORDER == ("old/old", "B/old", "new/F", "B/F", "old+new/old", "backfilled", "new/new")
    assert points["lambda_orth"] == [(1, 60.0, ""), (5, 67.0, "50%")]
    assert points["procrustes"][0] == (1, 50.0, "")
    assert png_bytes(deployment_cost_figure, "t", rows, records).startswith(b"\x89PNG")
