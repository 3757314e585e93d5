"""One self-contained HTML report of a results folder (``runner.py report RESULTS_DIR``).

Per scenario and data set: the leaderboard's tables (:func:`cl2r_bench.reporting.leaderboard.build`: AC / AA / ACA and
the negative
flip rates with mean ± std and seeds, the noise-aware AC, the replacement models' own accuracy, the adapters' cases and
backfilling AUCs, timing), sortable by any column in the page; the settings that tell the experiments apart; each
experiment's mean compatibility matrix as a heatmap; the AC_t / AA_t curves of every experiment in one figure; the
backfilling curves of adapter studies; the published figures of the same scenario, apart and with their source
(:mod:`cl2r_bench.reporting.published`); and links to each run's ``config.yaml`` and ``metrics.json``.

The records are read through the leaderboard's walk (:func:`cl2r_bench.reporting.experiments.collect_with_paths`: bad
files
are returned with their reason, never shown). The page is one file with nothing to fetch at view time: styles,
the sorting script and the figures (PNG, base64) are inline. It is rendered by Jinja2 (``templates/report.html.j2``)
with autoescaping, so a label or a path can never inject markup.
"""
from __future__ import annotations

import base64
import os
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import quote

from benchmarks.record import RunRecord, adapter_study
from cl2r_bench.files import atomic_write_text

from .adapter_recommendation import (
    SUMMARY_COLUMNS,
    AdapterSummary,
    models_verdict,
    ranked,
    recommendation,
    summarise,
    summary_cells,
)
from .cost_figure import deployment_cost_figure
from .deployments import recommended_deployment
from .experiments import (
    collect_with_paths,
    experiment_groups,
    experiment_settings,
    model_specs,
    short_model_name,
    study_groups,
)
from .leaderboard import build, mean_matrices
from .plots import (
    NO_ADAPTER,
    backfilling_curves,
    backfilling_figure,
    backfilling_scale,
    best_curves_figure,
    cross_case_figure,
    curves_figure,
    experiment_series,
    png_bytes,
    viridis,
)
from .published_tables import published_tables
from .stream_verdict import stream_verdict, two_model_verdict
from .tables import Column, Kind, Table, cell_text

REPORT_TABLES = ("main", "intervals", "noise", "replacements", "across", "retrieval", "backfilling", "two_model",
                 "timing")
TABLE_TITLES = {"main": "Leaderboard", "intervals": "95% intervals over seeds (t)", "noise": "Noise-aware AC",
                "replacements": "Replacement models' own accuracy",
                "across": "AC and ACA across replacements", "retrieval": "Retrieval cases (top-1 and mAP, %)",
                "backfilling": "Backfilling AUC, zero-shot change and the adapters' diagnostics",
                "two_model": "Two-model protocol (old/old, new/old, new/new; %)", "timing": "Training time"}
TWO_MODEL_SECTION_TITLES = {
    "main": "Per-task matrix: AC / AA / ACA (the old classes' test images against their training images, not the "
            "two-model answer; METHODS.md §6c)",
    "noise": "Per-task matrix: noise-aware AC (not the two-model answer)"}
"""An ``upgrade`` section opens with its two-model table; the stream tables after it are titled as what they are."""


@dataclass
class HtmlCell:
    """A cell as shown (``text``) and as sorted (``sort``: a number, or the text)."""

    text: str
    sort: str | float
    style: str = ""


@dataclass
class HtmlTable:
    """A table of the page: ``text_columns`` are the indices of its text columns (aligned left)."""

    title: str
    headers: list[str]
    rows: list[list[HtmlCell]]
    kind: str = "measured"  # "measured", "published", "settings" or "matrix"
    text_columns: set[int] = field(default_factory=lambda: {0})


@dataclass
class Figure:
    title: str
    png_base64: str


@dataclass
class RunLink:
    label: str
    config: str | None
    metrics: str


@dataclass
class StudyAnswer:
    """The opening of an adapter study (one data set, one pair of models): its summary table, its recommendation,
    its figures (the cross cases, the backfilling curves), and the models' full specs behind their short names."""

    title: str
    summary: HtmlTable
    recommendation: str
    deployment: str
    figures: list[Figure]
    models: list[tuple[str, str]]


@dataclass
class Section:
    scenario: str
    dataset: str
    anchor: str
    verdict: str = ""
    answers: list[StudyAnswer] = field(default_factory=list)
    tables: list[HtmlTable] = field(default_factory=list)
    settings: HtmlTable | None = None
    matrices: list[HtmlTable] = field(default_factory=list)
    figures: list[Figure] = field(default_factory=list)
    grid: list[Figure] = field(default_factory=list)
    published: list[HtmlTable] = field(default_factory=list)
    runs: list[RunLink] = field(default_factory=list)


GENERATOR = "cl2r-bench runner.py report"
"""The page's ``<meta name="generator">``: how the report knows a file it may write over."""
OWN_MARKS = (GENERATOR.encode(), b"<title>cl2r-bench report: ")
"""What the head of a report this suite wrote holds: the generator, or (reports of earlier versions) the title."""


def overwrite_problem(out: Path) -> str | None:
    """Why the report must not be written to ``out``, or None: it never writes over a file it did not create (a
    run's ``metrics.json``, a page of someone else's), only over a report whose head holds one of
    :data:`OWN_MARKS`."""
    if out.is_dir():
        return f"--out {out} is a folder; give the HTML file to write, e.g. {out / 'report.html'}"
    if not out.exists() and not out.is_symlink():
        return None
    try:
        with out.open("rb") as handle:
            head = handle.read(2048)
    except OSError:
        head = b""
    if out.is_file() and not out.is_symlink() and any(mark in head for mark in OWN_MARKS):
        return None
    return (f"--out {out} exists and is not a report written by runner.py report; the report never writes over a "
            "file it did not create: choose another file")


def write_report(results_dir: str | Path, out: str | Path) -> tuple[Path, int, list[tuple[Path, str]]]:
    """Write the report of ``results_dir`` to ``out`` when it holds a complete run; returns ``(out, runs shown,
    skipped files with reasons)``. Call :func:`overwrite_problem` first."""
    out = Path(out)
    found, skipped = collect_with_paths(results_dir)
    if found:
        atomic_write_text(out, render_report(found, results_dir, out.parent))
    return out, len(found), skipped


def render_report(found: list[tuple[Path, RunRecord]], results_dir: str | Path, links_from: Path) -> str:
    """The page of ``found`` (``(metrics.json path, record)`` pairs); links are relative to ``links_from``, the
    folder the page is written in."""
    import jinja2

    template = resources.files(__package__).joinpath("templates", "report.html.j2").read_text(encoding="utf-8")
    environment = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True,
                                     lstrip_blocks=True)
    sections = [section(scenario, dataset, pairs, links_from) for (scenario, dataset), pairs in by_section(found)]
    return environment.from_string(template).render(results=str(results_dir), sections=sections,
                                                   runs=len(found), generator=GENERATOR)


def by_section(found: list[tuple[Path, RunRecord]]) -> list[tuple[tuple[str, str], list[tuple[Path, RunRecord]]]]:
    """The records grouped by scenario and data set, in sorted order."""
    groups: dict[tuple[str, str], list[tuple[Path, RunRecord]]] = {}
    for path, record in found:
        groups.setdefault((record["scenario"], record["dataset"]), []).append((path, record))
    return sorted(groups.items())


def section(scenario: str, dataset: str, pairs: list[tuple[Path, RunRecord]], links_from: Path) -> Section:
    records = [record for _, record in pairs]
    built = build(records, "github", REPORT_TABLES)
    part = Section(scenario, dataset, anchor=f"{scenario}-{dataset}".replace(" ", "-"))
    stream = [r for r in records if not adapter_study(r)]
    part.verdict = two_model_verdict(stream) or stream_verdict(stream)
    part.answers = study_answers(dataset, [r for r in records if adapter_study(r)])
    two_model = bool(stream) and all("two_model" in r for r in stream)
    titles = {**TABLE_TITLES, **(TWO_MODEL_SECTION_TITLES if two_model else {})}
    order = sorted(built, key=lambda name: name != "two_model") if two_model else list(built)
    part.tables = [html_table(titles[name], table, hidden=SECTION_COLUMNS) for name in order
                   for table in built[name]]
    part.settings = settings_table(records)
    part.matrices = [heat_table(grid) for grid in mean_matrices([r for r in records if not adapter_study(r)])]
    part.figures = figures(scenario, dataset, records)
    part.grid = backfilling_grid(dataset, records)
    part.published = [html_table(table.title, table, "published") for table in published_tables(records)]
    labels = {id(r): label for (_, _, label), runs in experiment_groups(records).items() for r in runs}
    part.runs = [run_link(path, labels[id(record)], record, links_from)
                 for path, record in sorted(pairs, key=lambda pair: (labels[id(pair[1])], pair[1]["seed"]))]
    return part


def study_answers(dataset: str, records: list[RunRecord]) -> list[StudyAnswer]:
    """One :class:`StudyAnswer` per pair of models among a section's leave-one-out records
    (:mod:`cl2r_bench.reporting.adapter_recommendation`)."""
    answers = []
    for label, runs in study_groups(records).items():
        rows, verdict = ranked(summarise(runs)), models_verdict(runs)
        cells = [[HtmlCell(text, sort) for text, sort in zip(summary_cells(row), summary_sort_keys(row), strict=True)]
                 for row in rows]
        old, new = model_specs(runs[0])
        title = f"{label} · {dataset}"
        baseline = runs[0]["retrieval"]["cases"]["old/old"]["top1"]
        drawn = [Figure(f"{title}: cross case against old/old",
                        encode(png_bytes(cross_case_figure, title, rows, baseline))),
                 Figure(f"{title}: each adapter's backfilling in its best order",
                        encode(png_bytes(best_curves_figure, title, rows, runs, baseline)))]
        if "new/new" in runs[0]["retrieval"]["cases"]:
            drawn.append(Figure(f"{title}: every deployment against what it costs",
                                encode(png_bytes(deployment_cost_figure, title, rows, runs))))
        answers.append(StudyAnswer(
            title, HtmlTable(f"The answer: {title}", list(SUMMARY_COLUMNS), cells, "summary",
                      {SUMMARY_COLUMNS.index(title) for title in ("adapter", "compatible", "cross case")}),
            recommendation(rows, verdict), recommended_deployment(rows, runs, verdict), drawn,
            [] if old is None else [(short_model_name(old), old), (short_model_name(new), new)]))
    return answers


def summary_sort_keys(row: AdapterSummary) -> list[str | float]:
    """How the summary's cells sort: numbers by value, a missing one last."""
    def number(value: float | None) -> str | float:
        return "" if value is None else float(value)

    return [row.adapter, row.compatible, number(row.top1_gain), number(row.negative_flips), number(row.reembed_share),
            row.cross_case or "",
            number(row.mAP_gain), number(row.backfill_auc), float(row.seeds), row.fit_seconds, str(row.converged)]


SECTION_COLUMNS = ("scenario", "dataset")
"""Columns a section's own tables leave out: the section's heading names them (published rows keep theirs)."""


def html_table(title: str, table: Table, kind: str = "measured", hidden: tuple[str, ...] = ()) -> HtmlTable:
    """The page's table of a leaderboard table, without the columns titled in ``hidden``."""
    shown = [i for i, c in enumerate(table.columns) if c.title not in hidden]
    columns = [table.columns[i] for i in shown]
    return HtmlTable(title, [c.title for c in columns],
                     [[html_cell(row[i], table.columns[i]) for i in shown] for row in table.rows],
                     kind, {n for n, c in enumerate(columns) if c.kind == Kind.TEXT})


def html_cell(value: Any, column: Column) -> HtmlCell:
    """A leaderboard cell: its text as the leaderboard writes it; it sorts by its mean (a spread), its lower end
    (an interval) or its number; a missing value sorts last."""
    text = cell_text(value, column)
    if value is None or isinstance(value, str):
        return HtmlCell(text, "" if value is None else value)
    number = value[0] if column.kind in (Kind.SPREAD, Kind.INTERVAL) else value
    return HtmlCell(text, float(number))


def settings_table(records: list[RunRecord]) -> HtmlTable | None:
    """The settings whose values differ between the experiments of a section (None when there is one
    experiment, or none differ)."""
    groups = experiment_groups(records)
    if len(groups) < 2:
        return None
    settings = {label: experiment_settings(runs[0]) for (_, _, label), runs in groups.items()}
    keys = sorted(set().union(*settings.values()))
    differing = [k for k in keys if len({repr(s.get(k)) for s in settings.values()}) > 1]
    if not differing:
        return None
    rows = [[HtmlCell(label, label), *(HtmlCell(str(s.get(k, "-")), str(s.get(k, ""))) for k in differing)]
            for label, s in settings.items()]
    return HtmlTable("Settings that tell the experiments apart", ["experiment", *differing], rows, "settings",
                     set(range(len(differing) + 1)))


def heat_table(grid: Table) -> HtmlTable:
    """A mean compatibility matrix (:func:`cl2r_bench.reporting.leaderboard.mean_matrices`) with each entry's cell
    coloured
    on a viridis-like scale between the matrix's lowest and highest mean."""
    means = [value[0] for row in grid.rows for value in row[1:] if isinstance(value, tuple)]
    low, high = min(means), max(means)
    rows = []
    for row in grid.rows:
        cells = [HtmlCell(row[0], row[0])]
        for value, column in zip(row[1:], grid.columns[1:], strict=True):
            if not isinstance(value, tuple):
                cells.append(HtmlCell("", ""))
                continue
            share = 0.5 if high == low else (value[0] - low) / (high - low)
            red, green, blue = viridis(share)
            ink = "#000" if share > 0.55 else "#fff"
            cells.append(HtmlCell(cell_text(value, column), float(value[0]),
                                  f"background: rgb({red}, {green}, {blue}); color: {ink}"))
        rows.append(cells)
    return HtmlTable(grid.title, [c.title for c in grid.columns], rows, "matrix")


def figures(scenario: str, dataset: str, records: list[RunRecord]) -> list[Figure]:
    """The AC_t / AA_t curves of every stream experiment in one figure."""
    stream = [r for r in records if not adapter_study(r)]
    if not stream:
        return []
    series = experiment_series(experiment_groups(stream))[(scenario, dataset)]
    return [Figure("AC_t and AA_t of every experiment", encode(png_bytes(curves_figure, scenario, dataset, series)))]


def backfilling_grid(dataset: str, records: list[RunRecord]) -> list[Figure]:
    """The backfilling curves of each adapter experiment that has them, every order, on one top-1 scale per study
    (:func:`cl2r_bench.reporting.experiments.study_groups`; :func:`cl2r_bench.reporting.plots.backfilling_scale`,
    without the no-adapter curve), for the page's grid."""
    studies: dict[str, dict[str, list[RunRecord]]] = {}
    for study, runs in study_groups([r for r in records if adapter_study(r)]).items():
        for (_, _, label), experiment in experiment_groups(runs).items():
            drawn = [r for r in experiment if backfilling_curves(r)[1]]
            if drawn:
                studies.setdefault(study, {})[label] = drawn
    out = []
    for study, experiments in studies.items():
        curves = {label: [c for r in runs for c in backfilling_curves(r)[1].values()]
                  for label, runs in experiments.items()}
        adapters = [c for label, runs in experiments.items() if runs[0]["method"] != NO_ADAPTER for c in curves[label]]
        scale = backfilling_scale(adapters or [c for cs in curves.values() for c in cs])
        for label, runs in experiments.items():
            title = f"{label} · {study} · {dataset} ({len(runs)} seed{'s' * (len(runs) > 1)})"
            out.append(Figure(f"Backfilling: {title}", encode(png_bytes(backfilling_figure, title, runs, scale))))
    return out


def encode(png: bytes) -> str:
    return base64.b64encode(png).decode("ascii")


def run_link(path: Path, experiment: str, record: RunRecord, links_from: Path) -> RunLink:
    config = path.parent / "config.yaml"
    return RunLink(f"{experiment} · seed {record['seed']}", relative(config, links_from) if config.is_file() else None,
                   relative(path, links_from))


def relative(path: Path, start: Path) -> str:
    """``path`` as a link from a page in ``start``: a relative path with forward slashes, percent-encoded and
    starting with ``./`` or ``../``, so no folder name (``javascript:...``, ``https:...``) can read as a URL
    scheme."""
    link = quote(Path(os.path.relpath(path.resolve(), start.resolve())).as_posix(), safe="/")
    return link if link.startswith("../") else f"./{link}"
