"""Benchmark scores over training: ``eval.png`` and its section of ``summary.md``.

Where ``eval.every`` is set, every ``eval.every`` steps the driver adds to that step's row of
``metrics.jsonl`` (``evaluation.training``) the greedy pass@1 of each member on each benchmark,
``eval/<benchmark>/<member>``, with ``eval/<benchmark>/base`` (the frozen base) and
``eval/<benchmark>/population_mean``. From those rows, per benchmark:

- each member's score at every evaluated step it was alive at: a member replaced by evolution ends its
  line (an x on its last point); a child's line starts with a dashed link from its parent's score at the
  last evaluated step before the child's first (the parent from the evolution event, else the member's
  ``parent`` field);
- the population mean (the logged ``population_mean``; the members' mean where a row lacks it);
- the weakest member: at each evaluated step the member with the lowest mean over that step's
  benchmarks (as ``results.md`` of ``python -m evaluation`` picks it), and its score on this benchmark;
- the base, and a compared run's population mean (a single agent: its agent's score), the paper's figure.

Pure reading of the rows (no evaluation, no Ray); matplotlib is imported only to draw.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

Rows = list[dict[str, Any]]
Point = tuple[int, float]

PREFIX = "eval/"
BASE = "base"
MEAN = "population_mean"


@dataclass
class Lineage:
    """Who each member came from and when it was replaced (from the rows' evolution events and members)."""

    parent: dict[str, str] = field(default_factory=dict)
    operator: dict[str, str] = field(default_factory=dict)
    born: dict[str, int] = field(default_factory=dict)
    replaced: dict[str, int] = field(default_factory=dict)
    role: dict[str, str] = field(default_factory=dict)


@dataclass
class BenchmarkSeries:
    """One benchmark's scores (fractions in [0, 1]) at the evaluated steps of one run."""

    name: str
    members: dict[str, list[Point]] = field(default_factory=dict)
    mean: list[Point] = field(default_factory=list)
    base: list[Point] = field(default_factory=list)
    weakest: list[tuple[int, float, str]] = field(default_factory=list)

    @property
    def steps(self) -> list[int]:
        return [s for s, _ in self.mean]


def lineage(rows: Rows) -> Lineage:
    """Parents, operators, birth and replacement steps, roles: evolution events first, the members' own
    ``parent`` field where a child has no event."""
    out = Lineage()
    for row in rows:
        for event in row.get("evolution", []) or []:
            child = event.get("child", event.get("id"))
            if child is None:
                continue
            if event.get("parents"):
                out.parent[child] = event["parents"][0]
            out.operator[child] = event.get("operator", "?")
            out.born[child] = int(event.get("step", row["step"]))
            victim = event.get("replaced", event.get("victim"))
            if victim is not None:
                out.replaced[victim] = int(event.get("step", row["step"]))
        for member in row.get("members", []) or []:
            out.role.setdefault(member["id"], member.get("role", "?"))
            parent = member.get("parent")
            if parent and member["id"] not in out.parent:
                out.parent[member["id"]] = parent[0] if isinstance(parent, list) else parent
    return out


def benchmarks(rows: Rows) -> list[str]:
    """The benchmarks a run evaluated, in order of first appearance."""
    names: dict[str, None] = {}
    for row in rows:
        for key in row:
            if key.startswith(PREFIX) and key.count("/") == 2:
                names.setdefault(key.split("/")[1], None)
    return list(names)


def eval_series(rows: Rows) -> dict[str, BenchmarkSeries]:
    """Benchmark -> its series over the rows that hold ``eval/`` scores (module docstring)."""
    names = benchmarks(rows)
    out = {name: BenchmarkSeries(name) for name in names}
    for row in sorted(rows, key=lambda r: r["step"]):
        step = row["step"]
        per_member: dict[str, dict[str, float]] = {}
        for name in names:
            scores = {key.split("/")[2]: float(value) for key, value in row.items()
                      if key.startswith(f"{PREFIX}{name}/") and isinstance(value, (int, float))}
            members = {m: v for m, v in scores.items() if m not in (BASE, MEAN)}
            if not members:
                continue
            series = out[name]
            for member, value in members.items():
                series.members.setdefault(member, []).append((step, value))
                per_member.setdefault(member, {})[name] = value
            series.mean.append((step, scores.get(MEAN, sum(members.values()) / len(members))))
            if BASE in scores:
                series.base.append((step, scores[BASE]))
        if per_member:
            weakest = min(sorted(per_member), key=lambda m: sum(per_member[m].values()) / len(per_member[m]))
            for name, value in per_member[weakest].items():
                out[name].weakest.append((step, value, weakest))
    return {name: series for name, series in out.items() if series.mean}


def has_eval(rows: Rows) -> bool:
    return bool(eval_series(rows))


ROLE_SHADES = {"teacher": "Blues", "student": "Greens", "agent": "Greys"}
"""Members are drawn in shades of their role's colour map (the aggregates in black, red, gray, purple)."""


def _shade(member: str, role: str | None, shades: dict[str, list[str]]) -> Any:
    import matplotlib

    if role not in shades:
        return "tab:brown"
    same = shades[role]
    return matplotlib.colormaps[ROLE_SHADES[role]](0.4 + 0.5 * same.index(member) / max(1, len(same) - 1))


def _point_before(points: list[Point], step: int) -> Point | None:
    earlier = [p for p in points if p[0] < step]
    return earlier[-1] if earlier else None


def plot_eval(runs: list[tuple[str, Rows]], out: Path) -> Path:
    """``eval.png``: one panel per benchmark, score (%) against the training step (module docstring);
    ``runs[0]`` is drawn in full, every other run as the mean over its members. ``runs``: (label, rows)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    first_name, first_rows = runs[0]
    per_run = [(label, eval_series(rows)) for label, rows in runs]
    names = list(dict.fromkeys(n for _, series in per_run for n in series))
    tree = lineage(first_rows)
    columns = min(3, len(names))
    rows_n = -(-len(names) // columns)
    fig, axes = plt.subplots(rows_n, columns, figsize=(6.2 * columns, 4.4 * rows_n), squeeze=False)
    last_step = max(rows[-1]["step"] for _, rows in runs)
    for ax, name in zip(axes.flat, names):
        series = per_run[0][1].get(name)
        if series is not None:
            order = sorted(series.members, key=lambda m: (series.members[m][0][0], m))
            shades = {role: [m for m in order if tree.role.get(m) == role] for role in ROLE_SHADES}
            for member in order:
                points = series.members[member]
                color = _shade(member, tree.role.get(member), shades)
                ax.plot([s for s, _ in points], [100 * v for _, v in points], "o-", color=color, linewidth=1,
                        markersize=3, alpha=0.65, label=member)
                parent = tree.parent.get(member)
                link = _point_before(series.members.get(parent, []), points[0][0]) if parent else None
                if link is not None:
                    ax.plot([link[0], points[0][0]], [100 * link[1], 100 * points[0][1]], "--", color=color,
                            linewidth=1, alpha=0.65)
                if points[-1][0] < series.steps[-1] or member in tree.replaced:
                    ax.plot([points[-1][0]], [100 * points[-1][1]], "x", color=color, markersize=8, mew=2)
            ax.plot(series.steps, [100 * v for _, v in series.mean], "o-", color="black", linewidth=2.6,
                    label="population mean")
            ax.plot([s for s, _, _ in series.weakest], [100 * v for _, v, _ in series.weakest], "s--", color="tab:red",
                    linewidth=2, markersize=4, label="weakest member (lowest mean over the benchmarks)")
            if series.base:
                ax.plot([s for s, _ in series.base], [100 * v for _, v in series.base], ":", color="gray",
                        linewidth=2, label="base")
        for (label, other), color in zip(per_run[1:], ("tab:purple", "tab:orange", "tab:pink")):
            if name in other:
                ax.plot(other[name].steps, [100 * v for _, v in other[name].mean], "D-", color=color, linewidth=2.4,
                        markersize=4, label=label)
        ax.set(title=name, xlabel="training step", ylabel="pass@1 (%)", ylim=(-3, 103), xlim=(0, last_step + 1))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left", ncol=2)
    for ax in list(axes.flat)[len(names):]:
        ax.axis("off")
    fig.suptitle(f"{first_name}: benchmark scores over training (teachers blue, students green; "
                 "x: replaced by evolution; thin dashed: a child from its parent)")
    fig.tight_layout()
    path = out / "eval.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _pct(value: float) -> str:
    return f"{100 * value:.1f}"


def _score_row(benchmark: str, model: str, points: list[Point], note: str) -> str:
    """last, its step, best, its step (the earliest best), the evaluated steps, a note."""
    last_step, last = points[-1]
    best_step, best = max(points, key=lambda p: (p[1], -p[0]))
    steps = f"{points[0][0]}-{last_step} ({len(points)})" if len(points) > 1 else str(last_step)
    return f"| {benchmark} | {model} | {_pct(last)} | {last_step} | {_pct(best)} | {best_step} | {steps} | {note} |"


def _member_note(member: str, tree: Lineage, points: list[Point], final: int) -> str:
    parts = []
    if member in tree.parent:
        born = f" at step {tree.born[member]}" if member in tree.born else ""
        operator = f" ({tree.operator[member]})" if member in tree.operator else ""
        parts.append(f"child of {tree.parent[member]}{operator}{born}")
    if member in tree.replaced:
        parts.append(f"replaced at step {tree.replaced[member]}")
    elif points[-1][0] == final:
        parts.append("live at the end")
    else:
        parts.append(f"last evaluated at step {points[-1][0]}")
    return "; ".join(parts)


def summary_section(runs: list[tuple[str, Rows]]) -> list[str]:
    """The lines of ``summary.md``'s ``eval.png`` section (none where no run has ``eval/`` scores): per
    benchmark and model the last score and the step it is from, the best and its step, the steps.
    ``runs``: (label, rows), the first run in full, the others as the mean over their members."""
    per_run = [(label, eval_series(rows)) for label, rows in runs]
    if not any(series for _, series in per_run):
        return []
    tree = lineage(runs[0][1])
    lines = ["## eval.png: benchmark scores over training", "",
             "Greedy pass@1 in %, from the `eval/<benchmark>/<member>` entries of the rows of metrics.jsonl "
             "(`eval.every`); every number with the training step it was measured at (best: the earliest step "
             "of the highest score). weakest member: at each evaluated step the member with the lowest mean over "
             "that step's benchmarks (as results.md picks it), named at its last step. Members replaced by "
             "evolution end their line in eval.png.", "",
             "| benchmark | model | last | last at step | best | best at step | evaluated steps | note |",
             "|" + "---|" * 8]
    for index, (label, series_of) in enumerate(per_run):
        for name, series in series_of.items():
            if index:  # a compared run: its mean over its members (a single agent: the agent)
                lines.append(_score_row(name, f"{label}: mean", series.mean, f"{len(series.members)} member(s) evaluated"))
                continue
            lines.append(_score_row(name, "population mean", series.mean, f"{len(series.members)} members evaluated"))
            weakest = [(s, v) for s, v, _ in series.weakest]
            lines.append(_score_row(name, "weakest member", weakest, f"{series.weakest[-1][2]} at step {series.weakest[-1][0]}"))
            if series.base:
                lines.append(_score_row(name, "base", series.base, "the frozen base model"))
            final = series.steps[-1]
            order = sorted(series.members, key=lambda m: (series.members[m][0][0], m))
            for member in order:
                points = series.members[member]
                lines.append(_score_row(name, member, points, _member_note(member, tree, points, final)))
    return lines
