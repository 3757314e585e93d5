"""What both parity scripts share: the reference checkout's paths, checkpoint conversion and data files."""
from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cl2r_bench.data.datasets import ImageSet
from cl2r_bench.files import code_commit
from cl2r_bench.heads import simplex_vertices

ROOT = Path(__file__).resolve().parents[2]
"""The repository root (this file is tools/parity/common.py)."""


class ParityError(SystemExit):
    """A one-line usage error (exit code 2)."""

    def __init__(self, message: str) -> None:
        print(f"error: {message}", file=sys.stderr)
        super().__init__(2)


def run_reference_probe(python: Path, probe: str, checkout_flag: str, checkout: Path, work: Path) -> dict:
    """Run ``tools/parity/<probe>`` under the reference's ``python`` (``checkout_flag`` ``checkout``, ``--work``
    ``work``, a bare ``PATH``) and return the ``work/reference.pt`` it writes; a failure is one line."""
    command = [str(python), str(Path(__file__).with_name(probe)), checkout_flag, str(checkout), "--work", str(work)]
    done = subprocess.run(command, capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    if done.returncode != 0:
        raise ParityError(f"the reference probe failed: {done.stderr.strip().splitlines()[-1:]}")
    return torch.load(work / "reference.pt", weights_only=False)


def reference_checkout(path: str, marker: str, name: str) -> Path:
    """The checkout at ``path``, checked by a file only it has (``marker``); a wrong path is a one-line error."""
    folder = Path(path).expanduser()
    if not (folder / marker).is_file():
        raise ParityError(f"{path} is not a checkout of {name} (no {marker}); pass the folder fetched from GitHub")
    return folder.resolve()


def reference_python(path: str | None, checkout: Path,
                     setup: str = "create the reference's virtual environment (../shared/docs/REFERENCE_RUN.md)",
                     venv: str = "venv") -> Path:
    """The reference's own interpreter: ``path``, or ``bin/python`` of the environment ``venv`` beside the
    checkout; when there is none, one line saying ``setup`` and ``--reference-python``."""
    python = Path(path) if path else checkout.parent / venv / "bin" / "python"
    if not python.is_file():
        raise ParityError(f"no Python at {python}; {setup} and pass --reference-python")
    return python


def to_reference_state(state: dict[str, torch.Tensor], head: str, classes: int = 0) -> dict[str, torch.Tensor]:
    """A suite state dict under the authors' ``Incremental_ResNet`` names: ``backbone.net.*`` -> ``backbone.*``,
    ``head.lift`` -> ``fc1``, ``head.classifier`` -> ``fc2``; the d-Simplex head's ``fc2`` is the simplex (their
    code stores it), and a checkpoint without classifier gets a zero ``fc2`` of ``classes`` rows, which their
    loader deletes for replacement models. Any other key is an error: their loader is not strict."""
    out = {reference_name(key): value for key, value in state.items()}
    if head == "dsimplex":
        out["fc2.weight"] = simplex_vertices(1024).to(next(iter(state.values())).dtype)
    elif "fc2.weight" not in out:
        out["fc2.weight"] = torch.zeros(classes, 512)
    return out


def reference_name(key: str) -> str:
    """The authors' name of a suite weight (see :func:`to_reference_state`)."""
    if key.startswith("backbone.net."):
        return "backbone." + key[len("backbone.net."):]
    names = {"head.lift.weight": "fc1.weight", "head.classifier.weight": "fc2.weight"}
    if key not in names:
        raise KeyError(f"no reference name for {key}")
    return names[key]


def save_reference_checkpoint(state: dict[str, torch.Tensor], path: Path) -> Path:
    """``{'net': state}``, the authors' checkpoint layout."""
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"net": state}, path)
    return path


def write_cifar_pickles(folder: Path, train: ImageSet, test: ImageSet, names: list[str], kind: str) -> None:
    """``train`` / ``test`` in the official pickle layout (``kind`` = ``cifar-100-python`` or
    ``cifar-10-batches-py``): uint8 rows of 3072 values, channel planes first; protocol 2."""
    folder.mkdir(parents=True, exist_ok=True)

    def rows(images: ImageSet) -> dict:
        data = images.images.reshape(len(images), 3 * 32 * 32).numpy().astype(np.uint8)
        labels = [int(y) for y in images.labels]
        key = "fine_labels" if kind == "cifar-100-python" else "labels"
        return {"data": data, key: labels, "filenames": [f"{i}.png" for i in range(len(labels))]}

    def dump(name: str, obj: dict) -> None:
        with open(folder / name, "wb") as f:
            pickle.dump(obj, f, protocol=2)

    if kind == "cifar-100-python":
        dump("train", rows(train))
        dump("test", rows(test))
        dump("meta", {"fine_label_names": names, "coarse_label_names": ["all"]})
    else:
        dump("data_batch_1", rows(train))
        empty = ImageSet(torch.zeros(0, 3, 32, 32, dtype=torch.uint8), torch.zeros(0, dtype=torch.long))
        for k in range(2, 6):
            dump(f"data_batch_{k}", rows(empty))
        dump("test_batch", rows(test))
        dump("batches.meta", {"label_names": names})


def first_per_class(images: ImageSet, per_class: int) -> ImageSet:
    """The first ``per_class`` images of each class, in data set order."""
    keep = torch.zeros(len(images), dtype=torch.bool)
    for c in images.labels.unique():
        keep[torch.nonzero(images.labels == c).flatten()[:per_class]] = True
    return images.select(torch.nonzero(keep).flatten())


def provenance(checkouts: dict[str, tuple[str, Path]]) -> dict[str, Any]:
    """What a parity JSON names besides its rows: the suite's commit and each reference's repository and commit
    (``checkouts``: name -> (GitHub repository, checkout folder); a folder without git history says so)."""
    def commit(folder: Path) -> str:
        done = subprocess.run(["git", "-C", str(folder), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=False)
        return done.stdout.strip() or "unknown (not a git checkout)"

    return {"suite_commit": code_commit(),
            "references": {name: {"repository": repository, "commit": commit(folder)}
                           for name, (repository, folder) in checkouts.items()}}
