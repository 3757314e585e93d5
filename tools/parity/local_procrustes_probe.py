"""The reference side of local Procrustes's parity check: run under the reference's Python (numpy, scikit-learn,
torch, joblib, tqdm, PyYAML).

    <reference python> tools/parity/local_procrustes_probe.py --mixed-adapter PATH --work DIR

``DIR/inputs.pt`` (written by ``tools/parity/local_procrustes.py``) holds cases: the source and target features of
a fitting set and of a test set, a config name of theirs with overrides, and the rows of the fitting set that
start k-means (or none: their own seeding). For each case this script, importing nothing of the suite and copying
none of the author's code, loads their ``scripts/run_experiment.py`` and calls its ``run_local_experiment`` with
their ``load_config`` of that config and overrides, on the splits ``X_old_train`` / ``X_new_train`` (the source and
target of the fit) and ``X_*_test_q`` / ``X_*_test_c`` (the test features). Stand-ins: scikit-learn's ``KMeans``,
where a start is given, begins at those rows (``init``, ``n_init`` 1; the rest of their call as it is);
``evaluate_adapter`` keeps the mapped test queries and scores them by their ``compute_recall_at_k`` alone (their
oracle and no-adapter baselines are skipped: the no-adapter one cannot compare an old side wider than the new one,
a width change their pairs never have); ``MoERouter`` is theirs, wrapped to keep the centroids it is given;
``sentence_transformers`` and ``datasets`` (imported by their pair generator and data loaders, unused here) are
empty modules when not installed.

It writes, per case, the routing centroids, the mapped test queries and their evaluation's recall@1 to
``DIR/reference.pt``.
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
import types
from pathlib import Path

import numpy as np
import torch

STATE: dict = {}


def module_at(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def absent_packages() -> None:
    """``sentence_transformers`` and ``datasets`` as empty modules when they are not installed (text embedding and
    data loading: not on this path)."""
    for name, attribute in (("sentence_transformers", "SentenceTransformer"), ("datasets", "load_dataset")):
        if importlib.util.find_spec(name) is None:
            stub = types.ModuleType(name)
            setattr(stub, attribute, None)
            sys.modules[name] = stub


def seeded_kmeans(kmeans_class):
    """Their ``KMeans``, started from the rows ``STATE['start']`` of what it fits when a start is given."""
    class StartedKMeans(kmeans_class):
        def fit(self, X, y=None, sample_weight=None):
            if STATE.get("start") is not None:
                self.init, self.n_init = np.asarray(X)[STATE["start"]], 1
            return super().fit(X, y, sample_weight)

    return StartedKMeans


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mixed-adapter", required=True)
    parser.add_argument("--work", required=True)
    args = parser.parse_args()
    checkout, work = Path(args.mixed_adapter), Path(args.work)
    sys.path.insert(0, str(checkout))
    absent_packages()
    runner = module_at(checkout / "scripts" / "run_experiment.py", "mixed_adapter_run_experiment")
    import src.clustering.drift_aware as drift_aware
    import src.clustering.kmeans as kmeans

    kmeans.KMeans = seeded_kmeans(kmeans.KMeans)
    drift_aware.KMeans = seeded_kmeans(drift_aware.KMeans)
    from src.evaluation.retrieval import compute_recall_at_k

    router = runner.MoERouter

    def recording_router(centroids, *rest, **options):
        STATE["centroids"] = np.array(centroids, dtype=np.float64)
        return router(centroids, *rest, **options)

    def recording_evaluation(adapter_fn, X_old_queries, X_new_queries, X_old_corpus, X_new_corpus, k_values):
        STATE["mapped"] = adapter_fn(X_old_queries)
        truth = np.arange(len(X_new_queries))
        return {"adapted": compute_recall_at_k(STATE["mapped"], X_new_corpus, truth, k_values)}

    runner.MoERouter, runner.evaluate_adapter = recording_router, recording_evaluation
    results = {}
    for case in torch.load(work / "inputs.pt", weights_only=False)["cases"]:
        STATE.clear()
        STATE["start"] = case["start"]
        overrides = runner.parse_overrides([f"--{key}={value}" for key, value in case["overrides"].items()])
        cfg = runner.load_config(experiment_config=case["config"], overrides=overrides)
        splits = {"X_old_train": case["source"], "X_new_train": case["target"],
                  "X_old_test_q": case["source_test"], "X_new_test_q": case["target_test"],
                  "X_old_test_c": case["source_test"], "X_new_test_c": case["target_test"]}
        outcome = runner.run_local_experiment(cfg, splits)
        results[case["name"]] = {"centroids": STATE["centroids"], "mapped": np.asarray(STATE["mapped"]),
                                 "recall@1": float(outcome["evaluation"]["adapted"]["recall@1"]),
                                 "config": {k: cfg[k] for k in ("adapter", "clustering", "routing")}}
    torch.save(results, work / "reference.pt")


if __name__ == "__main__":
    main()
