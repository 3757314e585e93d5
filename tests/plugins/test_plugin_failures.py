"""A plugin's own failures: user code that raises or returns an unusable loss mid-run ends with one
line naming the strategy, the task and the iteration, exit code 4, the finished tasks kept, the traceback in the
run folder's error.log and the --resume command given; plugin files that share a name, or exit at import."""
import json
import textwrap

import pytest

from cl2r_bench.app import cli as runner

# Strategy names are global to the test process (the registry), so each plugin here registers its own.
PLUGIN = textwrap.dedent('''
    from pathlib import Path

    import torch
    import torch.nn.functional as F
    from strategies import Strategy, register_strategy

    BROKEN = Path({flag!r})


    @register_strategy("t29_breaks_at_task_1")
    class BreaksAtTask1(Strategy):
        def before_task(self, context):
            self.task = context.index

        def loss(self, step):
            if self.task == 1 and BROKEN.exists():
                raise ValueError("user code broke")
            return F.cross_entropy(step.logits, step.targets)


    @register_strategy("t29_float")
    class ReturnsFloat(Strategy):
        def loss(self, step):
            return F.cross_entropy(step.logits, step.targets).item()


    @register_strategy("t29_per_sample")
    class ReturnsPerSample(Strategy):
        def loss(self, step):
            return F.cross_entropy(step.logits, step.targets, reduction="none")


    @register_strategy("t29_detached")
    class ReturnsDetached(Strategy):
        def loss(self, step):
            return F.cross_entropy(step.logits, step.targets).detach()


    @register_strategy("t29_integer")
    class ReturnsInteger(Strategy):
        def loss(self, step):
            return torch.tensor(1)


    @register_strategy("t29_before_task")
    class BeforeTaskRaises(Strategy):
        def before_task(self, context):
            raise KeyError("no such thing")

        def loss(self, step):
            return F.cross_entropy(step.logits, step.targets)
''')


@pytest.fixture(scope="module")
def plugin(tmp_path_factory):
    """One file for the module: a strategy registered twice from two files is an error."""
    folder = tmp_path_factory.mktemp("plugin")
    flag, path = folder / "broken", folder / "user_strategy.py"
    path.write_text(PLUGIN.format(flag=str(flag)))
    flag.touch()
    return path, flag


def run(tiny, plugin_file, strategy, out, *extra):
    return runner.main(["--config", str(tiny), "--scenario", "cl2r", "--set", "replacement.tasks=[]", "--plugin",
                        str(plugin_file), "--strategy", strategy, "--output", str(out), *extra])


def test_a_plugin_loss_that_raises_mid_run_is_one_line_keeps_finished_tasks_and_resumes(tiny, plugin, tmp_path,
                                                                                        capsys):
    path, flag = plugin
    out = tmp_path / "out"
    folder = out / "cl2r/synthetic/t29_breaks_at_task_1/seed42"
    assert run(tiny, path, "t29_breaks_at_task_1", out) == runner.EXIT_STRATEGY_FAILED
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert ("strategy 't29_breaks_at_task_1' failed at task 1, iteration 1 of" in err
            and "ValueError: user code broke" in err and "--resume" in err and "tasks 0-0 are kept" in err), err
    log = (folder / "error.log").read_text()
    assert "Traceback" in log and 'raise ValueError("user code broke")' in log and str(path) in log
    record = json.loads((folder / "metrics.json").read_text())
    assert record["tasks_completed"] == 1 and not record["complete"]

    flag.unlink()  # the user fixes the strategy
    assert run(tiny, path, "t29_breaks_at_task_1", out, "--resume") == 0
    assert "resuming" in capsys.readouterr().out
    assert json.loads((folder / "metrics.json").read_text())["complete"]


@pytest.mark.parametrize("strategy, fragment", [
    ("t29_float", "its loss is a float, not a scalar tensor"),
    ("t29_per_sample", "its loss has shape (32,), not a scalar: reduce it"),
    ("t29_detached", "its loss has no gradient"),
    ("t29_integer", "its loss has dtype torch.int64, not a floating-point type"),
    ("t29_before_task", "failed at task 0, before_task: KeyError: 'no such thing'"),
])
def test_a_loss_that_cannot_train_is_one_line_naming_the_strategy_and_where(strategy, fragment, tiny, plugin,
                                                                            tmp_path, capsys):
    assert run(tiny, plugin[0], strategy, tmp_path / "out") == runner.EXIT_STRATEGY_FAILED
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"strategy {strategy!r}" in err and fragment in err, err
    assert "no task finished" in err


def test_two_plugin_files_of_one_name_both_load_and_loading_one_again_does_nothing(tmp_path):
    from cl2r_bench.plugins import load_plugin
    from strategies import list_strategies

    for folder, name in (("a", "t29_first"), ("b", "t29_second")):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "mine.py").write_text(
            f"from strategies import Strategy, register_strategy\n\n@register_strategy({name!r})\n"
            "class Mine(Strategy):\n    pass\n")
    for path in ("a/mine.py", "b/mine.py", "a/mine.py"):
        load_plugin(str(tmp_path / path))
    assert {"t29_first", "t29_second"} <= set(list_strategies())


@pytest.mark.parametrize("source, fragment", [
    ("import sys\n\nsys.exit(3)\n", "called sys.exit(3) while being imported (line 3)"),
    ("import sys\nsys.exit()\n", "called sys.exit(None) while being imported (line 2)"),
    ("x = 1\ny = x / 0\n", "failed to import (line 2): ZeroDivisionError: division by zero"),
])
def test_a_plugin_that_exits_or_fails_at_import_is_one_line_naming_its_line(source, fragment, tmp_path, capsys):
    path = tmp_path / "plugin.py"
    path.write_text(source)
    assert runner.main(["--scenario", "cl2r", "--dataset", "synthetic", "--plugin", str(path), "--output",
                        str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and fragment in err, err
    assert not (tmp_path / "out").exists()


def test_a_plugin_written_against_the_former_contract_paths_still_registers(tmp_path):
    """The strategy and scenario contracts moved into the kernel (cl2r_bench/strategy.py, cl2r_bench/scenario.py);
    ``strategies.base`` and ``scenarios.base`` re-export them, so an older plug-in file loads unchanged."""
    from cl2r_bench.plugins import load_plugin
    from cl2r_bench.scenario import SCENARIOS, Scenario
    from cl2r_bench.strategy import STRATEGIES, Strategy

    plugin = tmp_path / "old_paths.py"
    plugin.write_text("import torch.nn.functional as F\n"
                      "from scenarios.base import Scenario, register_scenario\n"
                      "from strategies.base import Step, Strategy, register_strategy\n\n"
                      "@register_strategy('old_path_strategy')\n"
                      "class OldPathStrategy(Strategy):\n"
                      "    '''Cross-entropy, written against strategies.base.'''\n"
                      "    def loss(self, step: Step):\n"
                      "        return F.cross_entropy(step.logits, step.targets)\n\n"
                      "@register_scenario('old_path_scenario')\n"
                      "class OldPathScenario(Scenario):\n"
                      "    '''CL2R, written against scenarios.base.'''\n")
    load_plugin(str(plugin))
    assert issubclass(STRATEGIES.classes["old_path_strategy"], Strategy)
    assert issubclass(SCENARIOS.classes["old_path_scenario"], Scenario)
