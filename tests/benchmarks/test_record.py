"""The run record's schema (``benchmarks/record/``): reading a ``metrics.json`` either gives the complete record
or fails in one line naming the file, and the ``TypedDict`` s name every field the metric writers produce."""
import typing
from typing import Annotated, TypedDict

import pytest
from helpers.hits import H00, H10, H11, H20, H21, H22
from helpers.records import MATRIX, changed, update_record, valid_record, write
from typing_extensions import NotRequired

from benchmarks.flips import negative_flips
from benchmarks.metrics import all_metrics, as_matrix
from benchmarks.noise import noise_metrics
from benchmarks.record import (
    PAPER_CASES,
    RECORD_FILE,
    Metrics,
    NegativeFlips,
    Noise,
    NoiseSummary,
    PairDecision,
    Read,
    RecordError,
    Retrieval,
    RunRecord,
    checked_records,
    read_record,
    record_problem,
    schema_problem,
)
from cl2r_bench.reporting import experiments


def keys(typed: type) -> set[str]:
    return set(typed.__required_keys__ | typed.__optional_keys__)


@pytest.mark.parametrize("make", [valid_record, update_record])
def test_a_good_record_round_trips(tmp_path, make):
    record = make()
    path = write(tmp_path, "run", record)
    assert path.name == RECORD_FILE
    assert read_record(path) == record
    assert read_record(str(path)) == record


@pytest.mark.parametrize("flips", [negative_flips([[H00], [H10, H11], [H20, H21, H22]]), None])
def test_negative_flips_round_trip_as_computed_or_null(tmp_path, flips):
    """The flips of a 3-task run's hits (two pairs), or null where a run kept no hits, are read back unchanged."""
    record = changed(valid_record(), "negative_flips", flips)
    assert read_record(write(tmp_path, "run", record))["negative_flips"] == flips


FAILURES = {
    "missing": (None, "unreadable (No such file or directory)"),
    "not_utf8": (b'{"scenario": "synth\xe9tic"}', "not UTF-8 text (byte 0xe9"),
    "deep": ("[" * 100000, "JSON nesting too deep"),
    "not_json": ('{"complete": true,', "not valid JSON"),
    "not_an_object": ("[1, 2]", "not a JSON object"),
    "incomplete": (changed(valid_record(), "complete", False), "incomplete run (3 of 3 tasks)"),
    "out_of_range": (changed(valid_record(), "metrics.AC", 1.7), "'metrics.AC' is 1.7"),
}


@pytest.mark.parametrize("name", FAILURES)
def test_each_failure_is_one_line_naming_the_file(tmp_path, name):
    content, fragment = FAILURES[name]
    path = tmp_path / name / RECORD_FILE if content is None else write(tmp_path, name, content)
    with pytest.raises(RecordError) as caught:
        read_record(path)
    error = caught.value
    assert isinstance(error, ValueError) and error.path == path and fragment in error.problem
    assert str(error) == f"{path}: {error.problem}" and "\n" not in str(error)


def test_checked_records_walks_a_folder_in_path_order(tmp_path):
    good = write(tmp_path, "a", valid_record())
    bad = write(tmp_path, "b", changed(valid_record(), "seed", "1"))
    assert list(checked_records(tmp_path)) == [(good, valid_record(), None),
                                               (bad, None, record_problem(changed(valid_record(), "seed", "1")))]
    assert experiments.collect(tmp_path) == ([valid_record()], [(bad, "'seed' is '1'; it must be an integer")])


def test_the_schema_names_every_field_the_writers_produce():
    matrix = as_matrix(MATRIX)
    noise = noise_metrics(matrix, 144, replacement_tasks=[0, 2])
    assert keys(Metrics) == set(all_metrics(matrix))
    assert keys(Noise) == set(noise) and keys(NoiseSummary) == set(noise["across"])
    assert keys(PairDecision) == set(noise["pair_decisions"][0])
    assert keys(NegativeFlips) == set(negative_flips([[H00], [H10, H11]]))
    assert set(valid_record()) | set(update_record()) <= keys(RunRecord)
    assert set(update_record()["retrieval"]) <= keys(Retrieval)
    assert tuple(update_record()["retrieval"]["cases"]) == PAPER_CASES
    assert typing.get_type_hints(RunRecord)["metrics"] is Metrics


class _Item(TypedDict):
    size: Annotated[int, Read("a size", lambda v: isinstance(v, int) and v >= 0, required=True)]
    note: str


class _Box(TypedDict):
    name: Annotated[str, Read("a name", lambda v: isinstance(v, str) and v != "", required=True)]
    share: NotRequired[Annotated[float, Read("a share", lambda v: isinstance(v, float) and 0 <= v <= 1)]]
    width: Annotated[int, Read("a width", lambda v: isinstance(v, int), required_with="share")]
    items: Annotated[list[_Item], Read("a list", lambda v: isinstance(v, list))]
    free: dict


@pytest.mark.parametrize("value, problem", [
    ({"name": "a", "free": "anything"}, None),
    ({}, "'name' is missing; it must be a name"),
    ({"name": ""}, "'name' is ''; it must be a name"),
    ({"name": "a", "share": 2.0}, "'share' is 2.0; it must be a share"),
    ({"name": "a", "share": 0.5}, "'width' is missing; it must be a width"),
    ({"name": "a", "items": [{"size": 1}, {"size": -1}]}, "'items[1].size' is -1; it must be a size"),
    ({"name": "a", "items": [{"note": "x"}]}, "'items[0].size' is missing; it must be a size"),
])
def test_the_check_is_derived_from_the_fields_the_schema_marks_read(value, problem):
    """Only ``Read``-marked fields are checked, in declaration order, nested TypedDicts and lists of them too."""
    assert schema_problem(value, _Box) == problem
