import os
import pathlib
import sys

import pytest

if os.environ.get("PYTEST_XDIST_WORKER"):
    # One thread per worker (and per process it starts): the workers share the machine's cores, and two
    # multi-threaded workers on two cores slow each other down more than one thread each.
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # after the thread count above: numpy's BLAS reads it when imported
from helpers.adapt_inputs import clustered
from helpers.runs import tiny_config

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

SLOW_FIXTURES = {"tiny"}
FIRST_FILES = ("test_slurm_time_limits.py", "test_distributed.py", "test_slurm.py", "test_adapt_scale.py",
               "test_run.py", "test_sweep.py", "test_stops.py")
"""The files that run first, in this order. The README's ``-n 3 --dist loadfile --no-loadscope-reorder`` runs each
file on one worker and hands the files out in collection order, one to each worker, then another to a worker with
two tests or fewer pending: the SLURM time-limit file (two tests), which mostly waits for the test cluster (its two
jobs at once, 2.5 to 3.5 minutes), goes first and has another long file behind it at once, and the other long files
follow, so that none is left for the end. Three workers on two cores keep both busy while the time-limit file, the
lock test and the stop tests wait (99 % of the two cores through the run, sampled every 5 s, where two workers left
them 50-85 % busy for the first three minutes). Measured on 2 idle AMD EPYC cores: 6 min 7 s to 6 min 20 s for
the 972 tests (four runs), against 6 min 36 s (two runs) on two workers."""


def pytest_collection_modifyitems(items):
    """Every test that runs the suite end to end on :data:`TINY` is slow; others mark themselves. The files of
    :data:`FIRST_FILES` go first."""
    for item in items:
        if SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
    items.sort(key=lambda item: FIRST_FILES.index(item.path.name) if item.path.name in FIRST_FILES
               else len(FIRST_FILES))

@pytest.fixture(autouse=True)
def registries_as_found():
    """Each test leaves every registry as it found it: the parts a test registers (from a plug-in file or a test
    module) and the plug-in modules it loaded are gone for the next test, whichever worker runs it. The built-in
    scenarios and strategies are imported first, so they are in the registries it keeps: registered during a test,
    they would be cleared after it and never registered again (as when one file's tests ran alone)."""
    import scenarios  # noqa: F401
    import strategies  # noqa: F401
    from benchmarks.backfill_orders import ORDERS
    from cl2r_bench.adapters.base import ADAPTERS
    from cl2r_bench.config import PROFILE_FOLDERS
    from cl2r_bench.data.datasets import DATA_SETS
    from cl2r_bench.encoders.base import ENCODER_FAMILIES
    from cl2r_bench.plugins import MODULE_PREFIX
    from cl2r_bench.scenario import SCENARIOS
    from cl2r_bench.strategy import STRATEGIES

    kept = [(registry, dict(registry.classes)) for registry in (ADAPTERS, DATA_SETS, ENCODER_FAMILIES, ORDERS,
                                                                 SCENARIOS, STRATEGIES)]
    plugins = {name for name in sys.modules if name.startswith(MODULE_PREFIX)}
    profile_folders = list(PROFILE_FOLDERS)
    yield
    PROFILE_FOLDERS[:] = profile_folders
    for registry, classes in kept:
        registry.classes.clear()
        registry.classes.update(classes)
    for name in {name for name in sys.modules if name.startswith(MODULE_PREFIX)} - plugins:
        del sys.modules[name]


@pytest.fixture
def tiny(tmp_path):
    """The path of a YAML config for :data:`TINY`, caching its replacement models under ``tmp_path``."""
    return tiny_config(tmp_path)


@pytest.fixture(scope="session")
def encoder_files(tmp_path_factory):
    """Two small timm models of different widths (EfficientNet 256-d, ResNet 96-d) with random weights."""
    import timm
    import torch

    folder = tmp_path_factory.mktemp("encoders")
    files = []
    for seed, name in ((0, "test_efficientnet"), (1, "test_resnet")):
        torch.manual_seed(seed)
        path = folder / f"{name}.pth"
        torch.save(timm.create_model(name).state_dict(), path)
        files.append(f"timm:{name}@{path}")
    return files


@pytest.fixture
def rotated(tmp_path):
    """Old features of 6 classes in 8 dimensions; the new model is an exact rotation of the old one (an isometry
    loses nothing, so new/new equals old/old and Procrustes can recover the map)."""
    rotation = np.linalg.qr(np.random.default_rng(9).normal(size=(8, 8)))[0].astype(np.float32)
    paths = []
    for split, seed in (("train", 1), ("test", 2)):
        old, labels = clustered(20, 6, 8, seed)
        path = tmp_path / f"{split}.npz"
        np.savez(path, old=old, new=old @ rotation, labels=labels + 100)
        paths.append(path)
    return paths
