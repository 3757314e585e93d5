"""The leaderboard's ``terms`` table (cl2r_bench/reporting/loss_terms.py): each loss term's first and last epoch over
the tasks with an older model, and where it never acted, by hand."""
import copy

import pytest
from helpers.records import valid_record

from cl2r_bench.reporting.leaderboard import build
from cl2r_bench.reporting.loss_terms import term_rows


def with_terms(seed: int, per_task: list[dict | None]) -> dict:
    """A record whose task t logged ``per_task[t]`` (None: nothing, as a task that did not train)."""
    record = valid_record(seed)
    record["timings"] = copy.deepcopy(record["timings"])
    record["timings"]["tasks"] = [dict(record["timings"]["tasks"][0]) for _ in per_task]
    for task, terms in zip(record["timings"]["tasks"], per_task, strict=True):
        if terms is not None:
            task["loss_terms"] = terms
    return record


def test_terms_are_read_from_the_tasks_with_an_older_model_and_inert_ones_counted():
    """Seed 1: task 1 distils (0.4 -> 0.2), task 2 does not (0 at both epochs). Seed 2: task 1 distils (0.6 -> 0.4),
    task 2 logs no distillation at all. Task 0's terms (no older model) are left out. Distillation: first epoch
    (0.4 + 0 + 0.6) / 3, last (0.2 + 0 + 0.4) / 3 over the tasks that logged it; 0 or absent on 2 of the 4 tasks."""
    first = with_terms(1, [{"classification": [9.0]}, {"classification": [2.0, 1.0], "distillation": [0.4, 0.2]},
                           {"classification": [3.0, 2.0], "distillation": [0.0, 0.0]}])
    second = with_terms(2, [None, {"classification": [2.0, 1.0], "distillation": [0.6, 0.4]},
                            {"classification": [1.0, 1.0]}])
    rows = term_rows([first, second])
    assert [row[3] for row in rows] == ["classification", "distillation"]
    classification, distillation = rows
    assert classification[4:] == [pytest.approx(2.0), pytest.approx(1.25), "0 of 4", 2]
    assert distillation[4:] == [pytest.approx(1.0 / 3), pytest.approx(0.2), "2 of 4", 2]


def test_records_without_terms_have_no_row_and_the_table_is_built_by_name():
    assert term_rows([valid_record(1)]) == []
    record = with_terms(1, [None, {"classification": [1.0], "loss": [1.0]}, None])
    (table,) = build([record], names=["terms"])["terms"]
    assert [row[3] for row in table.rows] == ["classification", "loss"]
