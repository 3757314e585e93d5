"""A plug-in is its file: every module of a kind's folder is imported and registers itself
(cl2r_bench/plugins.import_folder), a broken one is one notice and the others still load."""
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from cl2r_bench.plugins import PluginNotice, import_folder
from cl2r_bench.strategy import STRATEGIES

ROOT = Path(__file__).resolve().parents[2]
KINDS = {package: ROOT.joinpath(*package.split(".")) for package in (
    "strategies", "scenarios", "cl2r_bench.adapters", "cl2r_bench.encoders", "cl2r_bench.data",
    "benchmarks.backfill_orders")}


def test_a_new_file_in_a_folder_is_a_registered_part_and_a_broken_one_is_a_notice(tmp_path, monkeypatch):
    package = tmp_path / "my_strategies"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "fancy.py").write_text(
        "from cl2r_bench.strategy import Strategy, register_strategy\n\n\n"
        "@register_strategy('fancy_from_folder')\nclass Fancy(Strategy):\n    head = 'learnable'\n\n"
        "    def loss(self, step):\n        return step.logits.sum()\n")
    (package / "broken.py").write_text("import this_module_does_not_exist\n")
    (package / "_private.py").write_text("raise RuntimeError('never imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("my_strategies")
    try:
        with pytest.warns(PluginNotice, match=r"failed to import \(ModuleNotFoundError: No module named "
                                              r"'this_module_does_not_exist'\); the other modules of my_strategies/"
                                              ) as found:
            loaded = import_folder(module.__name__, module.__path__)
        assert [(w.filename, w.lineno) for w in found] == [("my_strategies/broken.py", 1)]
        assert loaded == ["fancy"] and "fancy_from_folder" in STRATEGIES.classes
    finally:
        STRATEGIES.classes.pop("fancy_from_folder", None)


@pytest.mark.parametrize("package", sorted(KINDS))
def test_every_module_of_a_kinds_folder_is_imported_with_its_package(package):
    importlib.import_module(package)
    skipped = {"scenarios": {"base"}, "strategies": {"base", "old_classes"}, "cl2r_bench.adapters": {"training"},
               "cl2r_bench.encoders": {"convert_efficientnet_lite"}}.get(package, set())
    modules = {p.stem for p in KINDS[package].glob("*.py") if not p.stem.startswith("_")} - skipped
    assert modules and all(f"{package}.{name}" in sys.modules for name in modules)
    init = (KINDS[package] / "__init__.py").read_text()
    assert "import_folder(__name__, __path__" in init and not any(f"import {name}" in init or f" {name}," in init
                                                                  for name in modules - {"base"})


def test_the_command_line_prints_a_broken_plugin_file_as_one_notice(tmp_path):
    broken = ROOT / "strategies" / "zz_broken_for_a_test.py"
    broken.write_text("raise RuntimeError('a broken strategy file')\n")
    try:
        done = subprocess.run([sys.executable, "runner.py", "list"], cwd=ROOT, capture_output=True, text=True)
    finally:
        broken.unlink()
    assert done.returncode == 0 and "dsimplex_hoc" in done.stdout
    assert ("strategies/zz_broken_for_a_test.py:1: PluginNotice: failed to import (RuntimeError: a broken strategy "
            "file); the other modules of strategies/ are loaded") in done.stderr
    assert len([line for line in done.stderr.splitlines() if "zz_broken" in line]) == 1


@pytest.mark.parametrize("old, new, name", [("strategies.base", "cl2r_bench.strategy", "Strategy"),
                                            ("scenarios.base", "cl2r_bench.scenario", "Scenario"),
                                            ("strategies.old_classes", "cl2r_bench.class_regions", "ClassRegions")])
def test_a_former_import_path_loads_for_one_release_with_a_warning(old, new, name):
    import importlib
    import sys

    sys.modules.pop(old, None)
    with pytest.warns(FutureWarning, match=f"{old} is now {new}"):
        module = importlib.import_module(old)
    assert getattr(module, name) is getattr(importlib.import_module(new), name)
