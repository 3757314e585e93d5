"""Adapters between two encoders' features, measured by the papers' leave-one-out protocol (docs/METHODS.md §7b).

Two ways in, one way through:

* the user's own embeddings (``runner.py adapt --train TRAIN --test TEST``): :func:`read_embeddings` reads a
  ``.npz`` (arrays ``old``, ``new``, ``labels``) or a folder (``old.npy``, ``new.npy``, ``labels.npy``, or the
  same as ``.pt`` tensors, read with ``weights_only=True``) and checks it, every problem one line;
* two encoders by spec (``model_update.old`` / ``model_update.new``): :func:`encoder_study` embeds the data set's
  train and test splits once per encoder through the feature cache (:mod:`cl2r_bench.feature_cache`).

Either gives a :class:`Study`: the train split's features of both models (the adapter's fitting data) and the test
split's (query and gallery). :func:`evaluate_adapter` fits one adapter with one seed (:func:`fit_adapter`) and
measures it (:mod:`benchmarks.adapted_cases`): the nine cases, the partial-backfilling AUCs and, where the new
encoder has an ImageNet classifier and the data have ImageNet classes, the zero-shot retention. Labels are
renumbered 0..C-1 in order of first appearance in the train split, then the test split's other labels in sorted
order (retrieval compares labels only).
FastFill's discriminative loss reads "the new model's classifier" for the data's classes; a pretrained encoder's
own classifier does not know a downstream data set's classes, so the rows are the new model's class means of the
train split (a nearest-class-mean classifier: the suite's choice, the same for every input).

The package, one idea per module: :mod:`.settings`, :mod:`.embeddings` (the user's files), :mod:`.encoder_study`
(two encoders by spec), :mod:`.study` (fit, measure, record), :mod:`.resume`, :mod:`.export` and :mod:`.driver`
(the one loop over adapters and seeds that ``adapt``, the ``model_update`` scenario and the pretrained study share).
"""
from .embeddings import EmbeddingsError, read_embeddings, study_from_embeddings, unseen_rows, unseen_split
from .encoder_study import embedded, encoder_study, study_images
from .export import export_adapter
from .resume import finished_records, result_of_record
from .settings import ADAPT_KEYS, adapt_config, adapt_settings
from .study import Study, ZeroShot, cross_entry, evaluate_adapter, result_json, study_matrix, study_record

__all__ = [
    "ADAPT_KEYS", "EmbeddingsError", "Study", "ZeroShot", "adapt_config", "adapt_settings", "cross_entry", "embedded",
    "encoder_study", "evaluate_adapter", "export_adapter", "finished_records", "read_embeddings", "result_json",
    "result_of_record", "study_from_embeddings", "study_images", "study_matrix", "study_record",
    "unseen_rows", "unseen_split",
]
