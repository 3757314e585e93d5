"""``python -m cl2r_bench`` is the ``cl2r-bench`` command."""
import sys

from cl2r_bench.app.cli import main

sys.exit(main())
