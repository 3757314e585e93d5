"""A user's own scenario, one file in a temporary folder and nothing else touched (docs/plugins.md): its settings are
its ``Config`` (``scenario_params.<name>``), checked before any training and written with the values used; no profile
is needed."""
import json
import textwrap

import pytest
import yaml

import runner

PLUGIN = '''
from dataclasses import dataclass

from cl2r_bench.plugin_settings import setting
from cl2r_bench.scenario import Scenario, register_scenario


@dataclass(frozen=True)
class EveryOtherConfig:
    every: int = setting(3, at_least=1)


@register_scenario("every_other")
class EveryOther(Scenario):
    """Fine-tune only at every ``every``-th task; the other tasks deploy the model unchanged."""
    Config = EveryOtherConfig

    def trains_task(self, task):
        return task % self.config.every == 0
'''


@pytest.fixture
def plugin(tmp_path):
    path = tmp_path / "elsewhere" / "every_other.py"
    path.parent.mkdir()
    path.write_text(textwrap.dedent(PLUGIN))
    return path


def run(tiny, plugin, out, *sets):
    return runner.main(["--config", str(tiny), "--plugin", str(plugin), "--scenario", "every_other", "--strategy",
                        "er", "--output", str(out), "--set", "replacement.tasks=[]",
                        *(part for assignment in sets for part in ("--set", assignment))])


def test_a_plugin_scenario_runs_on_its_own_settings_and_records_them(tiny, plugin, tmp_path):
    out = tmp_path / "out"
    assert run(tiny, plugin, out, "scenario_params.every_other.every=2", "evaluation.plots=true") == 0
    folder = out / "every_other" / "synthetic" / "er" / "seed42"
    assert {p.name for p in folder.glob("*.png")} == {"compatibility_matrix.png", "aa_per_task.png"}
    record = json.loads((folder / "metrics.json").read_text())
    assert [task["iterations"] > 0 for task in record["timings"]["tasks"]] == [True, False, True]
    assert yaml.safe_load((folder / "config.yaml").read_text())["scenario_params"] == {"every_other": {"every": 2}}


@pytest.mark.parametrize("assignment, fragment", [
    ("scenario_params.every_other.every=0", "scenario_params.every_other.every = 0 must be at least 1 and at most"),
    ("scenario_params.every_other.evry=2", "scenario_params.every_other: unknown parameter(s) ['evry']"),
    ("scenario_params.cl2r.every=2", "scenario_params.cl2r: unknown parameter(s) ['every']"),
])
def test_a_scenario_setting_that_is_wrong_is_one_line_before_any_training(tiny, plugin, tmp_path, capsys, assignment,
                                                                           fragment):
    assert run(tiny, plugin, tmp_path / "out", assignment) == 2
    err = capsys.readouterr().err
    assert fragment in err and err.strip().count("\n") == 0, err
    assert not (tmp_path / "out").exists()


def test_an_unknown_scenario_without_a_profile_is_one_line_naming_the_registered_ones(tiny, tmp_path, capsys):
    code = runner.main(["--config", str(tiny), "--scenario", "every_othr", "--output", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and "unknown scenario 'every_othr'; choose from ['cl2r', 'iamcl2r'" in err, err
