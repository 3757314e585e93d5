"""Per-run table of an ``upgrade`` zoo: one row per strategy and seed, read from the committed ``metrics.json``.

    python -m tools.page_upgrade_quick results/zoo/upgrade_tinyimagenet_quick

The leaderboard's ``two_model`` and ``intervals`` tables give the mean, std and t-interval over seeds; this table
shows each run (``two_model`` of the record, top-1 in percent over its n queries) with the query noise of that run:

- ``± SE``: the binomial standard error of a top-1 p at n queries, sqrt(p (1 - p) / n);
- ``new/old − old/old``: the paired difference on the same queries, from the per-query hits
  (``two_model.query_top1``), with its paired SE (the discordant queries) and z = difference / SE.

Strategies whose records hold the same two-model figures and hits on every seed are one row group, named
``a = b`` as the leaderboard names them. Groups are ordered by their mean new/old top-1, best first.
"""
from __future__ import annotations

import json
import math
import sys
from collections import defaultdict

from tabulate import tabulate

from benchmarks.record.cases import unpack_hits
from cl2r_bench.reporting.experiments import collect

HEADERS = ["strategy", "seed", "old/old top-1", "new/old top-1 (± SE)", "new/old − old/old (paired SE, z)",
           "new/old top-5", "new/old mAP", "new/new top-1 (± SE)", "NFR self (%)", "NFR cross (%)"]


def se(percent: float, queries: int) -> float:
    """Binomial standard error, in points, of a top-1 of ``percent`` over ``queries`` queries."""
    p = percent / 100
    return 100 * math.sqrt(p * (1 - p) / queries)


def paired(two_model: dict) -> str:
    """new/old − old/old on the same queries, its paired SE and z, from the per-query hits."""
    n = two_model["queries"]
    old = unpack_hits(two_model["query_top1"]["old/old"], n)
    cross = unpack_hits(two_model["query_top1"]["new/old"], n)
    lost, gained = int((old & ~cross).sum()), int((~old & cross).sum())
    diff = (gained - lost) / n
    sd = math.sqrt(max(gained + lost - (gained - lost) ** 2 / n, 0)) / n
    z = f"{diff / sd:.1f}" if sd else "-"
    return f"{100 * diff:+.2f} ({100 * sd:.2f}, z={z})".replace("-", "−")


def row(name: str, seed: int, two_model: dict) -> list[str]:
    cases, n, flips = two_model["cases"], two_model["queries"], two_model["negative_flips"]
    old, cross, new = cases["old/old"], cases["new/old"], cases["new/new"]
    return [name, str(seed), f"{old['top1']:.2f}", f"{cross['top1']:.2f} ± {se(cross['top1'], n):.2f}",
            paired(two_model),
            f"{cross['top5']:.2f}", f"{cross['mAP']:.2f}", f"{new['top1']:.2f} ± {se(new['top1'], n):.2f}",
            f"{100 * flips['mean_self']:.2f}", f"{100 * flips['mean_cross']:.2f}"]


def fingerprint(two_model: dict) -> str:
    """What two runs must share to be the same measurement: their cases, flips and per-query hits."""
    return json.dumps({k: two_model[k] for k in ("cases", "negative_flips", "query_top1", "queries")}, sort_keys=True)


def main(root: str) -> None:
    records, _ = collect(root)
    runs: dict[str, dict[int, dict]] = defaultdict(dict)
    for record in records:
        if record.get("scenario") == "upgrade" and "two_model" in record:
            runs[record["strategy"]][int(record["seed"])] = record["two_model"]
    if not runs:
        raise SystemExit(f"no complete upgrade record with two_model under {root}")
    same: dict[str, list[str]] = defaultdict(list)
    for strategy in sorted(runs):
        key = json.dumps({seed: fingerprint(t) for seed, t in sorted(runs[strategy].items())})
        same[key].append(strategy)
    groups = [(" = ".join(names), runs[names[0]]) for names in same.values()]
    mean = {name: sum(t["cases"]["new/old"]["top1"] for t in seeds.values()) / len(seeds) for name, seeds in groups}
    groups.sort(key=lambda group: (-round(mean[group[0]], 6), group[0]))
    rows = [row(name, seed, seeds[seed]) for name, seeds in groups for seed in sorted(seeds)]
    print(tabulate(rows, HEADERS, tablefmt="github", disable_numparse=True))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__.splitlines()[2].strip())
    main(sys.argv[1])
