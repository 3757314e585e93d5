"""The suite's import of Avalanche (cl2r_bench/data/avalanche_import.py): the libraries Avalanche imports but the suite
calls only in GEM, W&B logging, the CUB-200 download and the top-k accuracy stay unimported until first used, work
when they are used, and are ordinary modules to every other importer."""
import inspect
import subprocess
import sys
from pathlib import Path

import pytest

from cl2r_bench.data import avalanche_import
from cl2r_bench.data.avalanche_import import DEFERRED_LIBRARIES, DeferredModule, defer_import, deferring


@pytest.fixture
def fake_library(tmp_path, monkeypatch):
    """A module ``fake_library`` that counts its imports in ``imports.txt``, and one that fails to import; the
    function that reads the count."""
    record = tmp_path / "imports.txt"
    (tmp_path / "fake_library.py").write_text(f"open({str(record)!r}, 'a').write('imported\\n')\n"
                                              "ANSWER = 42\nstate = 'before'\n"
                                              "def change():\n    global state\n    state = 'after'\n")
    (tmp_path / "broken_library.py").write_text("raise ImportError('broken_library needs a missing part')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield lambda: record.read_text().count("imported") if record.exists() else 0
    for name in ("fake_library", "broken_library"):
        sys.modules.pop(name, None)


def test_a_deferred_module_is_imported_at_the_first_attribute_it_lacks_and_reads_its_later_state(fake_library,
                                                                                                   tmp_path):
    defer_import("fake_library")
    import fake_library as bound

    assert isinstance(bound, DeferredModule) and fake_library() == 0
    assert inspect.getmodule(compile("", str(tmp_path / "elsewhere.py"), "exec")) is None
    assert fake_library() == 0, "inspect.getmodule reads every module's __file__ and must not import it"
    assert bound.ANSWER == 42 and fake_library() == 1
    assert not isinstance(sys.modules["fake_library"], DeferredModule)
    bound.change()
    assert bound.state == "after" and sys.modules["fake_library"].state == "after" and fake_library() == 1


def test_stand_ins_leave_sys_modules_after_the_import_and_what_bound_one_reads_the_one_real_module(fake_library):
    with deferring(["fake_library", "no_such_library_here"]):
        import fake_library as bound

        assert "no_such_library_here" not in sys.modules
    assert "fake_library" not in sys.modules and fake_library() == 0
    import fake_library as ordinary

    assert not isinstance(ordinary, DeferredModule) and fake_library() == 1
    assert bound.ANSWER == 42 and fake_library() == 1


def test_an_imported_module_is_left_as_it_is_and_a_failing_import_fails_at_the_first_use(fake_library):
    import fake_library as already

    assert defer_import("fake_library") is None and sys.modules["fake_library"] is already
    broken = defer_import("broken_library")
    with pytest.raises(ImportError, match="needs a missing part"):
        _ = broken.anything


def test_a_function_bound_from_a_deferred_submodule_imports_its_package_whole_at_the_first_call(tmp_path,
                                                                                                 monkeypatch):
    """As Avalanche binds torchmetrics' ``accuracy``: ``from package.functional import double`` under the stand-ins
    imports nothing; the first call, while both still stand in, imports the real package whole (its ``__init__``
    imports the submodule), no stand-in left among its modules."""
    package = tmp_path / "fake_package"
    package.mkdir()
    record = tmp_path / "imports.txt"
    (package / "__init__.py").write_text(f"open({str(record)!r}, 'a').write('package\\n')\nfrom . import functional\n")
    (package / "functional.py").write_text("def double(x):\n    return 2 * x\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(avalanche_import.DEFERRED_FUNCTIONS, "fake_package.functional", ("double",))
    try:
        with deferring(["fake_package.functional", "fake_package", "fake_package.functional"]):
            from fake_package.functional import double

            assert isinstance(double, avalanche_import.DeferredFunction) and not record.exists()
            assert double(21) == 42 and record.read_text() == "package\n"
            assert not any(isinstance(sys.modules[name], DeferredModule) for name in ("fake_package",
                                                                                      "fake_package.functional"))
        assert double(1) == 2 and record.read_text() == "package\n"
        assert sys.modules["fake_package"].functional is sys.modules["fake_package.functional"]
    finally:
        for name in ("fake_package", "fake_package.functional"):
            sys.modules.pop(name, None)


def test_a_stream_is_built_without_importing_the_deferred_libraries():
    """In a fresh process, as every run is: Avalanche imported and a stream built, none of the deferred libraries
    (nor JAX, which qpsolvers would import, nor SciPy's signal processing, which torchmetrics would) loaded, and none
    left standing in for them. Avalanche's top-k accuracy then calls torchmetrics' real ``accuracy`` through the
    function it bound: top-2 of [0.1, 0.5, 0.4] holds label 2, top-2 of [0.7, 0.1, 0.2] misses label 1, so 0.5."""
    code = ("import sys\nfrom cl2r_bench.data.streams import build_stream\n"
            "build_stream(dataset='synthetic', data_root='unused', initial_classes=2, increment=2, num_tasks=2, "
            "images_per_class=4, replacement_tasks=[], eval_dataset='heldout', heldout_classes=2, "
            "synthetic={'synthetic_classes': 6, 'synthetic_train_per_class': 4, 'synthetic_test_per_class': 2})\n"
            "import avalanche.training.plugins.gem as gem\n"
            "import avalanche.evaluation.metrics.topk_acc as topk\n"
            f"print(any(name in sys.modules for name in {DEFERRED_LIBRARIES!r}), 'jax' in sys.modules, "
            "'scipy.signal' in sys.modules, type(gem.qpsolvers).__name__, type(topk.accuracy).__name__)\n"
            "import torch\nmetric = topk.TopkAccuracy(2)\n"
            "metric.update(torch.tensor([[0.1, 0.5, 0.4], [0.7, 0.1, 0.2]]), torch.tensor([2, 1]), 0)\n"
            "print(metric.result()[0], type(sys.modules['torchmetrics']).__name__)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "False", "False", "DeferredModule", "DeferredFunction", "0.5", "module"]
