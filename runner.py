"""The suite's command line, run from a checkout: ``python runner.py ...`` is the ``cl2r-bench`` command
(:mod:`cl2r_bench.app.cli`)."""
import sys

from cl2r_bench.app.cli import main

if __name__ == "__main__":
    sys.exit(main())
