"""What a seed and a count may be, checked where they enter (command line, config, array files) and before anything
is allocated or seeded (docs/reliability.md).

* A seed is an integer in [0, :data:`SEED_MAX`]: every generator the suite seeds (torch, numpy, Python) takes it,
  and so does a task's seed ``seed * 1000 + task`` (:func:`cl2r_bench.settings.task_seed`) in torch's 64 bits.
* A count (queries, jobs, runs) is an integer in [1, :data:`COUNT_MAX`].
"""
from __future__ import annotations

import argparse

SEED_MAX = 2**32 - 1
COUNT_MAX = 2**31 - 1


def seed_problem(value: object, name: str = "seed") -> str | None:
    """Why ``value`` is not a seed, or None."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= SEED_MAX:
        return f"{name} must be an integer from 0 to {SEED_MAX} (2^32 - 1), not {value!r}"
    return None


def _integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None


def seed_argument(text: str) -> int:
    """argparse ``type`` of a seed."""
    value = _integer(text)
    problem = seed_problem(value, "a seed")
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return value


def count_argument(text: str) -> int:
    """argparse ``type`` of a count (queries, jobs, runs)."""
    value = _integer(text)
    if not 1 <= value <= COUNT_MAX:
        raise argparse.ArgumentTypeError(f"must be a whole number from 1 to {COUNT_MAX}, not {text}")
    return value
