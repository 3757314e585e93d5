"""The schema's runtime check (:func:`record_problem`): the marks of :mod:`.schema`, then the rules between fields."""
import json
import reprlib
import sys
from collections.abc import Iterable
from typing import Annotated, Any, get_args, get_origin, get_type_hints, is_typeddict

from ..metrics import MatrixError, as_matrix, is_number

if sys.version_info >= (3, 11):
    from typing import NotRequired
else:
    from typing_extensions import NotRequired

from .marks import Read, _count, _object
from .schema import LeaveOneOutRecord, RunRecord


def schema_problem(value: Any, schema: Any, within: str = "") -> str | None:
    """Why ``value`` breaks the fields of the ``TypedDict`` ``schema`` that are marked :class:`Read` (``within``
    prefixes their names in the message), or None: each such field in declaration order, then, for a field that
    passes and is itself a ``TypedDict`` or a list of them, its own marked fields."""
    for key, hint in get_type_hints(schema, include_extras=True).items():
        read = _read_mark(hint)
        if read is None:
            continue
        required = read.required or (read.required_with is not None and read.required_with in value)
        if key not in value:
            if required:
                return f"'{within}{key}' is missing; it must be {read.expected}"
            continue
        if not read.check(value[key]):
            return f"'{within}{key}' is {reprlib.repr(value[key])}; it must be {read.expected}"
        if read.each is not None:
            problem = _first(f"'{within}{key}.{name}' is {reprlib.repr(item)}; it must be {read.each.expected}"
                             for name, item in value[key].items() if not read.each.check(item))
            if problem:
                return problem
        problem = _nested_problem(value[key], hint, f"{within}{key}")
        if problem:
            return problem
    return None


def _read_mark(hint: Any) -> Read | None:
    """The :class:`Read` of a field's type hint (through ``NotRequired``), or None."""
    while get_origin(hint) is NotRequired:
        hint = get_args(hint)[0]
    return next((m for m in getattr(hint, "__metadata__", ()) if isinstance(m, Read)), None)


def _nested_problem(value: Any, hint: Any, name: str) -> str | None:
    """The problem of a field's own fields: a ``TypedDict`` value, or each item of a list of them."""
    while get_origin(hint) in (NotRequired, Annotated):
        hint = get_args(hint)[0]
    inner = [a for a in get_args(hint) if a is not type(None)] if get_args(hint) else [hint]
    if len(inner) == 1 and is_typeddict(inner[0]) and isinstance(value, dict):
        return schema_problem(value, inner[0], f"{name}.")
    if get_origin(hint) is list and is_typeddict(get_args(hint)[0]) and isinstance(value, list):
        return _first(schema_problem(item, get_args(hint)[0], f"{name}[{i}].") for i, item in enumerate(value))
    return None


def _first(problems: Iterable[str | None]) -> str | None:
    return next((p for p in problems if p), None)


def record_problem(record: Any) -> str | None:
    """Why a parsed ``metrics.json`` cannot be a leaderboard row, or None when it can.

    The fields the readers rely on are checked as the schema marks them (:class:`Read`, :func:`schema_problem`:
    :class:`RunRecord`, or :class:`LeaveOneOutRecord` for the leave-one-out protocol), then the rules between
    fields: an incomplete run is reported as such, a complete one has all its tasks, the matrix is read as
    :func:`benchmarks.metrics.as_matrix` reads it, the config can be grouped by, and a ``model_update`` stream
    record has its cases, backfilling and adapter fit. So a hand-made or damaged file is named and left out
    instead of crashing a table or being averaged.
    """
    if not isinstance(record, dict):
        return f"holds {reprlib.repr(record)}, not a JSON object; a metrics.json is one object"
    if "complete" not in record or not isinstance(record["complete"], bool):
        return (f"'complete' is {reprlib.repr(record['complete'])}; it must be true or false" if "complete" in record
                else "'complete' is missing; it must be true or false")
    return (_incomplete(record)
            or schema_problem(record, LeaveOneOutRecord if leave_one_out(record) else RunRecord)
            or _tasks_problem(record)
            or _matrix_problem(record)
            or _flips_problem(record)
            or _config_problem(record)
            or (_update_problem(record) if record["scenario"] == "model_update" and not leave_one_out(record)
                else None))


def adapter_study(record: dict[str, Any]) -> bool:
    """Whether a record holds an adapter study (``retrieval``): leave-one-out, or a ``model_update`` run along a
    stream."""
    return "retrieval" in record


def leave_one_out(record: dict[str, Any]) -> bool:
    """Whether a record measures the adapter papers' leave-one-out protocol (``runner.py adapt``, ``model_update``
    with encoder specs; docs/METHODS.md §7b) rather than a compatibility matrix along a stream."""
    return record.get("protocol") == "leave_one_out"


def _incomplete(record: dict[str, Any]) -> str | None:
    if record["complete"]:
        return None
    done, total = (record.get(k) if _count(record.get(k)) else "?" for k in ("tasks_completed", "num_tasks"))
    return f"incomplete run ({done} of {total} tasks)"


def _tasks_problem(record: dict[str, Any]) -> str | None:
    done, total = record.get("tasks_completed"), record.get("num_tasks")
    if done is None or total is None or done == total:
        return None
    return f"'complete' is true but tasks_completed is {done} of num_tasks {total}; rerun it or fix the record"


def _matrix_problem(record: dict[str, Any]) -> str | None:
    if "compatibility_matrix" not in record:
        return None
    try:
        size = len(as_matrix(record["compatibility_matrix"]))
    except MatrixError as exc:
        return f"compatibility_matrix: {exc}"
    tasks = record.get("num_tasks")
    if tasks is not None and size != tasks:
        return f"compatibility_matrix has {size} rows but num_tasks is {tasks}; a complete run has one row per task"
    return None


def _flips_problem(record: dict[str, Any]) -> str | None:
    """Negative flips whose lists do not hold one rate per consecutive pair: of the compatibility matrix's tasks at
    the top level, of the two models in ``retrieval`` and ``two_model``."""
    retrieval, two_model = record.get("retrieval"), record.get("two_model")
    found = [("retrieval.negative_flips", retrieval.get("negative_flips") if _object(retrieval) else None, 1),
             ("two_model.negative_flips", two_model.get("negative_flips") if _object(two_model) else None, 1)]
    if "compatibility_matrix" in record:
        found.insert(0, ("negative_flips", record.get("negative_flips"), len(record["compatibility_matrix"]) - 1))
    for name, flips, pairs in found:
        for kind in ("self", "cross") if flips else ():
            if len(flips[kind]) != pairs:
                return (f"'{name}.{kind}' has {len(flips[kind])} rates; it must have {pairs}, one per consecutive "
                        "pair of models")
    return None


def _config_problem(record: dict[str, Any]) -> str | None:
    """A config whose adapter is not an object, or that is nested too deeply for the leaderboard to group runs by
    it (``cl2r_bench.reporting.experiments.experiment_settings`` flattens it and serialises its values)."""
    config = record.get("config") or {}
    adapter = config.get("adapter")
    if adapter and not isinstance(adapter, dict):
        return f"'config.adapter' is {reprlib.repr(adapter)}; it must be an object with a 'name'"
    try:
        json.dumps(config, sort_keys=True, default=str)
    except RecursionError:
        return "'config' is nested too deeply; it must be the resolved settings of configs/default.yaml"
    return None


def _update_problem(record: dict[str, Any]) -> str | None:
    """A ``model_update`` stream record: its adapter study (``retrieval``; a record of the former layout, with
    top-level ``cases`` as fractions, is refused), and its adapter's fit log (``fits``, or ``fit`` in older
    records) with a numeric ``f_W`` where there is one."""
    if "retrieval" not in record:
        return ("a model_update record of the former layout (top-level 'cases', top-1 only); run it again with this "
                "version, which reads its cached models, to get the cases' top-1 / top-5 / mAP" if "cases" in record
                else "'retrieval' is missing; it must be an object with 'cases' and 'backfilling' (an adapter study)")
    if not record.get("adapter"):
        return None
    adapter = record["adapter"]
    if not (_object(adapter) and (_object(adapter.get("fit")) or _fits(adapter.get("fits")))):
        return (f"'adapter' is {reprlib.repr(adapter)}; it must be null or an object with a 'fits' list (or, in "
                "older records, a 'fit' object)")
    declared = adapter.get("diagnostics", LEGACY_DIAGNOSTICS)
    if not (_object(declared) and all(isinstance(v, str) for v in declared.values())):
        return f"'adapter.diagnostics' is {reprlib.repr(declared)}; it must map fit-log keys to column titles"
    fit = update_fit(record)
    for key in declared:
        if key in fit and not is_number(fit[key]):
            within = "adapter.fit." if "fit" in adapter else f"adapter.fits[{len(adapter['fits']) - 1}]."
            return f"'{within}{key}' is {reprlib.repr(fit[key])}; it must be a number (a declared diagnostic)"
    return None


def _fits(value: Any) -> bool:
    return isinstance(value, list) and len(value) > 0 and all(map(_object, value))


LEGACY_DIAGNOSTICS = {"f_W": "f(W)"}
"""The diagnostic columns of records written before adapters declared theirs: λ-orthogonal's ``f_W``."""


def adapter_diagnostics(record: RunRecord) -> dict[str, str]:
    """``{fit-log key: column title}`` of the record's adapter: its declared ``diagnostics``, or
    :data:`LEGACY_DIAGNOSTICS` where its last fit holds them; ``{}`` without adapter."""
    adapter = record.get("adapter") or {}
    if "diagnostics" in adapter:
        return dict(adapter["diagnostics"])
    fit = update_fit(record)
    return {key: title for key, title in LEGACY_DIAGNOSTICS.items() if key in fit}


def update_fit(record: RunRecord) -> dict[str, Any]:
    """The fit log of a ``model_update`` run's adapter (its one fit; ``adapter.fit`` in older records), or ``{}``
    without adapter."""
    adapter = record.get("adapter") or {}
    return adapter.get("fit") or (adapter.get("fits") or [{}])[-1]
