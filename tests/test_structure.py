"""The structure promised, checked on the code itself: defaults written once, the config read in one place,
a model that imports nothing of the suite, scenarios as registered plug-ins, and a package that installs and runs
from any directory."""
import ast
import dataclasses
import json
import pathlib
import re
import shutil
import subprocess
import sys
import types
import typing

import pytest
import yaml

from cl2r_bench.app.assembly import assemble
from cl2r_bench.config import CONFIG_DIR, EXTRA_TYPES, FREE_FORM, flatten, resolve
from cl2r_bench.settings import RunSettings, section_fields

ROOT = pathlib.Path(__file__).resolve().parents[1]
SUITE = ["cl2r_bench", "scenarios", "strategies", "benchmarks"]


def sources(*packages: str) -> list[pathlib.Path]:
    return sorted(p for package in packages for p in (ROOT / package).rglob("*.py"))


def test_no_source_file_cites_an_issue_number():
    """Issue numbers belong to a tracker the repository does not carry: a docstring says why, not which ticket."""
    files = sources(*SUITE, "tools", "tests") + sorted((ROOT / "cl2r_bench" / "configs").rglob("*.yaml"))
    citing = [f"{path.relative_to(ROOT)}:{number}" for path in files
              for number, line in enumerate(path.read_text().splitlines(), 1)
              if re.search(r"\bissues? \d+", line, re.IGNORECASE)]
    assert citing == []


def test_results_holds_records_figures_and_pages_only():
    """The scripts behind a study live in tools/ (tools/studies/ for the shell loops), not beside its records."""
    tracked = subprocess.run(["git", "ls-files", "results"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    assert not [path for path in tracked if path.endswith((".py", ".sh"))]


def test_every_setting_is_one_yaml_default_and_one_typed_field():
    defaults = yaml.safe_load((CONFIG_DIR / "default.yaml").read_text())
    yaml_keys = {k for k in flatten({k: v for k, v in defaults.items() if k not in FREE_FORM})}
    assert yaml_keys == set(section_fields()) - FREE_FORM
    assert all(defaults[section] == {} for section in FREE_FORM) and len(FREE_FORM) == 3


def test_the_settings_that_take_another_type_than_their_defaults_are_the_typed_unions():
    """``config.EXTRA_TYPES`` says which settings take values of another type than their default's (null, a list):
    the config module comes before the typed settings, which import it, so it keeps that list itself. It must name
    exactly the fields whose annotation is a union, with the union's types."""
    unions = {key: {typing.get_origin(member) or member for member in typing.get_args(hint)}
              for key, (_, hint) in section_fields().items() if isinstance(hint, types.UnionType)}
    assert {key: set(accepted) for key, accepted in EXTRA_TYPES.items()} == unions


def test_the_typed_settings_declare_no_default_of_their_own():
    for cls in {RunSettings} | {owner for owner, _ in section_fields().values()}:
        with_default = [f.name for f in dataclasses.fields(cls)
                        if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING]
        assert not with_default, f"{cls.__name__} repeats the YAML defaults of {with_default}"


def test_a_resolved_config_names_every_parameter_of_its_strategy_and_adapter():
    config = assemble(resolve([("test", {"strategy": "dsimplex_hoc", "adapter": {"name": "fct"}})])).config
    assert config["strategy_params"]["dsimplex_hoc"] == {"ce_weight": 0.1, "hoc_weight": 0.9, "mu": 10.0,
                                                         "mask": "zero", "replacement_teacher": "incoming"}
    assert config["adapter_params"]["fct"]["hidden"] == 2048
    assert config["adapter_params"]["fct"]["network"] == "side_projection"
    RunSettings.from_config(config)


def test_only_the_config_module_and_the_assembly_step_read_the_config_mapping():
    readers = []
    for path in sources("cl2r_bench", "scenarios", "strategies"):
        if path.name in ("config.py", "assembly.py"):
            continue
        text = path.read_text()
        if 'cfg["' in text or "cfg['" in text or 'config["' in text:
            readers.append(str(path.relative_to(ROOT)))
    assert readers == []


@pytest.mark.parametrize("leaf", ["cl2r_bench/orthogonal.py", "cl2r_bench/errors.py", "tools/parity/probe.py",
                                  "tools/parity/fct_probe.py"])
def test_leaf_modules_import_nothing_of_the_suite(leaf):
    """The orthogonal layer (under the heads) and the errors are the bottom of the import layers (pyproject.toml,
    checked by lint-imports); the parity probe runs under the authors' Python, where the suite is not installed."""
    tree = ast.parse((ROOT / leaf).read_text())
    imported = {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and not n.level}
    imported |= {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert imported.isdisjoint(SUITE), imported & set(SUITE)


def test_every_data_set_is_a_registered_plug_in_with_a_profile_and_each_profile_a_data_set():
    from cl2r_bench.config import choices
    from cl2r_bench.data.datasets import DATA_SETS

    assert DATA_SETS.names() == choices("datasets") == ["cifar10", "cifar100", "synthetic", "tinyimagenet"]


def test_the_four_scenarios_are_registered_plug_ins_with_a_profile():
    from scenarios import list_scenarios

    assert list_scenarios() == ["cl2r", "iamcl2r", "model_update", "upgrade"]
    assert all((CONFIG_DIR / "scenarios" / f"{name}.yaml").is_file() for name in list_scenarios())


INSTALLED = ("cl2r_bench", "scenarios", "strategies", "benchmarks")
"""The folders ``pip install .`` ships, each with every package below it."""


@pytest.mark.slow
def test_a_non_editable_install_runs_from_another_directory(tmp_path):
    """``pip install .`` (not editable, no dependencies: they are this environment's) ships the configs, and the
    ``cl2r-bench`` entry point lists what can be run from a directory that holds no checkout, and every package of
    the checkout imports there (``benchmarks.record`` and ``benchmarks.ranking`` included)."""
    source, target = tmp_path / "source", tmp_path / "site"
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    for name in tracked:
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--target", str(target), str(source)], check=True, capture_output=True)
    assert (target / "cl2r_bench" / "configs" / "default.yaml").is_file()
    assert (target / "cl2r_bench" / "reporting" / "templates" / "report.html.j2").is_file()
    installed = {path.name for path in target.iterdir() if path.name != "bin" and not path.name.endswith("-info")}
    assert installed == set(INSTALLED), "nothing under a generic top-level name beside the users' layout"
    assert not (target / "runner.py").exists() and not (target / "models.py").exists()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "cl2r_bench", "list"], cwd=elsewhere, env=env, capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr
    assert "iamcl2r" in done.stdout and "dsimplex_hoc" in done.stdout
    packages = sorted(str(init.parent.relative_to(ROOT)).replace("/", ".") for folder in INSTALLED
                      for init in (ROOT / folder).rglob("__init__.py"))
    imported = subprocess.run([sys.executable, "-c", f"import importlib; [importlib.import_module(p) for p in "
                               f"{packages!r}]"], cwd=elsewhere, env=env, capture_output=True, text=True)
    assert imported.returncode == 0, f"a package of the checkout is missing from the install: {imported.stderr}"


def test_every_adapter_satisfies_the_protocol_that_measuring_uses():
    from cl2r_bench.adapters import list_adapters, make_adapter
    from cl2r_bench.adapters.protocol import FeatureAdapter

    for name in list_adapters():
        assert isinstance(make_adapter(name, {}), FeatureAdapter), name


def test_a_result_without_a_run_state_is_neither_overwritten_nor_resumed(tmp_path):
    """A model_update folder of version 0.1 holds metrics.json but no state.pt: a plain run refuses it, and
    ``--resume`` says there is nothing to continue instead of silently training it again."""
    from cl2r_bench.app.run_folder import RunError, RunFolder

    (tmp_path / "metrics.json").write_text("{}")
    (tmp_path / "config.yaml").write_text("scenario: model_update\ndataset: synthetic\nseed: 42\n")
    with pytest.raises(RunError, match="holds results of an earlier run"):
        RunFolder(tmp_path, resume=False, overwrite=False)
    with pytest.raises(RunError, match="nothing to continue"):
        RunFolder(tmp_path, resume=True, overwrite=False)
    assert RunFolder(tmp_path, resume=False, overwrite=True).path == tmp_path


def test_resume_of_a_finished_run_that_keeps_no_state_has_nothing_to_do(tmp_path):
    """The feature protocol keeps no state.pt: ``--resume`` of its complete record is finished, not an error; a
    run that keeps state still refuses a record without one, and an incomplete record is never finished."""
    from helpers.records import valid_record

    from cl2r_bench.app.run_folder import RunError, RunFolder

    (tmp_path / "metrics.json").write_text(json.dumps(valid_record()))
    (tmp_path / "config.yaml").write_text("scenario: model_update\ndataset: synthetic\nseed: 42\n")
    assert RunFolder(tmp_path, resume=True, overwrite=False, keeps_state=False).finished
    assert not RunFolder(tmp_path, resume=False, overwrite=True, keeps_state=False).finished
    with pytest.raises(RunError, match="nothing to continue"):
        RunFolder(tmp_path, resume=True, overwrite=False)
    (tmp_path / "metrics.json").write_text(json.dumps({**valid_record(), "complete": False}))
    with pytest.raises(RunError, match="nothing to continue"):
        RunFolder(tmp_path, resume=True, overwrite=False, keeps_state=False)


def test_missing_data_leave_no_run_folder_behind(tmp_path, capsys):
    from cl2r_bench.app import cli

    out = tmp_path / "out"
    assert cli.main(["--scenario", "iamcl2r", "--dataset", "cifar100", "--data-root", str(tmp_path / "none"),
                     "--output", str(out), "--device", "cpu"]) == 2
    assert "cifar-100-python" in capsys.readouterr().err and not out.exists()
