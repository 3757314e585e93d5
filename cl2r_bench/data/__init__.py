"""The data: the data sets (:mod:`.datasets` holds what they share and their template, one file each registers one), the
class-incremental streams and evaluation sets built from them (:mod:`.streams`), the training crops (:mod:`.transforms`)
and how Avalanche is imported (:mod:`.avalanche_import`). Training, strategies, measuring and the scenarios read data
through here; this part imports no other part of the suite."""
from . import cifar, synthetic, tiny_imagenet  # noqa: F401  (each registers its data sets)
