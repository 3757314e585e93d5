"""The data: the data sets (:mod:`.datasets` holds what they share and their template, one file each registers one), the
class-incremental streams and evaluation sets built from them (:mod:`.streams`), the training crops (:mod:`.transforms`)
and how Avalanche is imported (:mod:`.avalanche_import`). Training, strategies, measuring and the scenarios read data
through here; this part imports no other part of the suite but its plug-in loader: every module of this folder is
imported (:func:`cl2r_bench.plugins.import_folder`), so a data set is its file."""
from cl2r_bench.plugins import import_folder

import_folder(__name__, __path__)
