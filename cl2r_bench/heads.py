"""The heads of a :class:`~cl2r_bench.models.RetrievalModel` (METHODS.md §5, §6, §6b): the classifier families a
strategy declares, and the retrieval feature each gives.

* :class:`LearnableHead`: bias-free linear classifier that grows as classes arrive (old rows copied, §5);
  the retrieval feature is the backbone output.
* :class:`CosineHead`: the same growing classifier, but its logits are cosine similarities between the
  normalised feature and the normalised class rows (CVS, §6; the strategy applies the temperature).
* :class:`DSimplexHead`: trainable bias-free lift ``d -> K-1`` followed by the frozen d-Simplex classifier
  (K = 1024 vertices, class y on vertex K-1-y, §5); the retrieval feature is the lifted vector.
* :class:`BasisTransformationHead` (BT², §6b): the backbone output and an old-model branch merged by orthogonal
  maps into a wider feature whose first ``old_width`` dimensions are the old model's frame.
* :class:`OrthogonalTransformationHead` (OCA, §6b): the backbone output widened by ``added_dims`` and normalised (the
  retrieval feature, the old model's frame first), then an orthogonal transformation layer before the classifier.

This module imports only the orthogonal layer of the suite (:mod:`cl2r_bench.orthogonal`), torch and the standard
library.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from cl2r_bench.orthogonal import AUTHORS_MAP, OrthogonalLinear

HEADS = {"learnable": "learnable, growing", "cosine": "cosine, growing (the loss sets the temperature)",
         "dsimplex": "fixed d-Simplex", "bt2": "BT² basis transformation (old frame + added dimensions)",
         "oca": "OCA orthogonal transformation layer (old frame + added dimensions)"}
"""Each head family and its words in the table of strategies (``runner.py list --markdown strategies``)."""


def simplex_vertices(num_vertices: int) -> torch.Tensor:
    """The d-Simplex fixed classifier: ``K`` unit rows in ``K-1`` dims, pairwise cosine ``-1/(K-1)`` (§5).

    Rows are the identity ``I_{K-1}`` plus one row with every entry ``(1 - sqrt(K)) / (K-1)``; the column mean
    is subtracted and each row (not the whole matrix) is normalised.
    """
    k = num_vertices
    extra = torch.full((1, k - 1), (1.0 - math.sqrt(k)) / (k - 1), dtype=torch.float64)
    vertices = torch.cat([torch.eye(k - 1, dtype=torch.float64), extra])
    vertices = vertices - vertices.mean(dim=0, keepdim=True)
    return F.normalize(vertices, dim=1).float()


ROW_INITS = {"linear": "torch's `nn.Linear`: uniform in ±1/√d (a row's norm about 1/√3)",
             "partial_fc": "N(0, 0.01²) in every entry, as insightface's `PartialFC` (a row's norm about 0.01·√d)"}
"""How the rows of a learnable or cosine classifier start (each new class's rows too, when the head grows; METHODS.md
§5)."""
PARTIAL_FC_STD = 0.01
"""The standard deviation of ``PartialFC``'s rows (insightface's ``partial_fc.py``, as ``yuleung/MixBCT``'s
``BCT_Methods/MixBCT/partial_fc.py`` L89)."""


def classifier_rows(in_dim: int, count: int, row_init: str) -> nn.Linear:
    """A bias-free ``in_dim -> count`` classifier whose rows start as ``row_init`` says (:data:`ROW_INITS`)."""
    if row_init not in ROW_INITS:
        raise ValueError(f"unknown row_init {row_init!r}; choose from {list(ROW_INITS)}")
    rows = nn.Linear(in_dim, count, bias=False)
    if row_init == "partial_fc":
        nn.init.normal_(rows.weight, 0.0, PARTIAL_FC_STD)
    return rows


class LearnableHead(nn.Module):
    """Bias-free linear classifier over the seen classes; grows with :meth:`grow` (old rows copied, new rows
    started as ``row_init`` says: :data:`ROW_INITS`)."""

    def __init__(self, in_dim: int, num_classes: int, *, row_init: str = "linear") -> None:
        super().__init__()
        self.row_init = row_init
        self.classifier = classifier_rows(in_dim, num_classes, row_init)

    @property
    def num_classes(self) -> int:
        return self.classifier.out_features

    @property
    def feature_width(self) -> int:
        """The width of the retrieval feature."""
        return self.classifier.in_features

    def grow(self, num_classes: int) -> None:
        old = self.classifier
        if num_classes <= old.out_features:
            return
        new = classifier_rows(old.in_features, num_classes, self.row_init).to(old.weight.device)
        with torch.no_grad():
            new.weight[: old.out_features] = old.weight
        self.classifier = new

    def forward(self, feats: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.classifier(feats), feats


class CosineHead(LearnableHead):
    """:class:`LearnableHead` whose logits are ``cos(w_c, x)`` in [-1, 1] (no scale: the loss divides by its
    temperature). Its only weight is ``classifier.weight``, so it loads the learnable family's replacements."""

    def forward(self, feats: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return F.linear(F.normalize(feats, dim=1), F.normalize(self.classifier.weight, dim=1)), feats


class DSimplexHead(nn.Module):
    """Trainable lift ``in_dim -> K-1`` then the frozen d-Simplex classifier; class y is vertex ``K-1-y``.

    The logits are ``lift(x) @ vertices.T`` over all K vertices, with no scale; the retrieval feature is the
    lifted vector (L2-normalised by :func:`embed`).
    """

    def __init__(self, in_dim: int, num_vertices: int = 1024) -> None:
        super().__init__()
        self.lift = nn.Linear(in_dim, num_vertices - 1, bias=False)
        self.register_buffer("vertices", simplex_vertices(num_vertices), persistent=False)

    @property
    def num_classes(self) -> int:
        return self.vertices.shape[0]

    @property
    def feature_width(self) -> int:
        return self.lift.out_features

    def grow(self, num_classes: int) -> None:
        if num_classes > self.num_classes:
            raise ValueError(f"the d-Simplex head has {self.num_classes} vertices, {num_classes} classes requested")

    def targets(self, labels: torch.Tensor) -> torch.Tensor:
        """Vertex index of each class label (class y -> vertex K-1-y, as the authors' code)."""
        return self.num_classes - 1 - labels

    def forward(self, feats: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        lifted = self.lift(feats)
        return lifted @ self.vertices.t(), lifted


class BasisTransformationHead(LearnableHead):
    """BT²'s basis transformation (Zhou et al., ICCV 2023; docs/METHODS.md §6b) on ``in_dim``-d backbone features.

    With ``f`` the normalised backbone output, ``o`` the old-model branch ``fc3(relu(f))`` (a linear map with
    bias), ``P`` and ``O`` orthogonal maps (``torch``'s orthogonal parametrisation, trained by
    :class:`~cl2r_bench.orthogonal.OrthogonalLinear`) and ``k = old_width + added_dims - in_dim`` the dimensions the
    old branch contributes::

        c = [normalise(o), P(scale * f)]                width in_dim + k = old_width + added_dims
        feature = [O(c[:old_width]), c[old_width:]]     its first old_width dims are trained into the old frame

    The logits are the bias-free classifier on ``f`` (it grows like :class:`LearnableHead`); ``new_features``
    keeps the last forward's ``f`` for BT²'s match to an independently trained new model. The retrieval feature
    has the constant norm ``sqrt(1 + scale²)``. Two differences from the authors' ``ResNet_ortho``, neither
    changing the function: their ``fc3`` has ``old_width`` outputs of which only the first ``k`` are read (the
    normalised slice of a normalised vector is the normalised slice), so the suite's has ``k``; and their ResNet
    widens its last block by ``old_width`` channels that only ``fc3`` reads, while the suite's backbones have a
    fixed width and ``fc3`` reads ``f``'s own channels (``tools/parity/bct_line.py`` gives theirs zero extra
    channels to compare)."""

    def __init__(self, in_dim: int, num_classes: int, *, old_width: int | None = None, added_dims: int = 32,
                 scale: float = 2.0, orthogonal_map: str = AUTHORS_MAP) -> None:
        super().__init__(in_dim, num_classes)
        self.old_width = in_dim if old_width is None else old_width
        self.old_part = self.old_width + added_dims - in_dim
        if self.old_part < 1:
            raise ValueError(f"a BT² head on {in_dim}-d features over a {self.old_width}-d old model must add at "
                             f"least {in_dim - self.old_width + 1} dimensions, not {added_dims}")
        self.scale, self.width = scale, self.old_width + added_dims
        self.old_branch = nn.Linear(in_dim, self.old_part)
        self.new_basis = OrthogonalLinear(in_dim, bias=False, orthogonal_map=orthogonal_map)
        self.old_basis = OrthogonalLinear(self.old_width, bias=False, orthogonal_map=orthogonal_map)
        self.new_features: torch.Tensor | None = None

    @property
    def feature_width(self) -> int:
        return self.width

    def forward(self, feats: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        new = F.normalize(feats, dim=1)
        old = F.normalize(self.old_branch(F.relu(feats)), dim=1)
        merged = torch.cat([old, self.new_basis(self.scale * new)], dim=1)
        self.new_features = new
        return self.classifier(new), torch.cat([self.old_basis(merged[:, :self.old_width]),
                                                merged[:, self.old_width:]], dim=1)


class OrthogonalTransformationHead(LearnableHead):
    """OCA's orthogonal transformation layer (Ricci et al., 2024; docs/METHODS.md §6b) on ``in_dim``-d backbone
    features.

    With ``h`` the backbone output, ``E`` a linear layer with bias of ``old_width + added_dims`` outputs (the first
    ``old_width`` the old model's frame: ``compatible``, the others ``added``), ``Q`` an orthogonal matrix (torch's
    orthogonal parametrisation, a fixed orthogonal base times the matrix exponential of a skew-symmetric matrix, as
    the authors' ``orthogonal(nn.Linear(...))``, trained by :class:`~cl2r_bench.orthogonal.OrthogonalLinear`) and ``c``
    its bias::

        f = normalise(E h)                     width old_width + added_dims: the retrieval feature
        logits = W (Q f + c)                   W the bias-free classifier (it grows like :class:`LearnableHead`)

    The authors' ``ResNet_OCA`` (``z3n0e/OCA``, ``models/resnet.py``) has no ``E``: its backbone's last block has
    ``old_width + added_dims`` channels. The suite's backbones have a fixed width, so ``E`` widens their output (a
    linear last layer; ``tools/parity/oca.py`` checks that its gradients are the authors' feature gradient chained
    through it). Their ``eval.py`` ranks ``f`` (``new_feature``, the model's fourth output), not ``Q f + c``: the
    orthogonal layer serves the classifier only, and an older gallery meets ``f``'s first ``old_width``
    dimensions."""

    def __init__(self, in_dim: int, num_classes: int, *, old_width: int | None = None, added_dims: int = 32,
                 orthogonal_map: str = AUTHORS_MAP) -> None:
        old_width = in_dim if old_width is None else old_width
        super().__init__(old_width + added_dims, num_classes)
        self.old_width, self.width = old_width, old_width + added_dims
        self.compatible = nn.Linear(in_dim, self.old_width)
        self.added = nn.Linear(in_dim, added_dims)
        self.transform = OrthogonalLinear(self.width, orthogonal_map=orthogonal_map)

    def forward(self, feats: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        widened = F.normalize(torch.cat([self.compatible(feats), self.added(feats)], dim=1), dim=1)
        return self.classifier(self.transform(widened)), widened


def build_head(head: str, in_dim: int, num_classes: int, simplex_vertices_count: int = 1024,
               head_options: dict | None = None) -> nn.Module:
    """A fresh head of family ``head`` on ``in_dim``-d backbone features (docs/METHODS.md §5); ``head_options``
    are the keyword arguments of a learnable or cosine head (``row_init``: MixBCT's), a BT² head (its strategy's
    ``added_dims``, ``scale`` and ``orthogonal_map``) or an OCA head (``added_dims``, ``orthogonal_map``)."""
    if head == "learnable":
        return LearnableHead(in_dim, num_classes, **(head_options or {}))
    if head == "cosine":
        return CosineHead(in_dim, num_classes, **(head_options or {}))
    if head == "dsimplex":
        return DSimplexHead(in_dim, simplex_vertices_count)
    if head == "bt2":
        return BasisTransformationHead(in_dim, num_classes, **(head_options or {}))
    if head == "oca":
        return OrthogonalTransformationHead(in_dim, num_classes, **(head_options or {}))
    raise ValueError(f"unknown head {head!r}; choose from {list(HEADS)}")
