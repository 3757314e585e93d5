"""An adapter study (docs/METHODS.md §7, §7b): the retrieval cases of two models' features bridged by an adapter,
the partial-backfilling curves and their areas, and zero-shot retention. The one measure of an adapter, whether
``runner.py adapt``, ``model_update`` on encoder specs or ``model_update`` along a stream asks for it.

Where the cases are measured (:class:`StudySplit`):

* **leave-one-out** (the adapter papers' protocol): the test split is both query and gallery, each query's own item
  left out (:func:`benchmarks.ranking.retrieval_scores` with ``exclude_self``: query i and gallery item i are the
  same image, whichever model embedded each side);
* **stream** (``model_update`` along a stream): the stream's query set against its gallery, the gallery kept per
  image or reduced to one L2-normalised mean per class (``evaluation.mode``: ``images`` / ``templates``; METHODS.md
  §3), each side's templates taken from its own (possibly adapted) features.

Scores are CMC top-1, top-5, mAP and mAP@R in percent. Every feature is L2-normalised before an adapter sees it, as
a retrieval system stores it and as the adapters are fitted (``cl2r_bench/adapters``). A leave-one-out split's
features may be a gallery streamed from disk (:class:`~benchmarks.gallery_rows.GalleryRows`;
``model_update.stream_rows``): the normalisation and the adapter's maps are applied to each chunk as the
rankings, the backfilling orders and the class means read it, and only the sampled queries are held in memory.

Cases, ``query/gallery`` (λ-orth Table 1b), each computed only where both sides live in one frame, else null:

* ``old/old``, ``new/new``; ``new/old`` (untransformed; null when the widths differ, except for a new model whose
  first dimensions are in the old frame: :attr:`StudySplit.old_frame_prefix`);
* ``B/old``, ``B/B``: backward-adapted new features against the old gallery (in the adapter's old frame: the
  common width for λ-orth) and against the backward-adapted new gallery;
* ``F/F``: forward-adapted old queries against the forward-adapted old gallery;
* ``new/F``: the new model's own queries on F(old), where F maps into the new model's space (FCT, FastFill,
  the translation baselines);
* ``F/old``, ``B/F``: where F maps into the old frame, as λ-orth's F does (into B's frame);
* ``old+new/old``: each query embedded by both models and combined by the adapter (SLERP's dual query) against the
  old gallery in the adapter's old frame: the deployment that keeps the old encoder running.

Backfilling: queries are the new model's features in the adapter's new frame (B(new) for λ-orth); the gallery
starts as the stale F(old) (the old features without a forward map) and the first β of it, in the order's
sequence (:func:`backfill_order`), is replaced by the fresh new-frame features; top-1 and mAP against
β = 0, 1/s, ..., 1 and their area (trapezoid rule). An adapter with neither map (a dual query only) has no curve of
its own: its queries need the old gallery, and the adapter-free curve is the study's ``none``. Orders: ``random``;
``uncertainty`` (FastFill's σ², largest first; only for adapters that predict it); ``class_mean_distance`` /
``class_mean_cosine`` (λ-orth: the L2 / cosine distance of each stale gallery item to its class mean of the stale
gallery, largest first).

Zero-shot retention (λ-orth's "ZS"): how much the backward map distorts the new model's own space. Its classifier
(rows w_c, biases) scores the raw features h, then the same classifier moved with the features by B's linear part
L(x) = B(x) - B(0): logits ``L(h) · L(w_c) + bias_c``. An orthogonal L keeps every logit, so strict orthogonality
keeps the accuracy exactly (the paper's 0.000) and an affine B loses most (its -3.5 on CUB); the new classifier on
B(h) alone would score features in the old model's frame. Both top-1 accuracies in percent and their difference;
only for an affine backward map that keeps the new model's width (the suite's reading; METHODS.md §7b).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from cl2r_bench.adapters.protocol import FeatureAdapter
from cl2r_bench.errors import ConfigError
from cl2r_bench.settings import GALLERY_MODES, UNMATCHED_CONVENTIONS, StudySettings

from .backfill_orders import backfill_order
from .flips import negative_flip_rate, negative_flips
from .gallery_rows import Features, GalleryRows, first_rows, normalise_rows
from .metrics import area_under_curve
from .ranking import RetrievalScores, backfilling_scores, retrieval_scores
from .record import BASELINE, DUAL_CASE, PAPER_CASES, cross_case, pack_hits
from .retrieval import class_templates


def through(transform: Any, features: Features, *, store: bool = True) -> Features:
    """``transform`` (an adapter's map) applied to features in memory, or to a streamed gallery: with ``store``,
    once per item, the mapped rows written to a temporary file by the first pass that reads them (the adapter's
    maps: :class:`~benchmarks.gallery_rows.StoredRows`), else to every read (the normalisation, cheaper to redo)."""
    return features.mapped(transform, store=store) if isinstance(features, GalleryRows) else transform(features)


@dataclass(frozen=True)
class DualQuery:
    """Queries embedded by both models, combined by ``combine`` (an adapter's ``dual_query``) only when the rows
    ranked are read (:meth:`StudySplit.sampled`), so a streamed split combines its sampled queries alone."""

    combine: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    old: Features
    new: Features


@dataclass
class PairedFeatures:
    """The same ``n`` items embedded by the old and the new encoder, L2-normalised, with their labels."""

    old: Features
    new: Features
    labels: torch.Tensor

    @classmethod
    def normalised(cls, old: Features, new: Features, labels: torch.Tensor) -> PairedFeatures:
        return cls(through(normalise_rows, old, store=False), through(normalise_rows, new, store=False), labels)

    def __len__(self) -> int:
        return len(self.labels)

    def to(self, device: torch.device | str) -> PairedFeatures:
        return PairedFeatures(self.old.to(device), self.new.to(device), self.labels.to(device))


@dataclass(frozen=True)
class Scoring:
    """How a study scores its rankings (docs/METHODS.md §7b), from ``model_update.unmatched_queries``,
    ``per_class_cmc``, ``queries`` and ``screen``: the CMC convention for queries without a match, whether the record
    keeps CMC top-1 and top-5 per query class too, how many queries a seeded sample ranks against the whole gallery
    (None: every query), and whether a streamed gallery is screened (:func:`benchmarks.ranking.streamed.streamed`: its
    first places exact, mAP@R instead of the full mAP)."""

    unmatched_queries: str
    per_class_cmc: bool
    queries: int | None = None
    screen: bool = False

    def __post_init__(self) -> None:
        if self.unmatched_queries not in UNMATCHED_CONVENTIONS:
            raise ValueError(f"unknown unmatched_queries convention {self.unmatched_queries!r}; choose from "
                             f"{list(UNMATCHED_CONVENTIONS)}")

    @classmethod
    def of(cls, study: StudySettings) -> Scoring:
        """From the study's settings (``model_update``, a run's or ``runner.py adapt``'s)."""
        return cls(study.unmatched_queries, study.per_class_cmc, study.queries, study.screen)

    def sample(self, items: int) -> torch.Tensor | None:
        """The query items a study ranks: a seeded draw (:data:`QUERY_SAMPLE_SEED`) of :attr:`queries` of
        ``items``, in index order, or None for all of them."""
        if self.queries is None or self.queries >= items:
            return None
        generator = torch.Generator().manual_seed(QUERY_SAMPLE_SEED)
        return torch.randperm(items, generator=generator)[:self.queries].sort().values


QUERY_SAMPLE_SEED = 0
"""The seed of the query sample: one sample for every adapter and seed of a study, so their cases are paired."""
SAMPLING_CONFIDENCE, SAMPLING_RESAMPLES = 0.95, 1000
"""The sampling interval of a sampled study's figures: a percentile bootstrap over the sampled queries."""


WATCHING = Scoring("miss", per_class_cmc=False)
"""What the held-out watch scores with: it reads the mAP, which no CMC convention changes."""


@dataclass(frozen=True)
class StudySplit:
    """Where an adapter is measured (module docstring): ``queries`` and, along a stream, a separate ``gallery``
    kept per image or reduced to class templates (``mode``); without a gallery, leave-one-out on the queries."""

    queries: PairedFeatures
    gallery: PairedFeatures | None = None
    mode: str = "images"
    scoring: Scoring = WATCHING
    sample: torch.Tensor | None = None
    """The query items ranked (indices into ``queries``; leave-one-out: into the gallery too, each left out of its
    own ranking), None for all."""
    class_labels: list[int] | None = None
    """The user's label of each class index, where the labels were renumbered (``runner.py adapt``), else None:
    what per-class CMC names its classes by."""
    progress: bool = False
    """Whether each ranking of a case or of the backfilling curves shows a progress bar on a terminal
    (:func:`benchmarks.ranking.in_memory.progress_bar`): a gallery of millions takes minutes per ranking."""
    old_frame_prefix: bool = False
    """Whether the new model's first dimensions are trained into the old model's frame (a BT² model, wider than the
    old one): ``new/old`` then ranks their first ``old width`` dimensions against the old gallery, as the BT²
    authors' ``cosine_distance_matrix`` does, instead of being null."""
    adapter_free: dict[str, RetrievalScores | None] = field(default_factory=dict, compare=False, repr=False)
    """The scores of the cases no adapter changes (:data:`ADAPTER_FREE_CASES`), ranked once per split."""

    def __post_init__(self) -> None:
        if self.mode not in GALLERY_MODES:
            raise ValueError(f"unknown gallery mode {self.mode!r}; choose from {list(GALLERY_MODES)}")
        self.check_counted_queries()

    def check_counted_queries(self) -> None:
        """A one-line :class:`~cl2r_bench.errors.ConfigError` when a leave-one-out sample of queries holds only
        queries without another item of their class and ``unmatched_queries`` is ``exclude``: no query would be
        left to count, and every figure would be 0 / 0 (the whole split in that state is refused where it is
        read)."""
        if self.gallery is not None or self.sample is None or self.scoring.unmatched_queries != "exclude":
            return
        _, index, counts = self.queries.labels.unique(return_inverse=True, return_counts=True)
        if bool((counts[index[self.sample.to(index.device)]] == 1).all()):
            raise ConfigError(f"every one of the {len(self.sample)} sampled queries has no other item of its class, so "
                              "with model_update.unmatched_queries=exclude no query is left to count; sample more "
                              "queries (--queries) or count them as misses (unmatched_queries=miss)")

    @property
    def gallery_items(self) -> PairedFeatures:
        return self.queries if self.gallery is None else self.gallery

    def score(self, queries: torch.Tensor, gallery: torch.Tensor, case: str | None = None) -> RetrievalScores | None:
        """The scores of ``queries`` (features of the query items) against ``gallery`` (features of the gallery
        items), or None when their widths differ; ``case`` names the ranking's progress bar (:attr:`progress`)."""
        if queries.shape[1] != gallery.shape[1]:
            return None
        if self.gallery is None:
            return retrieval_scores(queries, self.query_labels, gallery, self.queries.labels, exclude_self=True,
                                    unmatched_queries=self.scoring.unmatched_queries, query_index=self.sample,
                                    progress=self.progress_label(case), screen=self.scoring.screen)
        labels = self.gallery.labels
        if self.mode == "templates":
            gallery, labels = class_templates(F.normalize(gallery.float(), dim=1), labels)
        return retrieval_scores(queries, self.query_labels, gallery, labels, exclude_self=False,
                                unmatched_queries=self.scoring.unmatched_queries, progress=self.progress_label(case))

    def progress_label(self, ranking: str | None) -> str | None:
        """The label of the progress bar of ``ranking`` (a case, or the backfilling curves), None for no bar."""
        return f"rank {ranking}" if self.progress and ranking else None

    @property
    def query_labels(self) -> torch.Tensor:
        """The labels of the query items ranked (:attr:`sample`)."""
        return self.queries.labels if self.sample is None else self.queries.labels[self.sample.to(
            self.queries.labels.device)]

    def sampled(self, features: Features | DualQuery) -> torch.Tensor:
        """The rows of ``features`` (one per query item) that are ranked as queries, in memory."""
        if isinstance(features, DualQuery):
            return features.combine(self.sampled(features.old), self.sampled(features.new))
        if isinstance(features, GalleryRows):
            return features.read(0, len(features)) if self.sample is None else features.rows(self.sample)
        return features if self.sample is None else features[self.sample.to(features.device)]

    def backfill(self, queries: torch.Tensor, fresh: torch.Tensor, stale: torch.Tensor, orders: list[torch.Tensor],
                 betas: list[float]) -> list[list[RetrievalScores]]:
        """The scores ``[order][step]`` of a gallery whose first ``round(β n)`` items of each order are ``fresh``
        and the rest ``stale``: per image, both versions ranked once for every step and order
        (:func:`benchmarks.ranking.backfilling_scores`); as class templates, whose means change with each step,
        each step's gallery scored again."""
        if self.gallery is not None and self.mode == "templates":
            return [[self.score(queries, mixed_gallery(fresh, stale, order, beta)) for beta in betas]
                    for order in orders]
        fresh_from = torch.full((len(orders), len(fresh)), len(betas), dtype=torch.long, device=fresh.device)
        for c, order in enumerate(orders):
            for step in range(len(betas) - 1, -1, -1):
                fresh_from[c, order[:round(betas[step] * len(order))]] = step
        labels = self.gallery_items.labels
        return backfilling_scores(queries, self.query_labels, fresh, stale, labels, fresh_from, len(betas),
                                  exclude_self=self.gallery is None, unmatched_queries=self.scoring.unmatched_queries,
                                  query_index=self.sample if self.gallery is None else None,
                                  progress=self.progress_label("backfilling curves"),
                                  screen=self.scoring.screen and self.gallery is None)


def mixed_gallery(fresh: torch.Tensor, stale: torch.Tensor, order: torch.Tensor, beta: float) -> torch.Tensor:
    """The gallery with the first ``round(β n)`` items of ``order`` backfilled (fresh) and the rest stale."""
    gallery = stale.clone()
    chosen = order[:round(beta * len(order))]
    gallery[chosen] = fresh[chosen]
    return gallery


def case_sides(split: StudySplit, adapter: FeatureAdapter | None
               ) -> dict[str, tuple[torch.Tensor, torch.Tensor] | None]:
    """``(queries, gallery)`` of each case of :data:`PAPER_CASES` (module docstring), None where the adapter
    cannot produce it; the queries are those the split ranks (:attr:`StudySplit.sample`)."""
    return {case: None if pair is None else (split.sampled(pair[0]), pair[1])
            for case, pair in every_item_sides(split, adapter).items()}


def every_item_sides(split: StudySplit, adapter: FeatureAdapter | None
                     ) -> dict[str, tuple[Features | DualQuery, Features] | None]:
    """:func:`case_sides` with every query item on the query side."""
    query, gallery = split.queries, split.gallery_items
    same = split.gallery is None

    def both(transform, a: Features, b: Features) -> tuple[Features, Features]:
        mapped = through(transform, a)
        return mapped, mapped if same else through(transform, b)

    sides: dict[str, tuple[Features | DualQuery, Features] | None] = dict.fromkeys(PAPER_CASES)
    sides.update({"old/old": (query.old, gallery.old), "new/old": (new_in_old_frame(split, query.new, gallery.old),
                                                                   gallery.old),
                  "new/new": (query.new, gallery.new)})
    if adapter is None:
        return sides
    old_in_frame = through(adapter.old_frame, gallery.old)
    if "dual" in adapter.directions:
        sides[DUAL_CASE] = (DualQuery(adapter.dual_query, query.old, query.new), old_in_frame)
    if "backward" in adapter.directions:
        backward_query, backward_gallery = both(adapter.backward, query.new, gallery.new)
        sides.update({"B/old": (backward_query, old_in_frame), "B/B": (backward_query, backward_gallery)})
    if "forward" in adapter.directions:
        forward_query, forward_gallery = both(adapter.forward, query.old, gallery.old)
        sides["F/F"] = (forward_query, forward_gallery)
        if adapter.forward_into_new_space:
            sides["new/F"] = (query.new, forward_gallery)
        else:
            sides["F/old"] = (forward_query, old_in_frame)
            if "backward" in adapter.directions:
                sides["B/F"] = (sides["B/B"][0], forward_gallery)
    return sides


def new_in_old_frame(split: StudySplit, new: Features, old: Features) -> Features:
    """The new model's features as ``new/old`` compares them: their first ``old width`` dimensions, normalised
    again (a query's ranking is the same either way), where the split says they are in the old frame
    (:attr:`StudySplit.old_frame_prefix`), else unchanged."""
    width = first_rows(old).shape[1]
    if not split.old_frame_prefix or first_rows(new).shape[1] <= width:
        return new
    return through(lambda rows: F.normalize(rows[:, :width].float(), dim=1), new, store=False)


ADAPTER_FREE_CASES = ("old/old", "new/old", "new/new")
"""The cases no adapter changes: a split ranks them once, for every adapter and seed measured on it."""


Ranked = tuple[torch.Tensor, torch.Tensor, RetrievalScores]
"""Queries, gallery and their scores, ranked already (a backfilling curve's ends: :func:`backfilling`)."""


def case_scores(split: StudySplit, adapter: FeatureAdapter | None,
                known: list[Ranked] | None = None) -> dict[str, RetrievalScores | None]:
    """The scores of every case (module docstring); None where the adapter cannot produce a case or its two sides
    differ in width. A case is ranked only if neither the split (its adapter-free cases) nor ``known`` (rankings of
    the same queries and gallery, equal to the last bit) holds it already."""
    scores: dict[str, RetrievalScores | None] = {}
    with torch.no_grad():
        for case, pair in case_sides(split, adapter).items():
            if pair is None:
                scores[case] = None
            elif case in ADAPTER_FREE_CASES:
                if case not in split.adapter_free:
                    split.adapter_free[case] = already_ranked(pair, known) or split.score(*pair, case)
                scores[case] = split.adapter_free[case]
            else:
                scores[case] = already_ranked(pair, known) or split.score(*pair, case)
    return scores


def already_ranked(pair: tuple[torch.Tensor, torch.Tensor], known: list[Ranked] | None) -> RetrievalScores | None:
    """The scores in ``known`` of exactly these queries and gallery, if any."""
    for queries, gallery, scores in known or []:
        if all(same_features(a, b) for a, b in zip(pair, (queries, gallery), strict=True)):
            return scores
    return None


def same_features(a: Features, b: Features) -> bool:
    """Equal to the last bit (in memory) or reading the same rows through the same maps (streamed)."""
    if isinstance(a, GalleryRows) or isinstance(b, GalleryRows):
        return a == b
    return a.shape == b.shape and torch.equal(a, b)


WATCHED_CASES = ("B/old", "new/F")
"""The cross case whose held-out mAP decides when a learned adapter stops (:func:`held_out_error`)."""


def held_out_error(adapter: FeatureAdapter, old: torch.Tensor, new: torch.Tensor, labels: torch.Tensor) -> float:
    """100 - the leave-one-out mAP of the adapter's cross case (B/old, else new/F) on held-out fitting items: what
    a learned adapter watches to decide that it has converged (:mod:`cl2r_bench.adapters.learned`). Retrieval,
    not the training loss: FastFill's uncertainty-weighted loss and λ-orth's contrastive term rise on held-out items
    while the maps they train still improve."""
    with torch.no_grad():
        split = StudySplit(PairedFeatures.normalised(old, new, labels), scoring=WATCHING)
        sides = case_sides(split, adapter)
        queries, gallery = next(sides[case] for case in WATCHED_CASES if sides[case] is not None)
        return 100.0 - split.score(queries, gallery).mAP


def backfilling(split: StudySplit, adapter: FeatureAdapter | None, *, orders: list[str], steps: int,
                generator: torch.Generator, ends: list[Ranked] | None = None) -> dict[str, Any]:
    """``{"betas", "curves": {order: {"top1": [...], "mAP": [...]}}, "auc": {order: {"top1_auc", "mAP_auc"}}}``
    (module docstring; ``mAP@R`` for ``mAP`` where the gallery is screened); an order the adapter cannot rank, or a
    stale gallery of another width than the fresh one, gives None. ``ends`` receives the curves' two ends, the
    queries against the whole stale gallery and against the whole fresh one: two cases of the study (new/F and
    new/new for Procrustes), ranked already."""
    betas = [i / steps for i in range(steps + 1)]
    query, gallery = split.queries, split.gallery_items
    curves: dict[str, dict[str, list[float]] | None] = {}
    with torch.no_grad():
        queries = query.new if adapter is None else through(adapter.new_frame, query.new)
        fresh = queries if split.gallery is None else (gallery.new if adapter is None else
                                                        through(adapter.new_frame, gallery.new))
        has_forward = adapter is not None and "forward" in adapter.directions
        maps_features = adapter is None or bool({"backward", "forward"} & set(adapter.directions))
        stale = through(adapter.forward, gallery.old) if has_forward else gallery.old
        ranked = {kind: backfill_order(kind, stale=stale, old=gallery.old, labels=gallery.labels, adapter=adapter,
                                       generator=generator) for kind in orders}
        ranked = {kind: order for kind, order in ranked.items() if order is not None}
        if stale.shape[1] == fresh.shape[1] and ranked and maps_features:
            queries = split.sampled(queries)
            steps_scores = split.backfill(queries, fresh, stale, list(ranked.values()), betas)
            curves = {kind: {"top1": [r.top1 for r in scores], scores[0].precision_name: [r.precision for r in scores]}
                      for kind, scores in zip(ranked, steps_scores, strict=True)}
            if ends is not None:
                ends += [(queries, stale, steps_scores[0][0]), (queries, fresh, steps_scores[0][-1])]
    curves = {kind: curves.get(kind) for kind in orders}
    auc = {kind: None if c is None else {f"{name}_auc": area_under_curve(betas, values) for name, values in c.items()}
           for kind, c in curves.items()}
    return {"betas": betas, "curves": curves, "auc": auc}


def measure(split: StudySplit, adapter: FeatureAdapter | None, *, orders: list[str], steps: int, seed: int,
            zero_shot: dict[str, float] | None = None) -> dict[str, Any]:
    """Everything an adapter study records of a fitted adapter (or none) on ``split``: ``cases`` (top-1 / top-5 /
    mAP in percent per case), ``query_top1`` (each query's top-1 hit in old/old, the cross case and new/new, packed by
    :func:`benchmarks.record.pack_hits`, for the paired comparison of the study's answer), ``negative_flips`` (of
    the 2x2 matrix ``[[old/old], [cross, new/new]]``: the queries old/old answers and new/new, or the cross case,
    loses; :func:`benchmarks.flips.negative_flips`), ``case_flips`` (every other case's negative flip rate against
    old/old: the share of queries old/old answers at top-1 that the case loses), ``backfilling`` (orders drawn with
    ``seed``) and ``zero_shot`` as given."""
    ends: list[Ranked] = []
    curves = backfilling(split, adapter, orders=orders, steps=steps, generator=torch.Generator().manual_seed(seed),
                         ends=ends)
    scored = case_scores(split, adapter, known=ends)
    cases = {case: None if result is None else result.as_dict() for case, result in scored.items()}
    cross = cross_case(cases)
    hits = {case: result.query_top1 for case, result in scored.items() if result is not None}
    return {"cases": cases,
            "query_top1": {case: pack_hits(hits[case]) for case in dict.fromkeys((BASELINE, cross, "new/new"))
                           if case in hits},
            "negative_flips": negative_flips([[hits[BASELINE]], [hits.get(cross), hits["new/new"]]]),
            "case_flips": {case: negative_flip_rate(hits[BASELINE], case_hits) for case, case_hits in hits.items()
                           if case != BASELINE},
            "backfilling": curves,
            "zero_shot": zero_shot, "cmc": {case: result.cmc_curve() for case, result in scored.items() if result},
            "queries_without_match": scored[BASELINE].queries_without_positive,
            "unmatched_queries": split.scoring.unmatched_queries, "queries": scored[BASELINE].queries,
            **({} if split.sample is None else {
                "sampled_queries": {"count": len(split.sample), "of": len(split.queries), "seed": QUERY_SAMPLE_SEED},
                "sampling_interval": {case: result.interval(SAMPLING_CONFIDENCE, SAMPLING_RESAMPLES)
                                      for case, result in scored.items() if result}}),
            **({"per_class_cmc": {case: per_class_cmc(result, split.query_labels, split.class_labels)
                                  for case, result in scored.items() if result}}
               if split.scoring.per_class_cmc else {})}


def per_class_cmc(scores: RetrievalScores, labels: torch.Tensor,
                  class_labels: list[int] | None = None) -> dict[str, list[float] | list[int]]:
    """CMC top-1 and top-5 (percent) of each query class, with its ``labels`` (the split's class indices, or
    ``class_labels`` of them: the user's own) and its ``queries``, those CMC counts (all of the class's under
    ``miss``, its matched ones under ``exclude``), so that the per-class figures weighted by them give the case's
    own: the FCT authors' per-class view, under the study's convention for queries without a match. A class none
    of whose queries is counted has null figures (:meth:`RetrievalScores.per_class_cmc`)."""
    labels = labels.cpu().numpy()
    classes = sorted(set(labels.tolist()))
    top1, top5 = scores.per_class_cmc(labels, 1), scores.per_class_cmc(labels, 5)
    return {"labels": classes if class_labels is None else [class_labels[c] for c in classes],
            "queries": [scores.of_queries(labels == c).counted_queries for c in classes],
            "top1": [top1[c] for c in classes], "top5": [top5[c] for c in classes]}


def zero_shot_retention(features: torch.Tensor, classes: torch.Tensor, classifier: nn.Linear,
                        adapter: FeatureAdapter | None) -> dict[str, float] | None:
    """The new encoder's classification accuracy (percent) on raw ``features`` whose true class indices in its
    classifier are ``classes``, before and after the backward adapter's linear part L(x) = B(x) - B(0) moves both
    the features and the classifier's rows, and the change in points (module docstring); None without an affine
    backward map that keeps the classifier's width."""
    if adapter is None or "backward" not in adapter.directions:
        return None
    with torch.no_grad():
        raw = features.float()
        origin = adapter.backward(raw.new_zeros(1, raw.shape[1]))
        if origin.shape[1] != raw.shape[1] or not affine(adapter, raw[:2], origin):
            return None

        def linear(x: torch.Tensor) -> torch.Tensor:
            return adapter.backward(x) - origin

        weight = classifier.weight.float().to(raw.device)
        bias = classifier.bias.float().to(raw.device) if classifier.bias is not None else 0.0
        before = accuracy(raw @ weight.t() + bias, classes)
        after = accuracy(linear(raw) @ linear(weight).t() + bias, classes)
    return {"before": before, "after": after, "change": after - before}


def affine(adapter: FeatureAdapter, samples: torch.Tensor, origin: torch.Tensor) -> bool:
    """Whether the backward map is affine on ``samples`` (B(a + b) - B(0) = L(a) + L(b)): IRP's normalising map is
    not, so its classifier rows cannot be moved with it."""
    a, b = samples[:1], samples[1:2]
    combined = adapter.backward(a + b) - origin
    parts = adapter.backward(a) - origin + adapter.backward(b) - origin
    return bool(torch.allclose(combined, parts, rtol=1e-3, atol=1e-3 * float(parts.abs().max().clamp(min=1))))


def accuracy(logits: torch.Tensor, classes: torch.Tensor) -> float:
    return float((logits.argmax(dim=1) == classes.to(logits.device)).float().mean()) * 100

