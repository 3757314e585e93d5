"""The old name of :mod:`cl2r_bench.class_regions` (the BCT line's class centres and radii): kept for one release so
that a strategy plug-in written against it still loads, with a FutureWarning saying where the names went."""
import warnings

from cl2r_bench.class_regions import (  # noqa: F401 - re-exported under the old name
    CENTRE_CLASSES,
    ClassRegions,
    class_regions,
    largest_inlier,
    task_regions,
)

warnings.warn("strategies.old_classes is now cl2r_bench.class_regions; import ClassRegions, class_regions and "
              "task_regions from there (the old name goes in the next release)", FutureWarning, stacklevel=2)
