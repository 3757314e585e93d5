"""Assembly of every part (cl2r_bench/app/assembly.py): every scenario, strategy and adapter the suite offers runs on
the built-in data set, and each scenario's defaults fit it (or fail before anything runs with the --set that fixes
them)."""
import json

import pytest
import yaml
from helpers.adapter_pairs import FEW_ROUNDS, SHORT_FITS

from cl2r_bench.adapters import get_adapter, list_adapters
from cl2r_bench.app import cli as runner
from cl2r_bench.app.assembly import assemble, fills_stream_matrices
from cl2r_bench.config import resolve
from cl2r_bench.errors import ConfigError
from scenarios import list_scenarios
from strategies import list_strategies


def run_cli(*args):
    return runner.main([str(a) for a in args])


def finished(out, scenario):
    """``{label: record}`` of the complete runs under ``out/<scenario>/synthetic``."""
    records = {p.parent.parent.name: json.loads(p.read_text())
               for p in (out / scenario / "synthetic").rglob("metrics.json")}
    return {label: r for label, r in records.items() if r["complete"]}


@pytest.mark.parametrize("scenario", ["cl2r", "iamcl2r"])
def test_every_strategy_runs_on_the_built_in_data(scenario, tiny, tmp_path):
    out = tmp_path / "out"
    no_replacements = ["--set", "replacement.tasks=[]"] if scenario == "cl2r" else []
    assert run_cli("--config", tiny, "--scenario", scenario, "--strategy", "all", "--output", out,
                   "--set", "evaluation.plots=true", *no_replacements) == 0
    assert sorted(finished(out, scenario)) == sorted(list_strategies())


def test_every_adapter_runs_along_a_stream_on_the_built_in_data(tiny, tmp_path):
    config = yaml.safe_load(tiny.read_text()) | {"adapter_params": SHORT_FITS | FEW_ROUNDS}
    (tmp_path / "adapters.yaml").write_text(yaml.safe_dump(config))
    out = tmp_path / "out"
    assert run_cli("--config", tmp_path / "adapters.yaml", "--scenario", "iamcl2r", "--strategy", "er", "--adapter",
                   "all", "--output", out, "--set", "evaluation.plots=true") == 0
    streamed = [a for a in list_adapters() if fills_stream_matrices(get_adapter(a))]
    assert sorted(finished(out, "iamcl2r")) == sorted(["er", *(f"er+{a}" for a in streamed)])
    assert "slerp" in list_adapters() and "slerp" not in streamed, "a dual query fills no stream matrix"


@pytest.mark.parametrize("preset", ["quick", "paper"])
@pytest.mark.parametrize("scenario", list_scenarios())
def test_every_scenario_fits_the_built_in_data_by_default(scenario, preset):
    config = assemble(resolve([("command line",
                                {"scenario": scenario, "dataset": "synthetic", "preset": preset})])).config
    s, e = config["stream"], config["evaluation"]
    stream = s["initial_classes"] + s["increment"] * (s["num_tasks"] - 1)
    assert stream + (e["heldout_classes"] if e["dataset"] == "heldout" else 0) <= config["data"]["synthetic_classes"]


def test_the_fidelity_preset_is_tiny_imagenets_and_says_so_on_other_data():
    with pytest.raises(ConfigError, match=r"synthetic has 80; e\.g\. --set stream\.num_tasks=5"):
        assemble(resolve([("command line", {"scenario": "iamcl2r", "dataset": "synthetic", "preset": "fidelity"})]))


def test_a_stream_too_long_for_the_data_names_the_setting_that_fixes_it():
    with pytest.raises(ConfigError, match=r"synthetic has 80; e\.g\. --set stream\.num_tasks=13"):
        assemble(resolve([("command line", {"dataset": "synthetic", "stream": {"num_tasks": 20}})]))


def test_replacement_classes_must_fit_another_pretraining_data_set():
    with pytest.raises(ConfigError, match=r"asks up to 30 classes of cifar10; only 10 are free for pretraining"):
        assemble(resolve([("command line", {"dataset": "synthetic", "replacement": {"pretrain": {
            "dataset": "cifar10", "class_counts": [10, 20, 30]}}})]))
