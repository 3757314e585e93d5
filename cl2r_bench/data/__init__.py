"""The data: readers of the data sets (:mod:`.datasets`), the class-incremental streams and evaluation sets built
from them (:mod:`.streams`) and the training crops (:mod:`.transforms`). Training, strategies, measuring and the
scenarios read data through here; this part imports no other part of the suite."""
