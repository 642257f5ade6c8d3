"""Turn task results into the comparison table: ours beside BestFit, FGD, the floor and the paper.

Everything is mean ± sample sd over seeds of unallocated GPU % (lower is better). Ratios are ours
/ baseline from the same run (same pod sequences, same ranks). "Gap closed" is the share of the
FGD → floor gap that ours removes: (FGD − ours) / (FGD − floor), with FGD and the floor measured in
this run and, in brackets, with the paper's published FGD and floor.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from benchmarks.placement.protocol import Stat, stat
from benchmarks.placement.suite import TaskResult

# Published unallocated GPU % at arrived = 100 % (FGD paper, mean of 10 seeds).
PUBLISHED: dict[str, dict[str, float]] = {
    "default": {"bestfit": 7.14, "fgd": 4.77, "floor": 3.10},
    "gpushare40": {"bestfit": 8.56, "fgd": 6.04, "floor": 4.35},
    "gpushare60": {"bestfit": 10.94, "fgd": 8.75, "floor": 6.65},
    "gpushare80": {"bestfit": 13.34, "fgd": 10.92, "floor": 8.60},
    "gpushare100": {"bestfit": 15.38, "fgd": 13.36, "floor": 10.84},
    "multigpu20": {"bestfit": 6.27, "fgd": 4.47, "floor": 2.66},
    "multigpu30": {"bestfit": 5.43, "fgd": 3.64, "floor": 2.33},
    "multigpu40": {"bestfit": 4.90, "fgd": 3.09, "floor": 2.00},
    "multigpu50": {"bestfit": 4.38, "fgd": 2.91, "floor": 1.66},
}


def _by(results: Iterable[TaskResult], arrived: int) -> dict[str, dict[str, list[float]]]:
    """trace → column → per-seed values (policies by name, plus "floor")."""
    table: dict[str, dict[str, list[float]]] = {}
    for task in results:
        row = table.setdefault(task.trace, {})
        for run in task.runs:
            value = run.curve.unallocated(arrived)
            if value is not None:
                row.setdefault(run.policy, []).append(value)
        row.setdefault("floor", []).append(task.floor100 if arrived == 100 else task.floor130)
    return table


def _gap(fgd: float, ours: float, floor: float) -> str:
    return f"{100.0 * (fgd - ours) / (fgd - floor):4.0f} %" if fgd > floor else "  n/a"


def table(results: Sequence[TaskResult], policies: Sequence[str], arrived: int = 100) -> str:
    """A Markdown table of unallocated GPU % at ``arrived``, one row per trace."""
    data = _by(results, arrived)
    with_floor = arrived == 100  # the floor bounds the paper's metric; past 100 % it tends to 0
    cols = [*policies, "floor"] if with_floor else list(policies)
    head = ["trace", *cols]
    has_fgd = "fgd" in policies and "ours" in policies
    if has_fgd:
        head += [
            "ours/FGD",
            "ours/BestFit" if "bestfit" in policies else "",
            "gap closed (paper)" if with_floor else "",
        ]
    if arrived == 100:
        head += ["paper BestFit", "paper FGD", "paper floor"]
    head = [h for h in head if h]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    order = [t for t in PUBLISHED if t in data] + sorted(t for t in data if t not in PUBLISHED)
    for trace in order:
        row = data[trace]
        stats: dict[str, Stat] = {c: stat(row[c]) for c in cols if row.get(c)}
        cells = [trace] + [str(stats[c]) if c in stats else "–" for c in cols]
        if has_fgd and "fgd" in stats and "ours" in stats:
            ours, fgd = stats["ours"].mean, stats["fgd"].mean
            cells.append(f"{ours / fgd:.3f}")
            if "bestfit" in stats:
                cells.append(f"{ours / stats['bestfit'].mean:.3f}")
            paper = PUBLISHED.get(trace)
            if with_floor:
                closed = _gap(fgd, ours, stats["floor"].mean)
                if paper is not None:
                    closed += f" ({_gap(paper['fgd'], ours, paper['floor']).strip()})"
                cells.append(closed)
        if arrived == 100:
            paper = PUBLISHED.get(trace, {})
            cells += [f"{paper[k]:.2f}" if k in paper else "–" for k in ("bestfit", "fgd", "floor")]
        lines.append("| " + " | ".join(cells) + " |")
    seeds = sorted({t.seed for t in results})
    lines.append("")
    lines.append(f"unallocated GPU % at arrived = {arrived} %, mean ± sd (n−1) over seeds {seeds}")
    return "\n".join(lines)


def timings(results: Sequence[TaskResult]) -> str:
    """Mean replay wall time per run and per submitted pod, by policy."""
    per: dict[str, list[tuple[float, int]]] = {}
    for task in results:
        for run in task.runs:
            per.setdefault(run.policy, []).append((run.seconds, run.pods))
    lines = ["| policy | runs | s per run | ms per pod (whole cluster decision) |", "|---|---|---|---|"]
    for name, items in per.items():
        secs = sum(s for s, _ in items)
        pods = sum(n for _, n in items)
        lines.append(f"| {name} | {len(items)} | {secs / len(items):.1f} | {1000.0 * secs / pods:.2f} |")
    return "\n".join(lines)
