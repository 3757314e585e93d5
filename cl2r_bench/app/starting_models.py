"""The starting models of a run's tasks (a replacement checkpoint, an encoder spec, or a task the run saved) and
the cache of their own accuracy: a starting model's score depends only on its weights and the evaluation, so it is
computed once and read back by every run that starts from the same model (docs/METHODS.md §5)."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch

from cl2r_bench.app.assembly import Assembly
from cl2r_bench.app.run_folder import RunError
from cl2r_bench.data.streams import Stream
from cl2r_bench.encoders import is_spec
from cl2r_bench.models import RetrievalModel, older_width_in, state_sha256


def evaluation_fingerprint(stream: Stream, mode: str, device: torch.device, autocast: str | bool) -> str:
    """What a model's retrieval accuracy depends on besides the model: the query and gallery images and labels,
    the gallery mode, the device type and the autocast dtype."""
    digest = hashlib.sha256()
    for images in (stream.query, stream.gallery):
        digest.update(images.images.cpu().numpy().tobytes())
        digest.update(images.labels.cpu().numpy().tobytes())
    digest.update(f"{mode}|{device.type}|{autocast}".encode())
    return digest.hexdigest()


def replacement_score_key(checkpoint: str | Path, evaluation: str, model: torch.nn.Module | None = None) -> str:
    """The cache key of a starting model's own accuracy: its checkpoint's content and the evaluation; for an
    encoder spec, the built starting model's whole state (:func:`cl2r_bench.models.state_sha256`: the encoder's
    weights and the head the run puts on it)."""
    digest = hashlib.sha256(evaluation.encode())
    if model is not None:
        digest.update(state_sha256(model).encode())
        return digest.hexdigest()[:24]
    with open(checkpoint, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()[:24]


def cached_score(path: Path) -> float | None:
    """A cached own accuracy, or None when the file is absent or damaged (the score is then computed again)."""
    try:
        score = json.loads(path.read_text())["own_accuracy"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return float(score) if isinstance(score, (int, float)) and 0 <= score <= 1 else None


def task_encoder(replacements: list[dict[str, Any]], task: int) -> str | None:
    """The encoder spec whose trunk task ``task``'s model is built on: that of the last starting model at or before
    ``task`` when it is a spec (an IAM-CL2R replacement that is a pretrained encoder), else None (the run's
    backbone)."""
    starts = [r for r in replacements if r["task"] <= task]
    path = max(starts, key=lambda r: r["task"])["path"] if starts else None
    return path if path is not None and is_spec(path) else None


def task_inputs(parts: Assembly, stream: Stream, replacements: list[dict[str, Any]], task: int) -> dict[str, Any]:
    """What task ``task``'s model reads, as the keyword arguments ``encoder`` and ``columns`` of
    :meth:`Assembly.new_model`: the trainable trunk of :func:`task_encoder`, or on the pretrained-backbone track the
    stream's columns of the task's frozen encoder (:meth:`cl2r_bench.scenario.Scenario.model_encoder`)."""
    frozen = parts.scenario.model_encoder(task)
    return {"encoder": task_encoder(replacements, task),
            "columns": None if frozen is None else stream.feature_columns[frozen]}


def load_task_model(parts: Assembly, stream: Stream, task: int, directory: Path | None = None,
                    replacements: list[dict[str, Any]] | None = None) -> RetrievalModel:
    """The model a run saved after ``task`` (``<run folder>/checkpoints/task<t>.pt``), rebuilt on the CPU on what
    the task's model reads (:func:`task_inputs`, given the run's ``replacements``); a missing or damaged file is a
    :class:`RunError`."""
    path = (directory or parts.directory) / "checkpoints" / f"task{task}.pt"
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
        model = parts.new_model(stream.tasks[task].num_seen_classes, stream.mean, stream.std,
                                older_width=older_width_in(state), **task_inputs(parts, stream, replacements or [],
                                                                                 task))
        model.load_state_dict(state)
    except Exception as exc:  # noqa: BLE001 - a truncated file fails in torch's zip reader or load_state_dict
        state = f"is damaged ({type(exc).__name__})" if path.exists() else "is missing"
        raise RunError(f"{path} {state}; start over with --overwrite") from None
    return model
