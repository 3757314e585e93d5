"""The inputs of ``runner.py adapt`` tests: clustered features, ``.npz`` files read back, folders of arrays or tensors,
and the command itself (tests/adapter_study/test_adapt.py, tests/adapter_study/test_adapt_exports.py,
tests/adapter_study/test_adapt_scale.py; the ``rotated`` fixture in conftest.py)."""
import textwrap
from pathlib import Path

import numpy as np
import torch

from cl2r_bench.app.cli import main

ROOT = Path(__file__).resolve().parents[2]


def clustered(n_per_class: int, classes: int, dim: int, seed: int,
              spread: float = 0.6) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(classes, dim))
    labels = np.repeat(np.arange(classes), n_per_class)
    return (centres[labels] + spread * rng.normal(size=(len(labels), dim))).astype(np.float32), labels


def arrays(npz: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``old``, ``new`` and ``labels`` of a ``.npz`` file."""
    with np.load(npz) as z:
        return z["old"], z["new"], z["labels"]


def write_folder(folder: Path, suffix: str, old, new, labels) -> Path:
    """The three arrays as .npy files, .pt tensors, or .pt tensors as a model left them (bfloat16 with
    requires_grad: ``torch.load`` gives them back as they were saved)."""
    folder.mkdir()
    for name, value in (("old", old), ("new", new), ("labels", labels)):
        if suffix == ".npy":
            np.save(folder / f"{name}.npy", value)
            continue
        tensor = torch.as_tensor(value)
        if suffix == ".pt-bf16" and tensor.is_floating_point():
            tensor = tensor.to(torch.bfloat16).requires_grad_()
        torch.save(tensor, folder / f"{name}.pt")
    return folder


def adapt(*args, capsys=None):
    code = main(["adapt", *map(str, args)])
    return code, capsys.readouterr() if capsys else None


def plugin_file(folder: Path, name: str, source: str) -> Path:
    """``source`` (dedented) written as ``folder/elsewhere/<name>``: a plug-in outside the suite."""
    path = folder / "elsewhere" / name
    path.parent.mkdir()
    path.write_text(textwrap.dedent(source))
    return path


def backfilling_row(results: Path, capsys, mark: str) -> dict[str, str]:
    """The leaderboard's backfilling table of ``results``: the first row holding ``mark``, by column title."""
    assert main(["leaderboard", "--results", str(results), "--table", "backfilling"]) == 0
    lines = capsys.readouterr().out.splitlines()
    titles, cells = ([cell.strip() for cell in next(line for line in lines if text in line).strip("|").split("|")]
                     for text in ("adapter", mark))
    return dict(zip(titles, cells, strict=True))
