"""The old name of :mod:`cl2r_bench.adapters.learned` (``LearnedAdapter``, ``StepBudget``): kept for one release so
that an adapter plug-in written against it still loads, with a FutureWarning saying where the names went."""
import warnings

from cl2r_bench.adapters.learned import (  # noqa: F401 - re-exported under the old name
    FitProgress,
    LearnedAdapter,
    StepBudget,
    convergence_note,
    split_held_out,
    train_to_convergence,
)

warnings.warn("cl2r_bench.adapters.training is now cl2r_bench.adapters.learned; import LearnedAdapter and StepBudget "
              "from there (the old name goes in the next release)", FutureWarning, stacklevel=2)
