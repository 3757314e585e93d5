"""Every compatibility term acts where its paper applies it (docs/METHODS.md §6): each registered strategy with a
teacher runs the tiny run of every scenario that trains one, and at every task that has an old model (a fine-tuning
task, a replacement after the first, upgrade's new model) the record's per-term log shows a compatibility term that
is not 0, so a protocol can never switch a strategy's terms off unseen (the upgrade protocol's empty replay memory
once made FD, d-Simplex-FD and CVS's prototype term inert). A strategy whose terms cannot act in a scenario says why
in its ``inert_terms``, and the test then checks that they are indeed inert there."""
import json

import pytest
from helpers.runs import tiny_config

from cl2r_bench.app import cli as runner
from cl2r_bench.strategy import CLASSIFICATION_TERM
from strategies import get_strategy, list_strategies

SCENARIOS = {
    "cl2r": (["--set", "replacement.tasks=[]"], [1, 2]),
    "iamcl2r": ([], [1, 2]),
    "upgrade": (["--set", "stream.num_tasks=2", "--set", "replacement.tasks=[]", "--set", "stream.initial_classes=6",
                 "--set", "stream.increment=6", "--set", "evaluation.dataset=stream"], [1]),
}
"""Each scenario's flags on the tiny run and its tasks with an old model (iamcl2r: task 1 fine-tunes, task 2 is a
replacement)."""
WITH_TEACHER = [name for name in list_strategies() if get_strategy(name).needs_teacher
                and get_strategy(name).__module__.startswith("strategies.")]


@pytest.fixture(scope="module")
def tiny_shared(tmp_path_factory):
    """One tiny config for the module, so that its replacement and old models are pretrained once."""
    return tiny_config(tmp_path_factory.mktemp("terms"))


def compatibility_means(record: dict, task: int) -> dict[str, list[float]]:
    """Each compatibility term's mean per epoch at ``task``."""
    terms = record["timings"]["tasks"][task]["loss_terms"]
    assert CLASSIFICATION_TERM in terms, f"task {task} logged no classification term: {sorted(terms)}"
    return {name: means for name, means in terms.items() if name != CLASSIFICATION_TERM}


@pytest.mark.slow
@pytest.mark.parametrize("scenario", list(SCENARIOS))
@pytest.mark.parametrize("name", WITH_TEACHER)
def test_a_compatibility_term_acts_at_every_task_with_an_old_model(name, scenario, tiny_shared, tmp_path):
    flags, tasks = SCENARIOS[scenario]
    out = tmp_path / "out"
    assert runner.main(["--config", str(tiny_shared), "--scenario", scenario, *flags, "--strategy", name,
                        "--output", str(out)]) == 0
    record = json.loads((out / scenario / "synthetic" / name / "seed42" / "metrics.json").read_text())
    inert_reason = get_strategy(name).inert_terms.get(scenario)
    for task in tasks:
        means = compatibility_means(record, task)
        acting = {term for term, values in means.items() if any(value != 0 for value in values)}
        if inert_reason:
            assert not acting, f"{name} says its terms are inert in {scenario} ({inert_reason}), but {acting} act"
        else:
            assert acting, (f"{name} in {scenario}, task {task}: no compatibility term acts (its loss is its "
                            f"classification term alone; terms logged {means})")
