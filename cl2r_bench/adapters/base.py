"""Post-hoc adapters between an old and a new frozen model (METHODS.md §7): the template and the registry.

An adapter is fitted on *features* of the same images embedded by both models (L2-normalised, as a retrieval
system stores them) and then maps between the two spaces without running a network on images:

* ``backward(new)``: new-model features into the old model's frame, so new queries search the old gallery;
* ``forward(old, side)``: old gallery features into the new frame, an upgrade without re-embedding images;
* ``new_frame(new)``: the new model's own features in that new frame (identity, except λ-orthogonal whose new
  frame is B(new));
* ``old_frame(old)``: the old gallery as compared with backward-adapted queries (identity, except λ-orthogonal
  when the dimensions differ: truncated or padded);
* ``uncertainty(old, side)``: a per-item score, larger = backfill first, or None (FastFill's σ);
* ``dual_query(old, new)``: a query embedded by *both* models, combined into the old frame to search the untouched
  old gallery (SLERP): the deployment keeps the old encoder running beside the new one.

An adapter is one file in ``cl2r_bench/adapters/``, registered as the folder's modules are imported
(:func:`cl2r_bench.plugins.import_folder`)::

    from dataclasses import dataclass
    import torch
    from cl2r_bench.adapters.base import Adapter, FeaturePair, register_adapter
    from cl2r_bench.plugin_settings import WIDTH_MAX, setting

    @dataclass(frozen=True)
    class ScaleConfig:               # every hyper-parameter with its default; adapter_params.scale sets them
        factor: float = setting(1.0, above=0)   # what it takes, beside the default (cl2r_bench/plugin_settings.py)
        width: int = setting(64, at_least=1, at_most=WIDTH_MAX)   # a layer's size stays below memory

    @register_adapter("scale")
    class Scale(Adapter):
        '''What it does and the equation it implements (cite METHODS.md §7).'''
        Config = ScaleConfig
        directions = ("backward", "forward")   # the maps it offers (at least one of backward, forward, dual)
        fitted_by = "a constant gain"          # its row in the table of adapters (runner.py list --markdown adapters)
        reference = "Author et al., Venue Year"

        def build(self, old_dim: int, new_dim: int, side_dim: int = 0) -> None:   # create modules / buffers
            self.register_buffer("gain", torch.ones(()))

        def fit(self, pair: FeaturePair, generator: torch.Generator) -> dict[str, float]:
            self.gain.fill_(self.config.factor)
            return {}                                 # numbers worth logging (e.g. a final loss)

        def backward(self, new): return new * self.gain
        def forward(self, old, side=None): return old * self.gain

**Diagnostic columns.** ``diagnostics = {"key": "title"}`` names numbers of the fit log (what :meth:`Adapter.fit`
returns) that the leaderboard's backfilling table shows as columns titled ``title``, for any adapter that declares
them (λ-orthogonal: ``{"f_W": "f(W)"}``). Records carry the declaration (``adapter.diagnostics``), so reports read it
without importing the adapter; nothing else in the suite names the key.

**Fitting without pairs.** An adapter that sets ``fits_unpaired = True`` (mini-vec2vec) also fits on a
:class:`FeaturePair` whose ``paired`` is False: the old model's features of some items and the new model's of
others (``model_update.pairing: unpaired``); every other adapter is refused such a pair.

An adapter trained by gradient descent subclasses :class:`cl2r_bench.adapters.learned.LearnedAdapter` instead and
implements ``batch_loss``: it then trains to convergence under a step budget like λ-orthogonal, FCT and FastFill.

**Fitting rows read from disk.** A fitting split too large to hold (``runner.py adapt`` with
``model_update.stream_rows`` on a folder of ``.npy`` files) reaches :meth:`Adapter.fit` as row sources, not tensors
(:class:`Rows`). An adapter that sets ``picks_rows = True`` reads such a source by index tensors only
(``pair.old[idx]``) and is handed it as it is: the closed-form maps, which read their anchors and nothing else, and
the learned ones (λ-orthogonal, FCT, FastFill), which read each mini-batch and held-out check. Any other adapter (a
user's own that does not set it) is handed the whole split read into memory, so its ``fit`` sees tensors whatever
the input.

Shapes are fixed by :meth:`Adapter.build` from ``(old_dim, new_dim, side_dim)``, so a fitted adapter is saved as
those dimensions plus its ``state_dict`` (:meth:`Adapter.export`) and restored with :meth:`Adapter.restore`.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import torch
from torch import nn

from cl2r_bench.errors import PartError
from cl2r_bench.models import classifier_rows
from cl2r_bench.plugin_settings import NoParams, config_from_params
from cl2r_bench.registry import Registry

DIRECTIONS = ("backward", "forward", "dual")


class AdapterError(PartError):
    """Unknown adapter, invalid adapter parameters, or an adapter used in a direction it does not offer."""


class Rows(Protocol):
    """Fitting features read from disk (a streamed study's :class:`benchmarks.gallery_rows.GalleryRows`): ``(n,
    d)`` rows, L2-normalised as they are read, by index tensor (``rows[idx]``) or by range."""

    shape: tuple[int, int]
    device: torch.device

    def __len__(self) -> int: ...

    def __getitem__(self, index: torch.Tensor) -> torch.Tensor: ...

    def read(self, start: int, stop: int) -> torch.Tensor: ...


def in_memory(features: torch.Tensor | Rows) -> torch.Tensor:
    """``features`` as a tensor: rows read from disk are read whole."""
    return features if isinstance(features, torch.Tensor) else features.read(0, len(features))


@dataclass
class FeaturePair:
    """The fitting data: the same ``n`` images embedded by both frozen models.

    Attributes:
        old: ``(n, d_old)`` L2-normalised features of the old model, in memory or read from disk (:class:`Rows`;
            module docstring).
        new: ``(n, d_new)`` L2-normalised features of the new model, likewise.
        labels: ``(n,)`` class labels (for supervised losses).
        new_classifier: ``(C, d_new)`` class rows of the new model's classifier, row y for label y (FastFill), or
            None.
        side: ``(n, d_side)`` side information stored with the old features (FCT), or None.
        paired: False when ``old`` and ``new`` embed *different* items (:func:`unpaired_halves`): their rows do not
            correspond, their counts may differ, and ``labels`` is empty; only an adapter that sets
            ``fits_unpaired`` fits on such a pair.
    """

    old: torch.Tensor | Rows
    new: torch.Tensor | Rows
    labels: torch.Tensor
    new_classifier: torch.Tensor | None = None
    side: torch.Tensor | None = None
    paired: bool = True

    def in_memory(self) -> FeaturePair:
        """This pair with features read from disk read whole."""
        return dataclasses.replace(self, old=in_memory(self.old), new=in_memory(self.new))


class Adapter(nn.Module):
    """Base class of every adapter (see the module docstring for the template)."""

    name: ClassVar[str] = ""
    Config: ClassVar[type] = NoParams
    directions: ClassVar[tuple[str, ...]] = ("backward", "forward")
    forward_into_new_space: ClassVar[bool] = True   # False when new_frame is not the identity (λ-orthogonal)
    picks_rows: ClassVar[bool] = False   # True: fit reads features from disk by index only (module docstring)
    fits_unpaired: ClassVar[bool] = False   # True: fits on the features of different items (FeaturePair.paired)
    diagnostics: ClassVar[dict[str, str]] = {}   # fit-log key -> leaderboard column title (module docstring)
    fitted_by: ClassVar[str] = ""   # how it is fitted, in one line: the table of adapters (runner.py list --markdown)
    reference: ClassVar[str] = ""   # the paper it comes from, for the same table

    def __init__(self, config: Any = None) -> None:
        super().__init__()
        self.config = config if config is not None else self.Config()
        self.dims: tuple[int, int, int] | None = None
        self.held_out_watch: HeldOutWatch | None = None
        self.fit_progress: Any = None
        """A :class:`cl2r_bench.adapters.learned.FitProgress` a learned fit reports to, or None."""

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> Adapter:
        """Build from ``adapter_params.<name>``; unknown keys or wrong types raise :class:`AdapterError`."""
        return cls(config_from_params(cls.Config, params, f"adapter_params.{cls.name}", AdapterError))

    def parameters_used(self) -> dict[str, Any]:
        """Every parameter of this adapter, defaults included (saved with the run's config)."""
        return dataclasses.asdict(self.config)

    def prepare(self, pair: FeaturePair) -> None:
        """Build the modules for ``pair``'s dimensions on its device (called by :func:`fit_adapter`)."""
        side_dim = pair.side.shape[1] if pair.side is not None else 0
        self.dims = (pair.old.shape[1], pair.new.shape[1], side_dim)
        self.build(*self.dims)
        self.to(pair.old.device)

    def build(self, old_dim: int, new_dim: int, side_dim: int = 0) -> None:
        """Create the modules and buffers for these feature dimensions."""

    def fit(self, pair: FeaturePair, generator: torch.Generator) -> dict[str, Any]:
        """Fit on ``pair``; return what is worth logging with the result (numbers, flags, curves)."""
        raise NotImplementedError

    def seed_free(self, items: int) -> bool:
        """Whether a fit on ``items`` fitting items is the same whatever the seed, so a study fits and scores it
        once for all its seeds (``runner.py adapt``). False unless an adapter knows better."""
        return False

    def backward(self, new: torch.Tensor) -> torch.Tensor:
        raise AdapterError(f"adapter {self.name!r} has no backward map; it offers {list(self.directions)}")

    def forward(self, old: torch.Tensor, side: torch.Tensor | None = None) -> torch.Tensor:
        raise AdapterError(f"adapter {self.name!r} has no forward map; it offers {list(self.directions)}")

    def dual_query(self, old: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
        raise AdapterError(f"adapter {self.name!r} has no dual query; it offers {list(self.directions)}")

    def new_frame(self, new: torch.Tensor) -> torch.Tensor:
        return new

    def old_frame(self, old: torch.Tensor) -> torch.Tensor:
        return old

    def uncertainty(self, old: torch.Tensor, side: torch.Tensor | None = None) -> torch.Tensor | None:
        return None

    def export(self) -> dict[str, Any]:
        """``{"dims": [d_old, d_new, d_side], "state": state_dict}``: plain tensors and lists."""
        return {"dims": list(self.dims), "state": {k: v.detach().cpu() for k, v in self.state_dict().items()}}

    def restore(self, exported: dict[str, Any], device: torch.device | str = "cpu") -> Adapter:
        """Rebuild from :meth:`export`'s output (same config) and return ``self``."""
        self.dims = tuple(exported["dims"])
        self.build(*self.dims)
        self.load_state_dict(exported["state"])
        return self.to(device).eval()


def embed_pair(old_model: nn.Module, new_model: nn.Module, data: Any, *, num_classes: int,
               embedder: Callable[[nn.Module, torch.Tensor], torch.Tensor]) -> FeaturePair:
    """The :class:`FeaturePair` of the ``ImageSet`` ``data`` under both frozen models, each embedded by
    ``embedder`` (the run's :func:`cl2r_bench.models.embed`, split across ranks under torchrun), with the new
    model's classifier rows for the classes ``0..num_classes-1``."""
    return FeaturePair(old=embedder(old_model, data.images), new=embedder(new_model, data.images),
                       labels=data.labels, new_classifier=classifier_rows(new_model, num_classes))


def unpaired_halves(pair: FeaturePair, seed: int) -> FeaturePair:
    """The unpaired fitting data of ``pair`` (``model_update.pairing: unpaired``; METHODS.md §7): a draw seeded by
    ``seed`` cuts the items in two halves, the old model's features of the first and the new model's of the second,
    so no item is in both; no labels, no classifier rows, no side information."""
    order = torch.randperm(len(pair.labels), generator=torch.Generator().manual_seed(seed))
    half = len(order) // 2
    first, second = order[:half].to(pair.old.device), order[half:].to(pair.new.device)
    return FeaturePair(old=in_memory(pair.old)[first], new=in_memory(pair.new)[second],
                       labels=pair.labels[:0], paired=False)


HeldOutWatch = Callable[["Adapter", torch.Tensor, torch.Tensor, torch.Tensor], float]
"""``watch(adapter, old, new, labels)``: an error to minimise on held-out fitting items (lower is better)."""


def fit_adapter(adapter: Adapter, pair: FeaturePair, seed: int, watch: HeldOutWatch | None = None,
                progress: Any = None) -> dict[str, Any]:
    """Build ``adapter`` for ``pair``'s dimensions, fit it with a generator seeded by ``seed``, freeze it; returns
    its fit log (a learned adapter's includes its convergence, :mod:`cl2r_bench.adapters.learned`, judged by
    ``watch`` on its held-out share when given, else by its own loss there, and reported to ``progress``, a
    :class:`~cl2r_bench.adapters.learned.FitProgress`, while it runs)."""
    if not pair.paired and not adapter.fits_unpaired:
        raise AdapterError(f"adapter {adapter.name!r} needs the same items embedded by both models; with "
                           f"model_update.pairing=unpaired use an adapter fitted without pairs "
                           f"({', '.join(unpaired_adapters())})")
    adapter.held_out_watch, adapter.fit_progress = watch, progress
    if not adapter.picks_rows:
        pair = pair.in_memory()
    torch.manual_seed(seed)
    adapter.prepare(pair)
    generator = torch.Generator(device=pair.old.device).manual_seed(seed)
    adapter.train()
    with torch.enable_grad():
        log = adapter.fit(pair, generator)
    adapter.eval().requires_grad_(False)
    return log


def _check_directions(name: str, cls: type[Adapter]) -> None:
    if not cls.directions or set(cls.directions) - set(DIRECTIONS):
        raise AdapterError(f"adapter {name!r}: directions must be a non-empty subset of {list(DIRECTIONS)}")


ADAPTERS = Registry("adapter", AdapterError, _check_directions)
register_adapter = ADAPTERS.register
get_adapter = ADAPTERS.get
list_adapters = ADAPTERS.names


def unpaired_adapters() -> list[str]:
    """The registered adapters that fit on the features of different items (``fits_unpaired``)."""
    return [name for name in list_adapters() if get_adapter(name).fits_unpaired]


def make_adapter(name: str, adapter_params: dict[str, dict[str, Any]]) -> Adapter:
    """A fresh adapter ``name`` configured by ``adapter_params[name]`` (the config's ``adapter_params``)."""
    cls = get_adapter(name)
    return cls.from_params(adapter_params.get(name, {}))
