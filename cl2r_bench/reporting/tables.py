r"""A table as values (:class:`Table` of :class:`Column`), and its three formats (:func:`render`), each ready to use
as it is:

- ``github``: markdown, mean ± std in one cell; each matrix a grid under a ``####`` title.
- ``latex``: one booktabs ``tabular`` per table and per matrix (a ``%`` comment with the matrix's title above
  it), ``$\pm$``, text escaped (``_ % & # $ { } ~ ^ \``), numbers right-aligned.
- ``csv``: exactly one table per output, so that a file is one table a csv reader or a data frame takes whole:
  a mean ± std is two columns ``NAME_mean, NAME_std`` and an interval ``NAME_low, NAME_high``, numbers to 12
  significant digits (rounding is for display), a missing value is an empty field.

Counts (seeds, pairs, queries, classes, task indices) are written as integers in every format.
"""
from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from enum import Enum
from typing import Any

FORMATS = ("github", "csv", "latex")


class Kind(Enum):
    """What the cells of a column hold (:class:`Column`)."""
    TEXT = "text"
    INTEGER = "integer"
    NUMBER = "number"
    SPREAD = "spread"
    INTERVAL = "interval"


@dataclass(frozen=True)
class Column:
    """A table column: ``title`` heads it in github and latex, ``name`` in csv, ``kind`` says what its cells hold
    and ``digits`` how many decimals github and latex show (csv keeps 12 significant digits).

    Cells by kind: TEXT a string; INTEGER an int, or a mean of ints over seeds, written without decimals when
    whole; NUMBER a float; SPREAD ``(mean, std)`` (std None: not shown); INTERVAL ``(low, high)``. None is a
    missing value ("-"; empty in csv); in github and latex a string in any column is written as it is (the blank
    upper triangle of a matrix grid).
    """
    title: str
    name: str
    kind: Kind = Kind.NUMBER
    digits: int = 2

    def csv_names(self) -> list[str]:
        """Its csv header: a spread is two columns ``NAME_mean, NAME_std``, an interval ``NAME_low, NAME_high``."""
        suffixes = {Kind.SPREAD: ("mean", "std"), Kind.INTERVAL: ("low", "high")}.get(self.kind)
        return [f"{self.name}_{suffix}" for suffix in suffixes] if suffixes else [self.name]


@dataclass(frozen=True)
class Table:
    """Rows of values under ``columns``, with an optional ``title`` (a mean matrix's experiment): values, not
    text, so that each format writes them its own way."""
    columns: tuple[Column, ...]
    rows: list[list[Any]]
    title: str = ""


def without_empty_columns(table: Table) -> Table:
    """``table`` without the columns no row has a value in (a figure none of its experiments holds)."""
    keep = [i for i in range(len(table.columns)) if any(row[i] is not None for row in table.rows)]
    return Table(tuple(table.columns[i] for i in keep), [[row[i] for i in keep] for row in table.rows], table.title)


def render(tables: list[Table], fmt: str = "github") -> str:
    r"""``tables`` in ``github`` markdown (mean ± std in one cell, a ``####`` title over a titled table), ``latex``
    (one booktabs ``tabular`` each, preceded by a ``%`` comment with its title: text escaped, $\pm$, numbers
    right-aligned) or ``csv`` (exactly one table, so that a csv stream never mixes tables: a spread and an interval
    are two columns each, numbers to 12 significant digits, a missing value empty); separated by blank lines."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; choose from {list(FORMATS)}")
    if fmt == "csv":
        if len(tables) != 1:
            raise ValueError(f"csv holds one table, not {len(tables)}; render each table to its own output")
        return _csv(tables[0])
    return "\n\n".join(map(_latex if fmt == "latex" else _github, tables))


def _github(table: Table) -> str:
    from tabulate import tabulate

    text = tabulate(_cells(table), headers=[c.title for c in table.columns], tablefmt="github", disable_numparse=True)
    return f"#### {table.title}\n\n{text}" if table.title else text


def _latex(table: Table) -> str:
    from tabulate import tabulate

    text = tabulate(_cells(table), headers=[c.title for c in table.columns], tablefmt="latex_booktabs",
                    disable_numparse=True,
                    colalign=["left" if c.kind == Kind.TEXT else "right" for c in table.columns])
    text = text.replace("±", r"$\pm$")
    return f"% {table.title}\n{text}" if table.title else text


def _cells(table: Table) -> list[list[str]]:
    return [[cell_text(value, column) for value, column in zip(row, table.columns, strict=True)] for row in table.rows]


def cell_text(value: Any, column: Column) -> str:
    """A value as github, latex and the HTML report show it (before latex escaping)."""
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    digits = column.digits
    if column.kind == Kind.SPREAD:
        mean, std = value
        return f"{mean:.{digits}f}" + ("" if std is None else f" ± {std:.{digits}f}")
    if column.kind == Kind.INTERVAL:
        return f"[{value[0]:.{digits}f}, {value[1]:.{digits}f}]"
    if column.kind == Kind.INTEGER and float(value).is_integer():
        return str(int(value))
    return f"{value:.{digits}f}"


def _csv(table: Table) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([name for column in table.columns for name in column.csv_names()])
    writer.writerows([field for value, column in zip(row, table.columns, strict=True)
                      for field in _csv_fields(value, column)] for row in table.rows)
    return out.getvalue().rstrip("\n")


def _csv_fields(value: Any, column: Column) -> list[Any]:
    """A value as csv fields: one per csv name of its column, empty where missing, integers without decimals."""
    if value is None:
        return [""] * len(column.csv_names())
    if column.kind == Kind.TEXT:
        return [value]
    if column.kind in (Kind.SPREAD, Kind.INTERVAL):
        return ["" if v is None else _plain(v) for v in value]
    if column.kind == Kind.INTEGER and float(value).is_integer():
        return [int(value)]
    return [_plain(value)]


def _plain(number: float) -> float:
    """``number`` to 12 significant digits: all a measurement holds, without float noise (57.99999999999999 is 58)."""
    return float(f"{number:.12g}")


def figure_or_na(value: float | None, digits: int = 2) -> str:
    """A figure for a console line: ``digits`` decimals, or ``n/a`` when the run has none (ACA without replacements)."""
    return "n/a" if value is None else f"{value:.{digits}f}"
