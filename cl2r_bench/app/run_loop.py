"""The one run loop: any scenario, any strategy, one seed, end to end, written to one run folder.

For each task t of the scenario's stream (``scenarios/``): the starting model is the scenario's pretrained model
for t (a replacement in IAM-CL2R, the old and the new model of ``model_update``), else the previous model, else a
random one; a frozen teacher is kept when the strategy needs one (``cl2r_bench/strategy.py``); the trainer fine-tunes
when the scenario trains (``cl2r_bench/training/trainers.py``: the suite's strategies or any Avalanche strategy);
the replay memory takes the task's exemplars (the training template's hook); the configured adapter is fitted
between the outgoing and the new model, on the task's images and the memory it was trained with, when the scenario
says so (docs/METHODS.md §7); the model is deployed to the :class:`CompatibilityEvaluator` (gallery and
queries embedded once per model); then the model, the run state and a partial ``metrics.json`` are saved
atomically, with SIGINT and SIGTERM waiting until they are (:func:`cl2r_bench.app.stops.deferred_stops`), so a task
reported finished is never trained again. ``resume=True`` continues after the last finished task; every task
seeds its own random streams from ``(seed, t)``, so a resumed run ends with the same metrics as an uninterrupted
one. Under torchrun every process runs this loop; training and evaluation are shared and only rank 0 writes,
prints and pretrains (:mod:`cl2r_bench.distributed`).

With an adapter along a stream, ``metrics.json``'s ``compatibility_matrix``, ``metrics`` and ``negative_flips`` are
those of the adapted matrix (what the system delivers without re-embedding its gallery) and ``unadapted_matrix`` /
``unadapted_metrics`` keep the plain ones. A scenario may add fields after the last task (``Scenario.finish``;
``model_update``: its retrieval cases, backfilling curves and 2x2 matrix).

Layout of ``<output>/<scenario>/<dataset>/<label>/seed<k>/``: ``config.yaml`` (resolved config), ``metrics.json``
(:mod:`benchmarks.record`), ``state.pt``, ``checkpoints/task<t>.pt`` (plain state dicts), figures, with
``tracking.tensorboard`` a ``tensorboard/`` folder, and ``error.log`` with the traceback of a strategy that failed.
"""
from __future__ import annotations

import copy
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.adapted_cases import held_out_error
from benchmarks.flips import negative_flips
from benchmarks.metrics import as_matrix
from benchmarks.noise import noise_metrics, wilson_interval
from benchmarks.record import pack_hits, run_record, write_record
from benchmarks.retrieval import CompatibilityEvaluator
from cl2r_bench.adapters import convergence_note, embed_pair, fit_adapter, get_adapter
from cl2r_bench.app.assembly import Assembly
from cl2r_bench.app.run_folder import RunError, RunFolder
from cl2r_bench.app.starting_models import (
    cached_score,
    evaluation_fingerprint,
    load_task_model,
    replacement_score_key,
    task_inputs,
)
from cl2r_bench.app.stops import deferred_stops
from cl2r_bench.data.datasets import ImageSet
from cl2r_bench.distributed import connect
from cl2r_bench.encoders import is_spec
from cl2r_bench.files import atomic_write_json, device_description, portable_path
from cl2r_bench.models import NonFiniteError, RetrievalModel
from cl2r_bench.reporting.plots import save_plots
from cl2r_bench.scenario import Finished
from cl2r_bench.settings import task_seed
from cl2r_bench.strategy import StrategyFailure
from cl2r_bench.training.engine import ReplayMemory
from cl2r_bench.training.pretrain import save_state


def _quiet(message: str) -> None:
    """The log of a process that is not rank 0 (only rank 0 prints)."""


class DivergedError(RunError):
    """Training produced NaN or infinite values: the run stops, keeps its finished tasks and is never complete."""


class StrategyFailedError(RunError):
    """The strategy's own code failed (:class:`cl2r_bench.strategy.StrategyFailure`): the run stops, keeps its finished
    tasks and its traceback in the run folder's ``error.log``, and is never complete."""


def to_device(images: ImageSet, device: torch.device) -> ImageSet:
    return ImageSet(images.images.to(device), images.labels.to(device))


class Run:
    """One run of an :class:`Assembly`; :meth:`execute` trains and evaluates the remaining tasks."""

    def __init__(self, parts: Assembly, *, resume: bool = False, overwrite: bool = False,
                 log: Callable[[str], None] = print) -> None:
        self.parts, self.settings, self.scenario = parts, parts.settings, parts.scenario
        self.trainer, self.device, self.dir = parts.trainer, parts.device, parts.directory
        self.processes, self.main = parts.processes, parts.processes.is_main
        self.log = log if self.main else _quiet
        self.folder = RunFolder(self.dir, resume=resume, overwrite=overwrite, writer=self.main)
        self.resume = self.folder.resuming
        if self.resume:
            self.folder.check_resumable(parts.config)
        self.amp = self.settings.training.autocast

    def embed(self, model: torch.nn.Module, images: torch.Tensor) -> torch.Tensor:
        """The run's embedding of ``images`` (the evaluation's batch size and precision), each rank embedding its
        share under torchrun: for the adapters' fitting pairs and the scenario's final measures, as the evaluator
        embeds its galleries and queries."""
        return self.processes.embed(model, images, batch_size=self.settings.evaluation.batch_size, amp=self.amp)

    def embed_and_classify(self, model: torch.nn.Module, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`embed`, with each image's top classifier output from the same pass."""
        return self.processes.embed_and_classify(model, images, batch_size=self.settings.evaluation.batch_size,
                                                 amp=self.amp)

    def execute(self) -> dict[str, Any]:
        """Train and evaluate the remaining tasks while holding the run folder's lock; returns the record. The data
        are read first, so missing or damaged data leave no run folder behind."""
        started = time.perf_counter()
        connect(self.processes, self.settings.distributed, self.device)
        self.stream = self.processes.main_first(self.scenario.stream)
        with self.folder.writing(self.parts.config, self.processes):
            self.resume = self.folder.resuming
            self.tracker = self.parts.tracker()
            try:
                return self._execute(started)
            finally:
                self.tracker.close()

    def _execute(self, started: float) -> dict[str, Any]:
        world_size = self.processes.world_size
        self.state: dict[str, Any] = self.folder.saved_state(world_size) if self.resume else {
            "next_task": 0, "timings": [], "replacements": [], "pretrain_seconds": 0.0, "adapter_fits": [],
            "world_size": world_size}
        for task in self.stream.tasks:
            task.train = to_device(task.train, self.device)
        self.stream.query, self.stream.gallery = (to_device(s, self.device) for s in (self.stream.query,
                                                                                      self.stream.gallery))
        self.scored_on = {"query_sha256": self.stream.query.digest(), "gallery_sha256": self.stream.gallery.digest()}
        evaluation = self.settings.evaluation
        evaluator = CompatibilityEvaluator(self.stream.query, self.stream.gallery, mode=evaluation.mode,
                                           batch_size=evaluation.batch_size, amp=self.amp, adapted=self.parts.direction,
                                           adapter_factory=self.parts.new_adapter, embedder=self.processes.embed)
        start = self.state["next_task"]
        model = None
        memory = ReplayMemory(self.settings.training.memory_per_class, self.settings.seed)
        if start > 0:
            evaluator.load_state_dict(self.state["evaluator"])
            memory.items = to_device(ImageSet(self.state["memory_images"], self.state["memory_labels"]), self.device)
            memory.items = memory.items if len(memory.items) else None
            model = self._restore_model(start - 1)
            self.log(f"resuming {self.dir} at task {start}")
        self._prepare_starting_models(start)
        if self.scenario.scores_starting_models:
            self._score_starting_models(evaluator)
        starting = {r["task"]: r["path"] for r in self.state["replacements"]}
        outgoing, adapter = None, None
        for t in range(start, self.stream.num_tasks):
            try:
                outgoing, model, adapter = self._run_task(t, model, memory, evaluator, starting)
            except NonFiniteError as exc:
                raise DivergedError(f"task {t} diverged: {exc}; {self._kept(t)}, and the run is not complete; lower "
                                    f"training.lr (now {self.settings.training.lr:g}) and start over with "
                                    "--overwrite") from None
            except StrategyFailure as exc:
                log = self._log_failure(exc)
                raise StrategyFailedError(f"{exc} (traceback in {log}); {self._kept(t)}, and the run is not complete; "
                                          "fix the strategy, then continue with the same command and --resume"
                                          ) from None
        if outgoing is None and self.stream.num_tasks > 1:
            outgoing = self._restore_model(self.stream.num_tasks - 2)
        extra = self.scenario.finish(Finished(self.stream, outgoing, model, adapter, self.embed,
                                                 self.embed_and_classify))
        record = self.record(evaluator, complete=True, seconds=time.perf_counter() - started, extra=extra)
        if evaluation.plots and self.main:
            save_plots(record, self.dir)
        return record

    def _kept(self, t: int) -> str:
        """What a run stopped at task ``t`` keeps."""
        return f"tasks 0-{t - 1} are kept in {self.dir}" if t else "no task finished"

    def _log_failure(self, exc: BaseException) -> Path:
        """Append ``exc``'s whole traceback (its cause included) to the run folder's ``error.log``; returns it."""
        log = self.dir / "error.log"
        if self.main:
            with log.open("a", encoding="utf-8") as out:
                out.write(f"== {time.strftime('%Y-%m-%d %H:%M:%S')} {exc}\n")
                out.write("".join(traceback.format_exception(exc)))
        return log

    def _prepare_starting_models(self, start: int) -> None:
        """Find or pretrain the scenario's starting models, and the independent models a strategy asks for, once
        per run (kept in the state for resuming)."""
        if start >= self.stream.num_tasks:
            return
        t0 = time.perf_counter()
        try:
            if not self.state["replacements"]:
                self.state["replacements"] = self.processes.main_first(lambda: self.scenario.starting_models(
                    self.stream, self.parts.head, self.device, self.log))
            if self.trainer is not None and self.trainer.needs_independent and "independent" not in self.state:
                self.state["independent"] = self.processes.main_first(lambda: self.scenario.independent_models(
                    self.stream, self.state["replacements"], self.device, self.log))
        except NonFiniteError as exc:
            raise DivergedError(f"pretraining a model diverged: {exc}; lower replacement.pretrain.lr (now "
                                f"{self.settings.replacement.pretrain.lr:g})") from None
        self.state["pretrain_seconds"] = self.state["pretrain_seconds"] + time.perf_counter() - t0

    def _new_model(self, task: int, older: RetrievalModel | None = None) -> RetrievalModel:
        """A fresh model for task ``task`` (on its encoder, if a replacement spec), built over ``older`` (the model
        deployed before it, which a BT² head widens; None: over none)."""
        return self.parts.new_model(self.stream.tasks[task].num_seen_classes, self.stream.mean, self.stream.std,
                                    older_width=None if older is None else older.feature_width,
                                    **task_inputs(self.parts, self.stream, self.state["replacements"], task))

    def _independent_model(self, task: int) -> RetrievalModel | None:
        """Task ``task``'s independent new model (:meth:`Scenario.independent_models`), for a strategy that
        ``needs_independent``; None for other strategies or tasks without one."""
        path = self.state.get("independent", {}).get(task)
        if self.trainer is None or not self.trainer.needs_independent or path is None:
            return None
        frozen = self.scenario.model_encoder(task)
        model = self.parts.independent_model(self.stream.tasks[task].num_seen_classes, self.stream.mean,
                                             self.stream.std, path if is_spec(path) else None,
                                             None if frozen is None else self.stream.feature_columns[frozen])
        if not is_spec(path):
            self.scenario.load_starting_model(model, path)
        return model.to(self.device)

    def _starting_model(self, task: int, path: str, older: RetrievalModel | None = None) -> RetrievalModel:
        """The model task ``task`` starts from: the file ``path`` loaded into a fresh model, or, for an encoder
        spec, its pretrained trunk under a fresh head initialised from the task's seed (so the model whose own
        accuracy is scored is the one the task trains); its head is built over ``older`` (:meth:`_new_model`)."""
        if is_spec(path):
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(task_seed(self.settings.seed, task))
                return self._new_model(task, older).to(self.device)
        model = self._new_model(task, older)
        self.scenario.load_starting_model(model, path)
        return model.to(self.device)

    def _score_starting_models(self, evaluator: CompatibilityEvaluator) -> None:
        """Each starting model's own retrieval accuracy on the evaluation set, before any fine-tuning, with its
        Wilson interval: IAM-CL2R presumes that replacements clearly improve. A score depends only on the
        checkpoint and the evaluation, so it is cached (:func:`replacement_score_key`) once per study."""
        pending = [r for r in self.state["replacements"] if "own_accuracy" not in r]
        if not pending:
            return
        scoring = self.settings.evaluation
        evaluation = evaluation_fingerprint(self.stream, scoring.mode, self.device, self.amp)
        scores = Path(self.settings.replacement.pretrain.cache_dir) / "scores"
        for r in pending:
            model = self._starting_model(r["task"], r["path"]) if is_spec(r["path"]) else None
            cached = scores / f"{replacement_score_key(r['path'], evaluation, model)}.json"
            r["own_accuracy"] = cached_score(cached)
            if self.processes.any(r["own_accuracy"] is None, self.device):
                try:
                    r["own_accuracy"] = evaluator.self_test(model or self._starting_model(r["task"], r["path"]))
                except NonFiniteError as exc:
                    raise RunError(f"a replacement model is broken: {exc}; check replacement.checkpoints or delete "
                                   f"the cached models in {self.settings.replacement.pretrain.cache_dir}") from None
                if self.main:
                    atomic_write_json(cached, {"own_accuracy": r["own_accuracy"], "checkpoint": r["path"]})
            r["own_accuracy_interval"] = list(wilson_interval(r["own_accuracy"], len(self.stream.query),
                                                              scoring.confidence))
            self.log(f"replacement model for task {r['task']}: own accuracy {r['own_accuracy']:.4f} "
                     f"[{r['own_accuracy_interval'][0]:.4f}, {r['own_accuracy_interval'][1]:.4f}]")

    def _restore_model(self, t: int) -> RetrievalModel:
        try:
            return load_task_model(self.parts, self.stream, t, replacements=self.state["replacements"]).to(self.device)
        except RunError as exc:
            raise RunError(f"--resume: {exc}") from None

    def _models_for_task(self, t: int, previous: RetrievalModel | None, starting: dict[int, str]):
        """``(model, teacher, teacher_classes)`` for task t (see ``cl2r_bench/strategy.py`` on the teacher)."""
        task = self.stream.tasks[t]
        wants_teacher = self.trainer is not None and self.trainer.needs_teacher
        if t in starting:
            model = self._starting_model(t, starting[t], previous)
            if not wants_teacher:
                return model, None, 0
            if previous is not None and self.trainer.replacement_teacher == "outgoing":
                return model, copy.deepcopy(previous), self.stream.tasks[t - 1].num_seen_classes
            return model, copy.deepcopy(model), 0
        if previous is None:
            return self._new_model(t).to(self.device), None, 0
        if self.scenario.starts_from_scratch(t):
            if not wants_teacher:
                return self._new_model(t, previous).to(self.device), None, 0
            return (self._new_model(t, previous).to(self.device), copy.deepcopy(previous),
                    self.stream.tasks[t - 1].num_seen_classes)
        teacher = copy.deepcopy(previous) if wants_teacher else None
        previous.head.grow(task.num_seen_classes)
        return previous, teacher, self.stream.tasks[t - 1].num_seen_classes if wants_teacher else 0

    def _run_task(self, t: int, previous: RetrievalModel | None, memory: ReplayMemory,
                  evaluator: CompatibilityEvaluator, starting: dict[int, str]):
        task = self.stream.tasks[t]
        seed = task_seed(self.settings.seed, t)
        torch.manual_seed(seed)
        np.random.seed(seed % 2**32)
        adapts = self.scenario.adapts_at(t, t in starting)
        kept = t in starting or self.scenario.starts_from_scratch(t)
        outgoing = (previous if kept else copy.deepcopy(previous)) if previous is not None else None
        model, teacher, teacher_classes = self._models_for_task(t, previous, starting)
        tag = " (replacement)" if t in starting and self.scenario.trains else ""
        replayed = memory.items
        timing = {"seconds": 0.0, "iterations": 0, "images": 0, "final_loss": None}
        if self.trainer is not None and self.scenario.trains_task(t):
            timing = self.trainer.train(model, task, memory, teacher=teacher, teacher_classes=teacher_classes,
                                        replacement=t in starting, tracker=self.tracker,
                                        independent=self._independent_model(t),
                                        description=f"task {t}/{self.stream.num_tasks - 1}{tag}")
        adapter = self._fit_adapter(t, outgoing, model, replayed) if adapts else None
        eval_started = time.perf_counter()
        row = evaluator.deploy(model, adapter)
        timing["eval_seconds"] = time.perf_counter() - eval_started
        timing["images_per_second"] = timing["images"] / max(timing["seconds"], 1e-9)
        adapted = (f", adapted {' '.join(f'{v:.3f}' for v in evaluator.adapted_rows[-1])}"
                   if self.parts.direction else "")
        with deferred_stops():
            self.log(f"task {t}{tag}: trained {timing['iterations']} iterations in {timing['seconds']:.1f}s, "
                     f"M[{t}] = {' '.join(f'{v:.3f}' for v in row)}{adapted}")
            self._save_finished_task(t, model, evaluator, memory, timing)
            record = self.record(evaluator, complete=False, seconds=None)
        self.tracker.task_finished(t, (evaluator.adapted_rows if self.parts.direction else evaluator.rows)[-1],
                                   record["metrics"] or {})
        return outgoing, model, adapter

    def _save_finished_task(self, t: int, model: RetrievalModel, evaluator: CompatibilityEvaluator,
                            memory: ReplayMemory, timing: dict[str, Any]) -> None:
        """Save task t's model and the run state that resumes after it."""
        if self.main:
            save_state(model.state_dict(), self.dir / "checkpoints" / f"task{t}.pt")
        self.state.update(next_task=t + 1, evaluator=evaluator.state_dict(),
                          memory_images=(memory.items.images if memory.items is not None else torch.zeros(0)).cpu(),
                          memory_labels=(memory.items.labels if memory.items is not None else torch.zeros(0)).cpu())
        self.state["timings"] = self.state["timings"] + [timing]
        if self.main:
            save_state(self.state, self.folder.state)

    def _fit_adapter(self, t: int, outgoing: RetrievalModel, incoming: RetrievalModel, memory: ImageSet | None):
        """Fit the configured adapter between ``outgoing`` and ``incoming`` on the scenario's data."""
        started = time.perf_counter()
        data = to_device(self.scenario.adapter_data(self.stream, t, memory), self.device)
        pair = embed_pair(outgoing, incoming, data, num_classes=self.stream.tasks[t].num_seen_classes,
                          embedder=self.embed)
        adapter = self.parts.new_adapter()
        log = fit_adapter(adapter, pair, self.scenario.adapter_seed(t), watch=held_out_error)
        fit = {"task": t, "items": len(data), **log, "seconds": time.perf_counter() - started}
        self.state["adapter_fits"] = self.state.get("adapter_fits", []) + [fit]
        self.log(f"task {t}: adapter {adapter.name} fitted on {len(data)} items in {fit['seconds']:.1f}s "
                 + " ".join(f"{k}={v:.3g}" for k, v in log.items() if isinstance(v, float)))
        note = convergence_note(adapter.name, log, f" at task {t}")
        if note:
            self.log(note)
        return adapter

    def record(self, evaluator: CompatibilityEvaluator, *, complete: bool, seconds: float | None,
               extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """Write ``metrics.json`` for the tasks finished so far and return it (fields: :mod:`benchmarks.record`)."""
        settings, extra = self.settings, dict(extra or {})
        tie_rule = settings.evaluation.tie_rule
        direction = self.parts.direction
        matrix = extra.pop("compatibility_matrix", None) or (evaluator.adapted_matrix if direction else
                                                             evaluator.matrix)
        hits = None if "cases" in extra else evaluator.hit_matrix(adapted=bool(direction))
        flips = None if hits is None else negative_flips(evaluator.hit_rows(adapted=bool(direction)))
        timings = self.state["timings"]
        evaluation, tasks = settings.evaluation, self.stream.tasks
        noise = noise_metrics(as_matrix(matrix), len(self.stream.query), hits=hits,
                              replacement_tasks=self.stream.replacement_tasks, tie_rule=tie_rule,
                              confidence=evaluation.confidence, resamples=evaluation.resamples,
                              seed=settings.seed) if matrix else None
        record = run_record(
            identity={"scenario": settings.scenario,
                      "strategy": settings.strategy if self.scenario.trains else settings.scenario,
                      "method": self.parts.label, "dataset": settings.dataset, "seed": settings.seed},
            num_tasks=self.stream.num_tasks, tasks_completed=len(evaluator.rows), complete=complete,
            replacement_tasks=self.stream.replacement_tasks, matrix=matrix, tie_rule=tie_rule,
            evaluation={"queries": len(self.stream.query), "gallery_images": len(self.stream.gallery),
                        "mode": evaluator.mode, "extractions": evaluator.extractions, **self.scored_on},
            stream={"classes_per_task": [len(t.new_classes) for t in tasks],
                    "train_images_per_task": [len(t.train) for t in tasks],
                    "class_order": self.stream.class_order[: sum(len(t.new_classes) for t in tasks)]},
            replacement_models=[{**model, "path": portable_path(model["path"])}
                                for model in self.state["replacements"]],
            adapter=None if not settings.adapter.used else {
                "name": settings.adapter.name, "direction": direction, "at": settings.adapter.at,
                "fits": self.state.get("adapter_fits", []),
                "diagnostics": dict(get_adapter(settings.adapter.name).diagnostics)},
            config=self.parts.config, device=device_description(self.device), world_size=self.processes.world_size,
            timings={"tasks": timings, "pretrain_seconds": self.state["pretrain_seconds"],
                     "train_seconds": sum(t["seconds"] for t in timings),
                     "eval_seconds": sum(t["eval_seconds"] for t in timings)},
            noise=noise, negative_flips=flips, unadapted_matrix=evaluator.matrix if direction and matrix else None,
            query_hits=None if hits is None else [pack_hits(entry) for entry in hits], extra=extra)
        if seconds is not None:
            record["timings"]["wall_seconds_this_invocation"] = seconds
        if self.main:
            write_record(self.dir, record)
        return record
