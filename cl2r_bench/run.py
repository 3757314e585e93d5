"""Run one scenario / strategy / seed end to end and write its results (the runner's main job).

For each task t: pick the starting model (a replacement checkpoint at replacement tasks, the previous model
otherwise, a random model at task 0 of CL2R), keep a frozen teacher when the strategy needs one (see
``strategies/base.py``), let the strategy prepare the task, train, update the replay
memory, fit the configured adapter between the outgoing and the new model (``adapter.at``; METHODS.md §7), deploy
the model to the :class:`CompatibilityEvaluator` (gallery and queries embedded once), then save
the model, the run state and a partial ``metrics.json`` atomically. ``resume=True`` continues after the last
finished task; every task seeds its own random streams from ``(seed, t)``, so a resumed run ends with the same
metrics as an uninterrupted one.

With an adapter, ``metrics.json``'s ``compatibility_matrix`` and ``metrics`` are those of the adapted matrix (what
the system delivers without re-embedding its gallery) and ``unadapted_matrix`` / ``unadapted_metrics`` keep the
plain ones. The adapter is fitted on the task's training images and the replay memory, embedded by both models.

Layout of ``<output>/<scenario>/<dataset>/<label>/seed<k>/`` (label: :func:`run_label`): ``config.yaml`` (resolved config),
``metrics.json``, ``state.pt``, ``checkpoints/task<t>.pt`` (plain state dicts), ``compatibility_matrix.png``,
``aa_per_task.png``.
"""
from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

from benchmarks.metrics import all_metrics, as_matrix
from benchmarks.noise import noise_metrics, wilson_interval
from benchmarks.records import atomic_write_json, atomic_write_text, device_description, exclusive, package_versions
from benchmarks.retrieval import CompatibilityEvaluator
from cl2r_bench.config import ConfigError, flatten, safe_name
from cl2r_bench.models import NonFiniteError, RetrievalModel, build_model, load_replacement, replacement_family
from scenarios.datasets import ImageSet, load_dataset
from scenarios.streams import Stream, build_stream
from strategies import Strategy, TaskContext, get_strategy, load_plugin
from cl2r_bench.adapters import AdapterError, embed_pair, fit_adapter, make_adapter
from cl2r_bench.training.pretrain import PlateauSettings, pretrained_replacement, save_state
from cl2r_bench.training.engine import TrainSettings, train_task, update_memory

IGNORED_ON_RESUME = ("training.progress", "evaluation.plots", "device", "output")
RUN_MARKER = ".cl2r-run"
ADAPTER_AT = ("replacements", "every_task")
ADAPTER_DIRECTIONS = ("auto", "backward", "forward")
PRETRAIN_SCHEDULES = ("cosine", "plateau")
STATE_KEYS = {"next_task", "timings", "replacements", "pretrain_seconds"}


class RunError(RuntimeError):
    """The run cannot start or continue as asked (e.g. results exist, resume mismatch, damaged run folder)."""


class DivergedError(RunError):
    """Training produced NaN or infinite values: the run stops, keeps its finished tasks and is never complete."""


def to_device(images: ImageSet, device: torch.device) -> ImageSet:
    return ImageSet(images.images.to(device), images.labels.to(device))


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"device {name!r} requested but no CUDA GPU is available; use --device cpu or auto")
    try:
        return torch.device(name)
    except RuntimeError:
        raise ConfigError(f"unknown device {name!r}; use auto, cpu, cuda or cuda:N") from None


def adapter_name(cfg: dict[str, Any]) -> str | None:
    name = cfg["adapter"]["name"]
    return None if name == "none" else name


def run_label(cfg: dict[str, Any]) -> str:
    """The name of a run in folders and leaderboards: ``adapter.label`` when set, else the strategy, joined by
    ``+<adapter>`` when one is used; in ``model_update`` the adapter alone."""
    if cfg["adapter"]["label"]:
        return cfg["adapter"]["label"]
    adapter = adapter_name(cfg) or "none"
    if cfg["scenario"] == "model_update":
        return adapter
    return cfg["strategy"] + (f"+{adapter}" if adapter != "none" else "")


def run_directory(cfg: dict[str, Any]) -> Path:
    """``<output>/<scenario>/<dataset>/<label>/seed<k>``; every name is checked (:func:`configuration.safe_name`)
    before it becomes a path component, so no setting can point outside ``output``."""
    names = [safe_name(cfg[key], key) for key in ("scenario", "dataset")]
    label = safe_name(run_label(cfg), "adapter.label" if cfg["adapter"]["label"] else "strategy")
    return Path(cfg["output"]).joinpath(*names, label, f"seed{int(cfg['seed'])}")


class RunFolder:
    """A run's folder (issue 16): what may be resumed or overwritten, and the lock held while a run writes.

    ``finished`` is the file whose presence means results exist (``state.pt`` of a stream run, ``metrics.json``
    of a model update). ``--overwrite`` deletes only a folder the suite made (a ``.cl2r-run`` marker, or the
    ``config.yaml`` of a run made before the marker existed). The lock is ``<folder>.lock`` beside the folder,
    so it survives the folder's deletion; a second process on the same folder is refused."""

    def __init__(self, path: Path, finished: str, *, resume: bool, overwrite: bool) -> None:
        if resume and overwrite:
            raise RunError("--resume continues a run and --overwrite deletes it: pass one of them")
        self.path, self.resume, self.overwrite = path, resume, overwrite
        self.lock = path.with_name(path.name + ".lock")
        exists = (path / finished).exists()
        if exists and not (resume or overwrite):
            raise RunError(f"{path} holds results of an earlier run; pass --resume to continue it or --overwrite to "
                           "start over (or --output elsewhere)")
        foreign = path.is_dir() and any(path.iterdir()) and not self.made_by_suite()
        if foreign:
            raise RunError(f"{path} holds files that this suite did not write, so it neither writes into it nor "
                           "deletes it; move them away or pass another --output")

    def made_by_suite(self) -> bool:
        if (self.path / RUN_MARKER).is_file():
            return True
        try:
            config = yaml.safe_load((self.path / "config.yaml").read_text())
        except (OSError, yaml.YAMLError, UnicodeDecodeError):
            return False
        return isinstance(config, dict) and {"scenario", "dataset", "seed"} <= set(config)

    def saved_config(self) -> dict[str, Any]:
        """The resolved config of the run being resumed; a missing or damaged file is a :class:`RunError`."""
        path = self.path / "config.yaml"
        try:
            config = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError, UnicodeDecodeError) as exc:
            config = exc
        if not isinstance(config, dict):
            raise RunError(f"--resume: {path} is missing, empty or damaged, so the run's settings are unknown; "
                           "start over with --overwrite")
        return config

    @contextlib.contextmanager
    def writing(self, cfg: dict[str, Any]) -> Iterator[None]:
        """Hold the folder's lock; delete an earlier run first with ``overwrite``; mark the folder and save
        ``config.yaml``."""
        with exclusive(self.lock, f"run folder {self.path}"):
            if self.overwrite and self.path.exists():
                shutil.rmtree(self.path)
            atomic_write_text(self.path / RUN_MARKER, "a run folder of the cl2r benchmark suite\n")
            atomic_write_text(self.path / "config.yaml", yaml.safe_dump(cfg, sort_keys=False))
            yield


def adapted_direction(cfg: dict[str, Any]) -> str | None:
    """The adapted matrix a stream run fills (``adapter.direction``), or None without adapter. The forward
    direction needs an adapter whose forward map lands in the new model's own space (not λ-orthogonal's)."""
    name = adapter_name(cfg)
    if name is None:
        return None
    adapter = make_adapter(name, cfg["adapter_params"])
    direction = cfg["adapter"]["direction"]
    if direction == "auto":
        direction = "backward" if "backward" in adapter.directions else "forward"
    if direction not in adapter.directions or (direction == "forward" and not adapter.forward_into_new_space):
        raise AdapterError(f"adapter {name!r} cannot fill a {direction} matrix along a stream; use "
                           f"adapter.direction={adapter.directions[0]}")
    return direction


def task_seed(seed: int, task: int) -> int:
    return seed * 1000 + task


def model_kwargs(cfg: dict[str, Any]) -> dict[str, Any]:
    m = cfg["model"]
    return {"backbone": m["backbone"], "simplex_vertices_count": m["simplex_classes"],
            "small_width": m["small_width"], "small_out_dim": m["small_out_dim"]}


def stream_preprocessing(stream: Stream) -> dict[str, Any]:
    """The preprocessing keyword arguments of :func:`cl2r_bench.models.build_model` for every model a stream run
    trains or evaluates: the stream's normalisation statistics and image size (METHODS.md §4)."""
    return {"mean": stream.mean, "std": stream.std, "input_size": int(stream.query.images.shape[-1])}


def load_task_model(cfg: dict[str, Any], run_dir: Path, t: int, stream: Stream) -> RetrievalModel:
    """The model a run saved after task ``t`` (``run_dir/checkpoints/task<t>.pt``), rebuilt on the CPU."""
    model = build_model(head=get_strategy(cfg["strategy"]).head, num_classes=stream.tasks[t].num_seen_classes,
                        **model_kwargs(cfg), **stream_preprocessing(stream))
    model.load_state_dict(torch.load(run_dir / "checkpoints" / f"task{t}.pt", map_location="cpu", weights_only=True))
    return model


def synthetic_options(cfg: dict[str, Any]) -> dict[str, int]:
    """The ``data.synthetic_*`` settings, as keyword arguments of :func:`scenarios.datasets.load_dataset`."""
    return {k: v for k, v in cfg["data"].items() if k.startswith("synthetic_")}


def make_stream(cfg: dict[str, Any]) -> Stream:
    s, e, d = cfg["stream"], cfg["evaluation"], cfg["data"]
    return build_stream(
        scenario=cfg["scenario"], dataset=cfg["dataset"], data_root=cfg["data_root"], download=cfg["download"],
        verify=d["verify"], image_size=d["image_size"], initial_classes=s["initial_classes"], increment=s["increment"],
        num_tasks=s["num_tasks"], images_per_class=s["images_per_class"], class_order=s["class_order"],
        order_seed=s["order_seed"], replacement_tasks=cfg["replacement"]["tasks"], eval_dataset=e["dataset"],
        heldout_classes=e["heldout_classes"], queries_per_class=e["queries_per_class"],
        synthetic=synthetic_options(cfg))


def pretrain_options(cfg: dict[str, Any]) -> tuple[TrainSettings, PlateauSettings | None]:
    """The training settings of suite-pretrained models and their plateau rule (None: cosine schedule)."""
    pre = cfg["replacement"]["pretrain"]
    settings = TrainSettings(**{**cfg["training"], "epochs": pre["epochs"], "batch_size": pre["batch_size"],
                                "lr": pre["lr"], "lr_min": pre["lr_min"]})
    if pre["schedule"] == "cosine":
        return settings, None
    return settings, PlateauSettings(patience=pre["patience"], decay=pre["decay"], drops=pre["drops"],
                                     min_delta=pre["min_delta"])


def pretrain_seeds(cfg: dict[str, Any], count: int) -> list[int]:
    """The initialisation seed of each of ``count`` suite-pretrained models: ``replacement.pretrain.seed`` as one
    int shared by all, or a list with one seed per model (independent initialisations; its length is checked by
    :func:`configuration.validate`)."""
    seed = cfg["replacement"]["pretrain"]["seed"]
    return [seed] * count if isinstance(seed, int) else seed[:count]


def replacement_checkpoints(cfg: dict[str, Any], stream: Stream, head: str, device: torch.device,
                            log=print) -> list[dict[str, Any]]:
    """One ``{"task", "path", "source"}`` per replacement task: the user's files, or suite-pretrained models.
    Paths are absolute, so a run resumed from another working directory finds them. The counts of checkpoints
    and classes per replacement task are checked by :func:`configuration.validate`."""
    rep = cfg["replacement"]
    tasks = stream.replacement_tasks
    if rep["checkpoints"]:
        return [{"task": t, "path": str(Path(p).resolve()), "source": "user"}
                for t, p in zip(tasks, rep["checkpoints"])]
    pre = rep["pretrain"]
    source = load_dataset(pre["dataset"], cfg["data_root"], download=cfg["download"],
                          image_size=cfg["data"]["image_size"], verify=cfg["data"]["verify"], **synthetic_options(cfg))
    reserved = set(stream.reserved_classes) if pre["dataset"] == cfg["dataset"] else set()
    order = stream.class_order if pre["dataset"] == cfg["dataset"] else list(range(source.num_classes))
    pool = [c for c in order if c not in reserved]
    settings, plateau = pretrain_options(cfg)
    out = []
    for task, count, seed in zip(tasks, pre["class_counts"], pretrain_seeds(cfg, len(tasks))):
        path, cached = pretrained_replacement(
            source, pool[:count], head=replacement_family(head), model_kwargs=model_kwargs(cfg), settings=settings,
            images_per_class=pre["images_per_class"], device=device, seed=seed, cache_dir=pre["cache_dir"],
            plateau=plateau, log=log)
        log(f"replacement model for task {task}: {path} ({'cached' if cached else 'pretrained now'})")
        out.append({"task": task, "path": str(path.resolve()), "source": "cached" if cached else "pretrained",
                    "classes": count})
    return out


def evaluation_fingerprint(stream: Stream, cfg: dict[str, Any], device: torch.device) -> str:
    """What a model's retrieval accuracy depends on besides the model: the query and gallery images and labels,
    the gallery mode, the device type and the autocast dtype."""
    digest = hashlib.sha256()
    for images in (stream.query, stream.gallery):
        digest.update(images.images.cpu().numpy().tobytes())
        digest.update(images.labels.cpu().numpy().tobytes())
    digest.update(f"{cfg['evaluation']['mode']}|{device.type}|{TrainSettings(**cfg['training']).autocast}".encode())
    return digest.hexdigest()


def replacement_score_key(checkpoint: str | Path, evaluation: str) -> str:
    """The cache key of a replacement model's own accuracy: its checkpoint's content and the evaluation."""
    digest = hashlib.sha256(evaluation.encode())
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


def check_resume_config(saved: dict[str, Any], cfg: dict[str, Any]) -> None:
    a, b = flatten(saved), flatten(cfg)
    diff = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k) and not k.startswith(IGNORED_ON_RESUME))
    if diff:
        raise RunError(f"--resume: the settings differ from the interrupted run in {diff[:5]}; use the same "
                       "settings, or --overwrite to start over")


class Run:
    """The state of one run; :meth:`execute` trains and evaluates the remaining tasks."""

    def __init__(self, cfg: dict[str, Any], *, resume: bool = False, overwrite: bool = False, log=print) -> None:
        self.cfg, self.log = cfg, log
        for path in cfg["plugins"]:
            load_plugin(path)
        self.strategy: Strategy = get_strategy(cfg["strategy"]).from_params(
            cfg["strategy_params"].get(cfg["strategy"], {}))
        self.device = resolve_device(cfg["device"])
        self.dir = run_directory(cfg)
        self.folder = RunFolder(self.dir, "state.pt", resume=resume, overwrite=overwrite)
        self.state_file = self.dir / "state.pt"
        self.direction = adapted_direction(cfg)
        self.resume = resume and self.state_file.exists()
        if self.resume:
            check_resume_config(self.folder.saved_config(), cfg)
        self.settings = TrainSettings(**cfg["training"])

    def _saved_state(self) -> dict[str, Any]:
        """The state of the run being resumed; a damaged ``state.pt`` is a :class:`RunError`."""
        try:
            state = torch.load(self.state_file, map_location="cpu", weights_only=True)
        except Exception as exc:  # noqa: BLE001 - a damaged file fails in torch's zip reader or its unpickler
            state = exc
        if not isinstance(state, dict) or not STATE_KEYS <= set(state):
            raise RunError(f"--resume: {self.state_file} is damaged or not a run state of this suite; start over "
                           "with --overwrite")
        return state

    def _model_for_task(self, t: int, previous: RetrievalModel | None, replacements: dict[int, str]):
        """``(model, teacher, teacher_classes)`` for task t (see ``strategies/base.py`` on the teacher)."""
        task = self.stream.tasks[t]
        wants_teacher = self.strategy.needs_teacher
        if t in replacements:
            model = build_model(head=self.strategy.head, num_classes=task.num_seen_classes,
                                **model_kwargs(self.cfg), **stream_preprocessing(self.stream))
            load_replacement(model, replacements[t])
            model = model.to(self.device)
            if not wants_teacher:
                return model, None, 0
            if previous is not None and self.strategy.replacement_teacher == "outgoing":
                return model, copy.deepcopy(previous), self.stream.tasks[t - 1].num_seen_classes
            return model, copy.deepcopy(model), 0
        if previous is None:
            return build_model(head=self.strategy.head, num_classes=task.num_seen_classes,
                               **model_kwargs(self.cfg), **stream_preprocessing(self.stream)).to(self.device), None, 0
        teacher = copy.deepcopy(previous) if wants_teacher else None
        previous.head.grow(task.num_seen_classes)
        return previous, teacher, self.stream.tasks[t - 1].num_seen_classes if wants_teacher else 0

    def _restore_model(self, t: int) -> RetrievalModel:
        try:
            return load_task_model(self.cfg, self.dir, t, self.stream).to(self.device)
        except Exception as exc:  # noqa: BLE001 - a truncated file fails in torch's zip reader or load_state_dict
            raise RunError(f"--resume: {self.dir / 'checkpoints' / f'task{t}.pt'} is damaged "
                           f"({type(exc).__name__}); start over with --overwrite") from None

    def execute(self) -> dict[str, Any]:
        """Train and evaluate the remaining tasks while holding the run folder's lock; returns the record."""
        with self.folder.writing(self.cfg):
            return self._execute()

    def _execute(self) -> dict[str, Any]:
        started = time.perf_counter()
        self.state: dict[str, Any] = self._saved_state() if self.resume else {
            "next_task": 0, "timings": [], "replacements": [], "pretrain_seconds": 0.0, "adapter_fits": []}
        self.stream = make_stream(self.cfg)
        for task in self.stream.tasks:
            task.train = to_device(task.train, self.device)
        self.stream.query, self.stream.gallery = (to_device(s, self.device) for s in (self.stream.query,
                                                                                      self.stream.gallery))
        evaluator = CompatibilityEvaluator(
            self.stream.query, self.stream.gallery, mode=self.cfg["evaluation"]["mode"],
            batch_size=self.cfg["evaluation"]["batch_size"], amp=self.settings.autocast, adapted=self.direction,
            adapter_factory=lambda: make_adapter(adapter_name(self.cfg), self.cfg["adapter_params"]))
        start = self.state["next_task"]
        memory, model = None, None
        if start > 0:
            evaluator.load_state_dict(self.state["evaluator"])
            memory = to_device(ImageSet(self.state["memory_images"], self.state["memory_labels"]), self.device)
            model = self._restore_model(start - 1)
            self.log(f"resuming {self.dir} at task {start}")
        if start < self.stream.num_tasks and not self.state["replacements"]:
            t0 = time.perf_counter()
            try:
                self.state["replacements"] = replacement_checkpoints(self.cfg, self.stream, self.strategy.head,
                                                                     self.device, self.log)
            except NonFiniteError as exc:
                raise DivergedError(f"pretraining a replacement model diverged: {exc}; lower "
                                    f"replacement.pretrain.lr (now {self.cfg['replacement']['pretrain']['lr']:g})"
                                    ) from None
            self.state["pretrain_seconds"] = time.perf_counter() - t0
        try:
            self._score_replacements(evaluator)
        except NonFiniteError as exc:
            raise RunError(f"a replacement model is broken: {exc}; check replacement.checkpoints or delete the "
                           f"cached models in {self.cfg['replacement']['pretrain']['cache_dir']}") from None
        replacements = {r["task"]: r["path"] for r in self.state["replacements"]}
        for t in range(start, self.stream.num_tasks):
            try:
                model, memory = self._run_task(t, model, memory, evaluator, replacements)
            except NonFiniteError as exc:
                kept = f"tasks 0-{t - 1} are kept in {self.dir}" if t else "no task finished"
                raise DivergedError(f"task {t} diverged: {exc}; {kept}, and the run is not complete; lower "
                                    f"training.lr (now {self.settings.lr:g}) and start over with --overwrite"
                                    ) from None
        record = self.record(evaluator, complete=True, seconds=time.perf_counter() - started)
        if self.cfg["evaluation"]["plots"]:
            from benchmarks.plots import save_plots

            save_plots(record, self.dir)
        return record

    def _score_replacements(self, evaluator: CompatibilityEvaluator) -> None:
        """Each replacement model's own retrieval accuracy on the evaluation set, before any fine-tuning, with
        its Wilson interval: IAM-CL2R presumes that they clearly improve (issue 5). A score depends only on the
        checkpoint and the evaluation, so it is cached (:func:`replacement_score_key`) and computed once per
        study, not once per seed and strategy."""
        queries = len(self.stream.query)
        pending = [r for r in self.state["replacements"] if "own_accuracy" not in r]
        if not pending:
            return
        evaluation = evaluation_fingerprint(self.stream, self.cfg, self.device)
        scores = Path(self.cfg["replacement"]["pretrain"]["cache_dir"]) / "scores"
        for r in pending:
            cached = scores / f"{replacement_score_key(r['path'], evaluation)}.json"
            r["own_accuracy"] = cached_score(cached)
            if r["own_accuracy"] is None:
                model = build_model(head=self.strategy.head, num_classes=self.stream.tasks[r["task"]].num_seen_classes,
                                    **model_kwargs(self.cfg), **stream_preprocessing(self.stream))
                load_replacement(model, r["path"])
                r["own_accuracy"] = evaluator.self_test(model.to(self.device))
                atomic_write_json(cached, {"own_accuracy": r["own_accuracy"], "checkpoint": r["path"]})
            r["own_accuracy_interval"] = list(wilson_interval(r["own_accuracy"], queries,
                                                              self.cfg["evaluation"]["confidence"]))
            self.log(f"replacement model for task {r['task']}: own accuracy {r['own_accuracy']:.4f} "
                     f"[{r['own_accuracy_interval'][0]:.4f}, {r['own_accuracy_interval'][1]:.4f}]")

    def _run_task(self, t: int, previous, memory, evaluator, replacements):
        task = self.stream.tasks[t]
        torch.manual_seed(task_seed(self.cfg["seed"], t))
        np.random.seed(task_seed(self.cfg["seed"], t) % 2**32)
        adapts = self.direction is not None and t > 0 and (t in replacements or self.cfg["adapter"]["at"] == "every_task")
        outgoing = (previous if t in replacements else copy.deepcopy(previous)) if adapts else None
        model, teacher, teacher_classes = self._model_for_task(t, previous, replacements)
        self.strategy.before_task(TaskContext(
            index=t, num_old_classes=task.num_seen_classes - len(task.new_classes),
            num_new_classes=len(task.new_classes), replacement=t in replacements, teacher_classes=teacher_classes,
            teacher=teacher, new_data=task.train, memory=memory, amp=self.settings.autocast))
        tag = " (replacement)" if t in replacements else ""
        timing = train_task(model, self.strategy, task.train, memory, self.settings, teacher=teacher,
                            experience=task.experience, description=f"task {t}/{self.stream.num_tasks - 1}{tag}")
        adapter = self._fit_adapter(t, outgoing, model, task.train, memory) if adapts else None
        if self.strategy.uses_memory:
            generator = torch.Generator().manual_seed(task_seed(self.cfg["seed"], t))
            memory = update_memory(memory, task.train, self.settings.memory_per_class, generator)
        eval_started = time.perf_counter()
        row = evaluator.deploy(model, adapter)
        timing["eval_seconds"] = time.perf_counter() - eval_started
        timing["images_per_second"] = timing["images"] / max(timing["seconds"], 1e-9)
        adapted = f", adapted {' '.join(f'{v:.3f}' for v in evaluator.adapted_rows[-1])}" if self.direction else ""
        self.log(f"task {t}{tag}: trained {timing['iterations']} iterations in {timing['seconds']:.1f}s, "
                 f"M[{t}] = {' '.join(f'{v:.3f}' for v in row)}{adapted}")
        save_state(model.state_dict(), self.dir / "checkpoints" / f"task{t}.pt")
        self.state.update(next_task=t + 1, evaluator=evaluator.state_dict(),
                          memory_images=(memory.images if memory is not None else torch.zeros(0)).cpu(),
                          memory_labels=(memory.labels if memory is not None else torch.zeros(0)).cpu())
        self.state["timings"] = self.state["timings"] + [timing]
        save_state(self.state, self.state_file)
        self.record(evaluator, complete=t + 1 == self.stream.num_tasks, seconds=None)
        return model, memory

    def _fit_adapter(self, t: int, outgoing: RetrievalModel, incoming: RetrievalModel, new_data: ImageSet,
                     memory: ImageSet | None):
        """Fit the configured adapter between ``outgoing`` and ``incoming`` on the task's data and memory."""
        started = time.perf_counter()
        data = new_data if memory is None else ImageSet(torch.cat([new_data.images, memory.images]),
                                                        torch.cat([new_data.labels, memory.labels]))
        pair = embed_pair(outgoing, incoming, data, num_classes=self.stream.tasks[t].num_seen_classes,
                          amp=self.settings.autocast)
        adapter = make_adapter(adapter_name(self.cfg), self.cfg["adapter_params"])
        log = fit_adapter(adapter, pair, task_seed(self.cfg["seed"], t))
        fit = {"task": t, "items": len(data), **log, "seconds": time.perf_counter() - started}
        self.state["adapter_fits"] = self.state.get("adapter_fits", []) + [fit]
        self.log(f"task {t}: adapter {adapter.name} fitted on {len(data)} items in {fit['seconds']:.1f}s "
                 + " ".join(f"{k}={v:.3g}" for k, v in log.items()))
        return adapter

    def record(self, evaluator: CompatibilityEvaluator, *, complete: bool, seconds: float | None) -> dict[str, Any]:
        """Write ``metrics.json`` for the tasks finished so far and return it."""
        tie_rule = self.cfg["evaluation"]["tie_rule"]
        matrix = evaluator.adapted_matrix if self.direction else evaluator.matrix
        metrics = all_metrics(as_matrix(matrix), tie_rule) if matrix else None
        record = {
            "scenario": self.cfg["scenario"], "strategy": self.cfg["strategy"], "method": run_label(self.cfg),
            "dataset": self.cfg["dataset"],
            "seed": self.cfg["seed"], "num_tasks": self.stream.num_tasks, "tasks_completed": len(matrix),
            "complete": complete, "replacement_tasks": self.stream.replacement_tasks,
            "compatibility_matrix": matrix, "metrics": metrics,
            "evaluation": {"queries": len(self.stream.query), "gallery_images": len(self.stream.gallery),
                           "mode": evaluator.mode, "extractions": evaluator.extractions},
            "stream": {"classes_per_task": [len(t.new_classes) for t in self.stream.tasks],
                       "train_images_per_task": [len(t.train) for t in self.stream.tasks],
                       "class_order": self.stream.class_order[: sum(len(t.new_classes) for t in self.stream.tasks)]},
            "replacement_models": self.state["replacements"],
            "adapter": None if self.direction is None else {
                "name": adapter_name(self.cfg), "direction": self.direction, "at": self.cfg["adapter"]["at"],
                "fits": self.state.get("adapter_fits", [])},
            "config": self.cfg, "versions": package_versions(), "device": device_description(self.device),
            "timings": {"tasks": self.state["timings"], "pretrain_seconds": self.state["pretrain_seconds"],
                        "train_seconds": sum(t["seconds"] for t in self.state["timings"]),
                        "eval_seconds": sum(t["eval_seconds"] for t in self.state["timings"])},
        }
        if matrix:
            e = self.cfg["evaluation"]
            record["noise"] = noise_metrics(
                as_matrix(matrix), len(self.stream.query), hits=evaluator.hit_matrix(adapted=bool(self.direction)),
                replacement_tasks=self.stream.replacement_tasks, tie_rule=tie_rule, confidence=e["confidence"],
                resamples=e["resamples"], seed=self.cfg["seed"])
        if self.direction and matrix:
            record["unadapted_matrix"] = evaluator.matrix
            record["unadapted_metrics"] = all_metrics(as_matrix(evaluator.matrix), tie_rule)
        if seconds is not None:
            record["timings"]["wall_seconds_this_invocation"] = seconds
        atomic_write_json(self.dir / "metrics.json", record)
        return record
