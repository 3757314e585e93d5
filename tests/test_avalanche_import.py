"""The suite's import of Avalanche (cl2r_bench/data/avalanche_import.py): the three libraries Avalanche imports but
the suite calls only in GEM, A-GEM, W&B logging and the CUB-200 download stay unimported until first used, and work
when they are used."""
import inspect
import subprocess
import sys

import pytest

from cl2r_bench.data.avalanche_import import DEFERRED_LIBRARIES, DeferredModule, defer_import


@pytest.fixture
def fake_library(tmp_path, monkeypatch):
    """A module ``fake_library`` whose import appends a line to ``imports.txt``; the path of that file."""
    record = tmp_path / "imports.txt"
    (tmp_path / "fake_library.py").write_text(f"open({str(record)!r}, 'a').write('imported\\n')\n"
                                              "ANSWER = 42\nstate = 'before'\n"
                                              "def change():\n    global state\n    state = 'after'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield record
    sys.modules.pop("fake_library", None)


def test_a_deferred_module_is_imported_at_the_first_attribute_it_lacks_and_reads_its_later_state(fake_library):
    defer_import("fake_library")
    import fake_library

    assert isinstance(fake_library, DeferredModule) and not fake_library_was_run(fake_library)
    inspect.getmodule(test_a_deferred_module_is_imported_at_the_first_attribute_it_lacks_and_reads_its_later_state)
    assert not fake_library_was_run(fake_library)
    assert fake_library.ANSWER == 42 and fake_library_was_run(fake_library) == 1
    assert not isinstance(sys.modules["fake_library"], DeferredModule)
    fake_library.change()
    assert fake_library.state == "after" and sys.modules["fake_library"].state == "after"
    assert fake_library_was_run(fake_library) == 1


def test_only_an_installed_module_not_yet_imported_is_deferred(fake_library):
    import fake_library

    defer_import("fake_library")
    assert sys.modules["fake_library"] is fake_library and not isinstance(fake_library, DeferredModule)
    defer_import("no_such_library_here")
    assert "no_such_library_here" not in sys.modules


def fake_library_was_run(module) -> int:
    record = module.__file__.replace("fake_library.py", "imports.txt")
    try:
        return open(record).read().count("imported")
    except FileNotFoundError:
        return 0


def test_a_stream_is_built_without_importing_the_deferred_libraries():
    """In a fresh process, as every run is: Avalanche imported and a stream built, and none of the three (nor JAX,
    which qpsolvers would import) loaded."""
    code = ("import sys\nfrom cl2r_bench.data.streams import build_stream\n"
            "build_stream(dataset='synthetic', data_root='unused', initial_classes=2, increment=2, num_tasks=2, "
            "images_per_class=4, replacement_tasks=[], eval_dataset='heldout', heldout_classes=2, "
            "synthetic={'synthetic_classes': 6, 'synthetic_train_per_class': 4, 'synthetic_test_per_class': 2})\n"
            f"print([type(sys.modules[name]).__name__ for name in {DEFERRED_LIBRARIES!r}], 'jax' in sys.modules, "
            "'avalanche' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["['DeferredModule',", "'DeferredModule',", "'DeferredModule']", "False", "True"]
