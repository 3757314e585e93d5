"""The leaderboard's ``terms`` table: how much each term of each strategy's loss weighed, and where it never acted.

Each record keeps, per trained task, each loss term's mean per epoch (``timings.tasks[t].loss_terms``, weighted as
the term enters the loss; :meth:`cl2r_bench.strategy.Strategy.terms`). The table reads the tasks that have an older
model (task 1 on: fine-tuning tasks, replacements after the first, upgrade's new model), so that a reading of a
method ("X does not keep ...") can first check that X's compatibility terms acted at all (docs/METHODS.md §6).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from benchmarks.record import RunRecord

from .experiments import experiment_groups
from .tables import Column, Kind

TERM_COLUMNS = (Column("scenario", "scenario", Kind.TEXT), Column("dataset", "dataset", Kind.TEXT),
                Column("strategy", "strategy", Kind.TEXT), Column("term", "term", Kind.TEXT),
                Column("first epoch", "first_epoch", digits=4), Column("last epoch", "last_epoch", digits=4),
                Column("tasks where 0", "inert", Kind.TEXT), Column("seeds", "seeds", Kind.INTEGER))


def task_terms(record: RunRecord) -> list[dict[str, list[float]]]:
    """Each trained task's per-epoch term means, for the tasks with an older model (task 1 on)."""
    return [task["loss_terms"] for task in (record.get("timings") or {}).get("tasks", [])[1:]
            if task.get("loss_terms")]


def term_rows(records: list[RunRecord]) -> list[list[Any]]:
    """Rows ``[scenario, dataset, strategy, term, first epoch, last epoch, tasks where 0, seeds]``
    (:data:`TERM_COLUMNS`): each term's mean over the experiment's runs and tasks of its first and last epoch's
    mean, and on how many of those (run, task) pairs it was 0 at every epoch or absent. ``classification`` first."""
    rows = []
    for (scenario, dataset, label), runs in experiment_groups(records).items():
        tasks = [terms for record in runs for terms in task_terms(record)]
        names = sorted({name for terms in tasks for name in terms}, key=lambda n: (n != "classification", n))
        for name in names:
            series = [terms[name] for terms in tasks if name in terms]
            inert = len(tasks) - len(series) + sum(all(value == 0 for value in values) for values in series)
            rows.append([scenario, dataset, label, name, float(np.mean([values[0] for values in series])),
                         float(np.mean([values[-1] for values in series])), f"{inert} of {len(tasks)}", len(runs)])
    return rows
