"""The suite's import graph in numbers (docs/layout.md): rooms, layers, imports between rooms, imports that run back
up a layer, circles, and the largest files, read from the code's own import statements (function-level ones too)
and the layers contract of ``pyproject.toml``; at the working tree, or at a commit with ``--at``.

    python -m tools.import_graph [--at COMMIT]

A room is one entry of the layers contract (a module or a folder, the parts on one line with ``|`` each their own
room); an import between rooms is counted once per pair of rooms. ``lint-imports`` checks the same contract; this
script counts it.
"""
from __future__ import annotations

import argparse
import ast
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("cl2r_bench", "scenarios", "strategies", "benchmarks")


def read(path: str, commit: str | None) -> str:
    """The text of ``path`` (from the repository's root) in the working tree or at ``commit``."""
    if commit is None:
        return (ROOT / path).read_text(encoding="utf-8")
    return subprocess.run(["git", "show", f"{commit}:{path}"], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout


def python_files(commit: str | None) -> list[str]:
    """The package sources (not tools/ or tests/), as paths from the root."""
    listed = subprocess.run(["git", "ls-tree", "-r", "--name-only", commit] if commit else ["git", "ls-files"],
                            cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    present = listed if commit else [p for p in listed if (ROOT / p).exists()]
    return [p for p in present if p.endswith(".py") and p.split("/")[0] in PACKAGES]


def layers(commit: str | None) -> list[list[str]]:
    """The layers contract: each layer's rooms, top first (the ``layers = [...]`` list after ``type = "layers"``; read
    by pattern, as Python 3.10 has no TOML reader)."""
    text = read("pyproject.toml", commit)
    listed = re.search(r'type = "layers"\s*\nlayers = \[(.*?)\n\]', text, re.S).group(1)
    return [[room.strip() for room in layer.split("|")] for layer in re.findall(r'"([^"]+)"', listed)]


def module_name(path: str) -> str:
    parts = path[:-3].split("/")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: str, source: str) -> set[str]:
    """Every module ``source`` imports (absolute names; relative imports resolved against ``path``)."""
    package = module_name(path).split(".") if path.endswith("__init__.py") else module_name(path).split(".")[:-1]
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def room_of(module: str, rooms: list[str]) -> str | None:
    """The room holding ``module``: the longest room name that is it or a package above it."""
    owners = [room for room in rooms if module == room or module.startswith(room + ".")]
    return max(owners, key=len) if owners else None


def circles(edges: set[tuple[str, str]]) -> list[list[str]]:
    """The strongly connected groups of more than one room (Tarjan)."""
    graph, index, low, stack, on_stack, found = defaultdict(list), {}, {}, [], set(), []
    for a, b in edges:
        graph[a].append(b)

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                group.append(top)
                if top == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in list(graph):
        if node not in index:
            visit(node)
    return found


def measure(commit: str | None) -> dict:
    """The counts of the graph at ``commit`` (None: the working tree)."""
    structure = layers(commit)
    level = {room: len(structure) - i for i, layer in enumerate(structure) for room in layer}
    files, edges, lines = python_files(commit), set(), {}
    for path in files:
        source = read(path, commit)
        lines[path] = source.count("\n")
        here = room_of(module_name(path), list(level))
        for name in imported(path, source):
            there = room_of(name, list(level))
            if here and there and here != there:
                edges.add((here, there))
    upward = sorted((a, b) for a, b in edges if level[a] < level[b])
    return {"files": len(files), "lines": sum(lines.values()), "rooms": len(level), "layers": len(structure),
            "imports between rooms": len(edges), "imports running back up": len(upward),
            "circles": len(circles(edges)), "largest file": max(lines.items(), key=lambda kv: kv[1])}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--at", metavar="COMMIT", help="measure the code at this commit instead of the working tree")
    args = parser.parse_args(argv)
    counts = measure(args.at)
    path, size = counts.pop("largest file")
    print("| measure | value |\n|---|---|")
    for name, value in counts.items():
        print(f"| {name} | {value:,} |")
    print(f"| largest file | {path} ({size:,} lines) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
