"""``runner.py adapt --export``: a fitted adapter as files a production system loads with torch alone."""
from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from cl2r_bench.adapters import Adapter
from cl2r_bench.files import atomic_write, atomic_write_text


class DeployedMap(nn.Module):
    """One fitted map of an adapter as a production system applies it: normalised features in, normalised
    features out (``backward``: new queries into the old index's frame; ``old_frame``: the stored old vectors as
    those queries compare with them; ``forward``: the old index into the new model's space; ``dual_query``: the
    same queries embedded by the old and the new model, two inputs, combined into the old index's frame)."""

    def __init__(self, adapter: Adapter, which: str) -> None:
        super().__init__()
        self.adapter, self.which = adapter, which

    def forward(self, features: torch.Tensor, new_features: torch.Tensor | None = None) -> torch.Tensor:
        inputs = (features,) if new_features is None else (features, new_features)
        return F.normalize(getattr(self.adapter, self.which)(*(F.normalize(f, dim=1) for f in inputs)), dim=1)


EXPORT_README = """# Adapter `{name}`, fitted by cl2r-bench (`runner.py adapt`)

Old model: {old_dim}-d features; new model: {new_dim}-d features. Files:

- `adapter_state.pt`: the fitted adapter as plain tensors (`torch.load(..., weights_only=True)`;
  `cl2r_bench.adapters.make_adapter("{name}", {{}}).restore(state)` rebuilds it).
{files}
Every map takes and returns L2-normalised float32 features (`n x d`, any n) and needs only `torch`:

```python
import torch
{snippet}
```
"""


SNIPPETS = {
    "backward": """to_old = torch.export.load("backward.pt2").module()     # new-model features -> the old index frame
old_frame = torch.export.load("old_frame.pt2").module()   # once, on the stored old vectors (identity or truncation)
index = old_frame(old_index_vectors)
scores = to_old(new_model(query_images)) @ index.T   # search the old index with the new model, no backfilling""",
    "forward": """to_new = torch.export.load("forward.pt2").module()       # old-model features -> the new space
index = to_new(old_index_vectors)              # once, on the stored old vectors (no images re-embedded)
scores = new_model(query_images) @ index.T     # new queries on the upgraded index; backfill items over time""",
    "dual": """both = torch.export.load("dual_query.pt2").module()  # (old, new) features of one query -> the old frame
old_frame = torch.export.load("old_frame.pt2").module()   # once, on the stored old vectors (zero-padded)
index = old_frame(old_index_vectors)
scores = both(old_model(query_images), new_model(query_images)) @ index.T   # the old encoder keeps running""",
}


EXPORT_FILES = {"backward": ("backward", "old_frame"), "forward": ("forward",), "dual": ("dual_query", "old_frame")}


def export_adapter(adapter: Adapter, directory: str | Path) -> list[Path]:
    """Write the fitted ``adapter`` to ``directory``: its state dict, a ``torch.export`` program (``.pt2``, loaded
    by ``torch.export.load(path).module()`` with torch alone, any number of rows) per map a production system
    applies (the backward pair where the adapter has a backward map, the forward map where it has one, the dual
    query and the old frame where it combines both models' queries: every map of every deployment the answer
    lists, partial backfilling through F included) and a README snippet for each;
    returns the files written. Each file is written atomically (:func:`cl2r_bench.files.atomic_write`): a link in
    its place is replaced, never followed. TorchScript is not written: torch 2.14 deprecates loading it."""
    directory = Path(directory)
    old_dim, new_dim, _ = adapter.dims
    state = adapter.export()
    atomic_write(directory / "adapter_state.pt", lambda f: torch.save(state, f))
    directions = [d for d in EXPORT_FILES if d in adapter.directions]
    written = [directory / "adapter_state.pt"]
    rows = torch.export.Dim("rows", min=1)
    widths = {"backward": (new_dim,), "dual_query": (old_dim, new_dim)}
    for which in dict.fromkeys(name for direction in directions for name in EXPORT_FILES[direction]):
        inputs = tuple(torch.randn(3, width) for width in widths.get(which, (old_dim,)))
        program = torch.export.export(DeployedMap(adapter.cpu().eval(), which), inputs,
                                      dynamic_shapes=tuple({0: rows} for _ in inputs))
        atomic_write(directory / f"{which}.pt2", lambda f, program=program: torch.export.save(program, f))
        written.append(directory / f"{which}.pt2")
    files = "".join(f"- `{p.name}`: a `torch.export` program, `torch.export.load(...).module()`.\n"
                    for p in written[1:])
    atomic_write_text(directory / "README.md", EXPORT_README.format(
        name=adapter.name, old_dim=old_dim, new_dim=new_dim, files=files,
        snippet="\n\n".join(SNIPPETS[d] for d in directions)))
    return written + [directory / "README.md"]
