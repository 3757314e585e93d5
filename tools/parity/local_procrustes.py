"""Parity of local Procrustes with its author's code (results/parity/README.md, local Procrustes).

    python -m tools.parity.local_procrustes --mixed-adapter REF/mixed-adapter [--reference-python PYTHON]
        [--out results/parity/local_procrustes.json] [--stands-for COMMIT]

The same fitting and test features go to both codes: ``local_procrustes_probe.py`` runs, under the reference's
Python, ``jonathan-politzki/mixed-adapter``'s ``run_local_experiment`` (``scripts/run_experiment.py``: their
``KMeansClustering`` or ``DriftAwareClustering``, one ``OrthogonalProcrustes`` per cluster, ``MoERouter`` and the
normalised blend) with their ``local_kmeans`` / ``local_drift_aware`` configs, ``adapter.type`` ``procrustes``;
this script fits ``cl2r_bench/adapters/local_procrustes.py`` on every fitting item, with ``min_items: 1`` (they fit
every non-empty cluster). The k-means seeding is an input: the suite draws its k-means++ points with its generator
and their scikit-learn ``KMeans`` (``random_state=42``) is started from the same points (``init`` those rows,
``n_init`` 1), so both run Lloyd's algorithm from one start. Their map reads old features (old -> new: the suite's
forward map); the suite's backward map is their code run with the two sides swapped.

Each case is a synthetic upgrade in blobs, each blob under its own (semi-)orthogonal map plus a little noise. Rows:
the routing centres, the mapped test queries (largest absolute difference) and the identity retrieval's R@1 (the
fraction of test queries whose own new-model feature is the nearest; their ``compute_recall_at_k`` in the note), and
one row with each code's own seeding (theirs ``random_state=42``, the suite's seed 0): same R@1 within 0.01.
"""
from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from cl2r_bench.adapters import FeaturePair, fit_adapter, make_adapter
from cl2r_bench.adapters import local_procrustes as module
from tools.parity.common import ROOT, ParityError, provenance, reference_checkout, run_reference_probe
from tools.parity.steps import row

TOLERANCE = 1e-5
R_AT_1_TOLERANCE = 0.01
"""Each code's own k-means seeding: the clusters may differ at their edges, R@1 within this."""
TRAIN, TEST, BLOBS, SPREAD, NOISE = 1200, 300, 8, 0.35, 0.06
CASES = {
    "k-means, soft, 32 -> 32": {"dims": (32, 32), "params": {}},
    "k-means, soft, 24 -> 40 (old narrower)": {"dims": (24, 40), "params": {}},
    "k-means, soft, 40 -> 24 (old wider)": {"dims": (40, 24), "params": {}},
    "k-means, soft, backward 32 -> 32 (their code with the sides swapped)": {"dims": (32, 32), "params": {},
                                                                              "direction": "backward"},
    "k-means, hard routing, 32 -> 32": {"dims": (32, 32), "params": {"routing": "hard"}},
    "k-means, soft, tau 1 (their earlier default), 32 -> 32": {"dims": (32, 32), "params": {"temperature": 1.0}},
    "drift-aware (alpha 1), soft, 24 -> 40": {"dims": (24, 40), "params": {"clustering": "drift_aware"}},
}


def semi_orthogonal(rows: int, columns: int, generator: torch.Generator) -> torch.Tensor:
    """A ``rows x columns`` matrix with orthonormal rows or columns (the narrower side)."""
    q = torch.linalg.qr(torch.randn(max(rows, columns), max(rows, columns), generator=generator))[0]
    return q[:rows, :columns]


def upgrade(old_dim: int, new_dim: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Unit old features in ``BLOBS`` blobs around random directions (noise of norm about ``SPREAD``); the new model
    maps each blob by its own (semi-)orthogonal matrix, plus noise, normalised. The first ``TRAIN`` items fit, the
    last ``TEST`` test."""
    g = torch.Generator().manual_seed(seed)
    directions = F.normalize(torch.randn(BLOBS, old_dim, generator=g), dim=1)
    maps = torch.stack([semi_orthogonal(old_dim, new_dim, g) for _ in range(BLOBS)])
    blob = torch.randint(BLOBS, (TRAIN + TEST,), generator=g)
    noise = SPREAD * torch.randn(len(blob), old_dim, generator=g) / old_dim ** 0.5
    old = F.normalize(directions[blob] + noise, dim=1)
    new = torch.einsum("nd,nde->ne", old, maps[blob]) + NOISE * torch.randn(len(blob), new_dim, generator=g)
    new = F.normalize(new, dim=1)
    return {"old": old[:TRAIN], "new": new[:TRAIN], "old_test": old[TRAIN:], "new_test": new[TRAIN:]}


def suite_fit(data: dict[str, torch.Tensor], params: dict[str, Any], seed: int = 0) -> tuple[Any, list]:
    """The suite's adapter fitted on every fitting item, in order, and the k-means++ starts it drew (backward's,
    then forward's)."""
    starts, draw = [], module.kmeans_plus_plus

    def recorded(points, clusters, generator):
        starts.append(draw(points, clusters, generator))
        return starts[-1]

    adapter = make_adapter("local_procrustes", {"local_procrustes": {
        "anchors": TRAIN, "clusters": BLOBS, "min_items": 1, **params}})
    module.kmeans_plus_plus = recorded
    try:
        fit_adapter(adapter, FeaturePair(data["old"], data["new"], torch.zeros(TRAIN, dtype=torch.long)), seed=seed)
    finally:
        module.kmeans_plus_plus = draw
    return adapter, starts


def r_at_1(queries: torch.Tensor, corpus: torch.Tensor) -> float:
    """The fraction of queries whose nearest corpus row (cosine) is their own."""
    nearest = (F.normalize(queries, dim=1) @ F.normalize(corpus, dim=1).t()).argmax(dim=1)
    return float((nearest == torch.arange(len(queries))).float().mean())


def reference_case(name: str, spec: dict[str, Any], data: dict[str, torch.Tensor], start: torch.Tensor | None) -> dict:
    """What the probe needs for one case: their source and target sides (swapped for the backward map), the
    k-means start (None: their own seeding) and their config's name and overrides."""
    backward = spec.get("direction") == "backward"
    source, target = ("new", "old") if backward else ("old", "new")
    params = spec["params"]
    overrides = {"adapter.type": "procrustes", "clustering.n_clusters": BLOBS,
                 "routing.method": params.get("routing", "soft"), "routing.temperature": params.get("temperature",
                                                                                                   0.1)}
    drift = params.get("clustering") == "drift_aware"
    if drift:
        overrides["clustering.drift_weight"] = params.get("drift_weight", 1.0)
    return {"name": name, "config": "local_drift_aware" if drift else "local_kmeans", "overrides": overrides,
            "source": data[source].numpy(), "target": data[target].numpy(),
            "source_test": data[f"{source}_test"].numpy(), "target_test": data[f"{target}_test"].numpy(),
            "start": None if start is None else start.numpy()}


def suite_side(spec: dict[str, Any], data: dict[str, torch.Tensor], seed: int = 0) -> tuple[dict, torch.Tensor]:
    """The suite's routing centres and mapped test queries for ``spec``'s direction, and its k-means start."""
    adapter, starts = suite_fit(data, spec["params"], seed)
    backward = spec.get("direction") == "backward"
    with torch.no_grad():
        if backward:
            mapped, maps, start = adapter.backward(data["new_test"]), adapter.to_old, starts[0]
        else:
            mapped, maps, start = adapter.forward(data["old_test"]), adapter.to_new, starts[1]
    return {"centres": maps.centres.clone(), "mapped": mapped}, start


def compare(spec: dict[str, Any], data: dict[str, torch.Tensor], ours: dict, theirs: dict, name: str) -> list[dict]:
    target_test = data["old_test" if spec.get("direction") == "backward" else "new_test"]
    mapped = torch.as_tensor(theirs["mapped"]).float()
    ours_r1, theirs_r1 = r_at_1(ours["mapped"], target_test), r_at_1(mapped, target_test)
    return [
        row(f"local_procrustes, {name}: routing centres", float((ours["centres"].double() - torch.as_tensor(
            theirs["centroids"]).double()).abs().max()), TOLERANCE,
            "their MoERouter's centroids (k-means centres, or the drift-aware clusters' means)"),
        row(f"local_procrustes, {name}: mapped test queries", float((ours["mapped"] - mapped).abs().max()),
            TOLERANCE, f"{TEST} queries; their moe_adapter_fn; {BLOBS} clusters"),
        row(f"local_procrustes, {name}: identity retrieval R@1", abs(ours_r1 - theirs_r1), 0.0,
            f"ours {ours_r1:.4f}, theirs {theirs_r1:.4f} (their compute_recall_at_k: {theirs['recall@1']:.4f})"),
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mixed-adapter", required=True, help="a checkout of jonathan-politzki/mixed-adapter")
    parser.add_argument("--reference-python", help="a Python with numpy, scikit-learn, torch, joblib, tqdm and "
                                                   "PyYAML (default: this one)")
    parser.add_argument("--out", default=str(ROOT / "results/parity/local_procrustes.json"))
    parser.add_argument("--stands-for", metavar="COMMIT", help="the commit of theirs a folder without git history "
                                                                "holds (recorded as a stand-in for it)")
    args = parser.parse_args(argv)
    checkout = reference_checkout(args.mixed_adapter, "scripts/run_experiment.py", "jonathan-politzki/mixed-adapter")
    python = Path(args.reference_python) if args.reference_python else Path(__import__("sys").executable)
    if not python.is_file():
        raise ParityError(f"no Python at {python}; pass --reference-python")
    suite, cases, datas = {}, [], {}
    for name, spec in CASES.items():
        datas[name] = upgrade(*spec["dims"])
        suite[name], start = suite_side(spec, datas[name])
        cases.append(reference_case(name, spec, datas[name], start))
    own = "own seeding: theirs random_state 42, the suite's seed 0 (32 -> 32, k-means, soft)"
    own_spec = CASES["k-means, soft, 32 -> 32"]
    datas[own] = datas["k-means, soft, 32 -> 32"]
    suite[own], _ = suite_side(own_spec, datas[own])
    cases.append(reference_case(own, own_spec, datas[own], None))
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        torch.save({"cases": cases}, work / "inputs.pt")
        reference = run_reference_probe(python, "local_procrustes_probe.py", "--mixed-adapter", checkout, work)
    rows = []
    for name, spec in CASES.items():
        rows += compare(spec, datas[name], suite[name], reference[name], name)
    target = datas[own]["new_test"]
    ours_r1 = r_at_1(suite[own]["mapped"], target)
    theirs_r1 = r_at_1(torch.as_tensor(reference[own]["mapped"]).float(), target)
    rows.append(row(f"local_procrustes, {own}: identity retrieval R@1", abs(ours_r1 - theirs_r1), R_AT_1_TOLERANCE,
                    f"ours {ours_r1:.4f}, theirs {theirs_r1:.4f}: different k-means starts, same clusters up to "
                    "their edges"))
    record = {**provenance({"mixed_adapter": ("jonathan-politzki/mixed-adapter", checkout)}), "rows": rows}
    reference = record["references"]["mixed_adapter"]
    if args.stands_for and reference["commit"].startswith("unknown"):
        reference["commit"] = f"{args.stands_for} (a stand-in: its stored files, not a git checkout)"
    Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
    for r in rows:
        print(f"{'ok ' if r['agree'] else 'NO '} {r['name']}: {r['max_abs_diff']} (tolerance {r['tolerance']})")


if __name__ == "__main__":
    main()
