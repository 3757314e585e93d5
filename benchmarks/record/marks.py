"""The marks of the record schema (:class:`Read`): what a field the readers rely on must be, and its test."""
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..metrics import is_number

DUAL_CASE = "old+new/old"
"""Queries embedded by both models and combined by the adapter (SLERP) against the untouched old gallery."""


PAPER_CASES = ("old/old", "new/old", "new/new", "F/old", "F/F", "new/F", "B/old", "B/F", "B/B", DUAL_CASE)
"""The leave-one-out cases, query/gallery: λ-orth's Table 1b and the dual query (:data:`DUAL_CASE`)."""


SCORES = ("top1", "top5", "mAP")
"""The scores of each leave-one-out case, in percent."""


LARGE_GALLERY_SCORES = ("mAP@R",)
"""The scores a case adds since the suite measures large galleries (version 0.6.0; benchmarks/ranking/), absent
from older records."""


Check = Callable[[Any], bool]


@dataclass(frozen=True)
class Read:
    """A field the readers rely on, marked in the schema below as ``Annotated[type, Read(...)]``: what it must be
    (``expected``, the words of the one-line problem), the test of its value (``check``), and whether a record
    without it is rejected (``required``; ``required_with``: only when that field beside it is present). A
    ``TypedDict`` field (or a list of them) that passes is checked field by field in turn, and an object whose
    keys are names (a backfilling order's) value by value by its ``each`` mark (:func:`schema_problem`). Fields
    without a ``Read`` are as the writer wrote them."""

    expected: str
    check: Check
    required: bool = False
    required_with: str | None = None
    each: "Read | None" = None


def _text(value: Any) -> bool:
    return isinstance(value, str) and value.strip() != ""


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _count(value: Any) -> bool:
    return _integer(value) and value >= 0


def _object(value: Any) -> bool:
    return isinstance(value, dict)


def _within(low: float, high: float) -> Check:
    return lambda value: is_number(value) and low <= value <= high


def _optional(check: Check) -> Check:
    return lambda value: value is None or check(value)


def _interval(value: Any) -> bool:
    return isinstance(value, list) and len(value) == 2 and all(map(_within(0, 1), value))


def _objects(value: Any) -> bool:
    return isinstance(value, list) and all(map(_object, value))


def _scores(value: Any) -> bool:
    """A case's scores; a screened ranking's (``model_update.screen``) give mAP@R and no mAP (null)."""
    screened = _object(value) and value.get("mAP") is None and "mAP@R" in value
    return (_object(value) and all(_within(0, 100)(value.get(k)) for k in SCORES if not (screened and k == "mAP"))
            and all(_within(0, 100)(value[k]) for k in LARGE_GALLERY_SCORES if k in value))


def _areas(value: Any) -> bool:
    """An order's areas: top-1 and mAP, or top-1 and mAP@R where the gallery was screened."""
    precision = "mAP@R_auc" if _object(value) and "mAP@R_auc" in value else "mAP_auc"
    return _object(value) and all(_within(0, 100)(value.get(k)) for k in ("top1_auc", precision))


def _packed(value: Any) -> bool:
    """Per-query hits by case, each packed by :func:`pack_hits` (base64 text)."""
    return _object(value) and all(isinstance(hits, str) for hits in value.values())


def _packed_list(value: Any) -> bool:
    """Per-query hits of each matrix entry in row order, each packed by :func:`pack_hits` (base64 text)."""
    return isinstance(value, list) and all(isinstance(hits, str) for hits in value)


def _curves(value: Any) -> bool:
    """CMC top-1 ... top-k in percent by case."""
    return _object(value) and all(isinstance(curve, list) and all(map(_within(0, 100), curve))
                                  for curve in value.values())


def _counts(value: Any) -> bool:
    return _object(value) and all(map(_count, value.values()))


NAME = Read("a non-empty string", _text, required=True)


COUNT = Read("a whole number from 0", _count)


PACKED_HITS = Read("an object of per-query hits packed as base64 text", _packed)


CMC_CURVES = Read("an object of CMC curves (lists of percentages)", _curves)


def _case_rates(value: Any) -> bool:
    return _object(value) and all(isinstance(case, str) and _within(0, 1)(rate) for case, rate in value.items())


CASE_FLIPS = Read("an object of fractions in [0, 1] per case", _case_rates)


CONVENTION = Read("'miss' or 'exclude'", lambda value: value in ("miss", "exclude"))


FRACTION = "a fraction in [0, 1]"


OPTIONAL_FRACTION = Read("null or a fraction in [0, 1]", _optional(_within(0, 1)))


INTERVAL = "[low, high], fractions in [0, 1]"


RATES = "a list of fractions in [0, 1] (null where not measured)"


FLIPS = "an object with self, cross, mean_self and mean_cross (benchmarks/flips.py)"


def _rates(value: Any) -> bool:
    return isinstance(value, list) and all(map(_optional(_within(0, 1)), value))
