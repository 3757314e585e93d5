"""``runner.py list``: what can be run, one line each, and ``runner.py list --markdown KIND``: the tables of
strategies and adapters that README.md and docs/ hold, built from the plug-ins' own class attributes
(``loss_summary``, ``reference``, ``head``; ``directions``, ``fitted_by``), so a page can never describe a method the
code no longer has (``runner.py pages`` rewrites the blocks, :mod:`cl2r_bench.app.pages`)."""
from __future__ import annotations

import argparse
import re
import sys
from dataclasses import asdict

MARKDOWN_TABLES = ("strategies", "recipes", "adapters", "scenarios", "presets", "datasets")
REST_ROLE = re.compile(r":[a-z]+:`(~?)([^`]+)`")
REST_LITERAL = re.compile(r"``([^`]+)``")


def add_list_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--params", action="store_true", help="also each strategy's and adapter's parameters with "
                        "their defaults (set them with --set strategy_params.NAME.KEY=VALUE)")
    parser.add_argument("--markdown", metavar="KIND", choices=MARKDOWN_TABLES, help="print one Markdown table "
                        f"instead, as the documentation holds it (one of: {', '.join(MARKDOWN_TABLES)})")


def command_list(args: argparse.Namespace) -> int:
    """Print the registered scenarios, strategies, adapters, presets and data sets with one line each (the
    profiles' first comment sentence, the parts' first docstring line); ``--params`` adds every scenario's,
    strategy's and adapter's parameters with their defaults (written once, in their ``Config`` dataclasses)."""
    if args.markdown:
        print(markdown_table(args.markdown))
        return 0
    for title, rows in sections(args.params):
        print(f"{title}:")
        for name, text, extra in rows:
            print(f"  {name:<14} {text}" + (f"\n  {'':<14}   {extra}" if extra else ""))
    return 0


def sections(with_params: bool) -> list[tuple[str, list[tuple[str, str, str]]]]:
    """(title, [(name, one line, parameters)]) for each kind of part ``runner.py list`` prints."""
    from cl2r_bench.adapters import get_adapter, list_adapters
    from cl2r_bench.config import choices, profile_summary
    from scenarios import get_scenario, list_scenarios
    from strategies import get_strategy, list_strategies

    def params(cls: type) -> str:
        return ", ".join(f"{k}={v!r}" for k, v in asdict(cls.Config()).items()) if with_params else ""

    strategies = [(n, first_line(sys.modules[get_strategy(n).__module__].__doc__), params(get_strategy(n)))
                  for n in list_strategies()]
    strategies.append(("avalanche:X", "any Avalanche strategy class X (Naive, LwF, EWC, Replay, ...); its constructor "
                       "arguments go in strategy_params", ""))
    adapters = [("none", "no adapter: the models' own features", "")]
    adapters += [(n, first_line(get_adapter(n).__doc__).replace(" (module docstring)", ""), params(get_adapter(n)))
                 for n in list_adapters()]
    scenarios = [(n, first_line(get_scenario(n).__doc__), params(get_scenario(n))) for n in list_scenarios()]
    return [("scenarios (--scenario)", scenarios),
            ("strategies (--strategy)", strategies), ("adapters (--adapter)", adapters),
            ("presets (--preset)", [(n, profile_summary("presets", n), "") for n in choices("presets")]),
            ("data sets (--dataset)", [(n, profile_summary("datasets", n), "") for n in choices("datasets")])]


def markdown_table(kind: str) -> str:
    """The table of ``kind`` (one of :data:`MARKDOWN_TABLES`) in GitHub Markdown."""
    if kind == "strategies":
        header, rows = ["name", "head", "loss", "replay", "old model", "reference"], strategy_rows()
    elif kind == "recipes":
        header = ["name", "optimiser", "lr", "weight decay", "epochs", "schedule", "gradient clip", "source"]
        rows = recipe_rows()
    elif kind == "adapters":
        header, rows = ["`--adapter`", "maps", "how it is fitted", "reference"], adapter_rows()
    else:
        titles = {"scenarios": "`--scenario`", "presets": "`--preset`", "datasets": "`--dataset`"}
        listed = dict((title.split(" ")[0], rows) for title, rows in sections(False))
        header = [titles[kind], "what it is"]
        rows = [[f"`{name}`", escaped(text)] for name, text, _ in listed["data" if kind == "datasets" else kind]]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def strategy_rows() -> list[list[str]]:
    """One row per registered strategy: its head family's words (:data:`cl2r_bench.heads.HEADS`), its
    ``loss_summary``, whether it replays, which frozen models it reads, its ``reference``."""
    from cl2r_bench.heads import HEADS
    from strategies import get_strategy, list_strategies

    rows = []
    for name in list_strategies():
        cls = get_strategy(name)
        old_models = "teacher + independent new model" if cls.needs_independent else (
            "teacher" if cls.needs_teacher else "none")
        rows.append([f"`{name}`", HEADS[cls.head], escaped(cls.loss_summary) or "—",
                     "yes" if cls.uses_memory else "no", old_models, escaped(cls.reference) or "—"])
    return rows


def recipe_rows() -> list[list[str]]:
    """One row per registered strategy: its authors' recipe (``training.recipe: authors``; the run's own settings fill
    what a recipe leaves out) and where it comes from, or "none declared"."""
    from strategies import get_strategy, list_strategies

    rows = []
    for name in list_strategies():
        cls = get_strategy(name)
        recipe = cls.authors_recipe
        if not recipe:
            rows.append([f"`{name}`", "none declared", "—", "—", "—", "—", "—",
                         escaped(cls.authors_recipe_source) or "—"])
            continue
        optimiser = recipe.get("optimizer", "sgd") + (" (Nesterov)" if recipe.get("nesterov") else "")
        rows.append([f"`{name}`", optimiser, f"{recipe.get('lr', '—'):g}", f"{recipe.get('weight_decay', '—'):.3g}",
                     str(recipe.get("epochs", "—")), schedule_words(recipe),
                     f"backbone norm ≤ {recipe['clip_grad_norm']:g}" if recipe.get("clip_grad_norm") else "none",
                     escaped(cls.authors_recipe_source)])
    return rows


def schedule_words(recipe: dict) -> str:
    """A recipe's schedule in words: its warm-up, then cosine (to ``lr_min``, per epoch or iteration), multistep
    (milestones and factor) or poly (power)."""
    schedule = recipe.get("schedule", "cosine")
    if schedule == "multistep":
        words = f"× {recipe.get('gamma', 0.1):g} at epochs {', '.join(map(str, recipe.get('milestones', [])))}"
    elif schedule == "poly":
        words = f"poly, power {recipe.get('power', 2.0):g}, per iteration"
    else:
        words = f"cosine to {recipe.get('lr_min', 0):g} per {recipe.get('schedule_step', 'epoch')}"
    warmup = recipe.get("warmup_epochs", 0)
    return f"{warmup}-epoch warm-up, then {words}" if warmup else words


def adapter_rows() -> list[list[str]]:
    """One row per registered adapter: the maps it offers, its ``fitted_by`` line and its ``reference``."""
    from cl2r_bench.adapters import get_adapter, list_adapters

    rows = []
    for name in list_adapters():
        cls = get_adapter(name)
        rows.append([f"`{name}`", " and ".join(cls.directions), escaped(cls.fitted_by) or "—",
                     escaped(cls.reference) or "—"])
    return rows


def escaped(text: str) -> str:
    """``text`` safe inside a Markdown table cell: pipes escaped, line breaks joined."""
    return " ".join(text.split()).replace("|", "\\|")


def first_line(text: str | None) -> str:
    return plain_text(text.strip().splitlines()[0]) if text and text.strip() else ""


def plain_text(text: str) -> str:
    """A docstring line as plain words: reST roles (``:mod:`strategies.bct```, ``:class:`~a.B```) become their
    target (its last part after ``~``), double back-quoted literals their text."""
    text = REST_ROLE.sub(lambda m: m.group(2).rsplit(".", 1)[-1] if m.group(1) else m.group(2), text)
    return REST_LITERAL.sub(r"\1", text)
