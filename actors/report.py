"""Plots of a run (or a comparison of two) from its ``metrics.jsonl``.

    python -m actors.report RUN_DIR                 # plots into RUN_DIR/plots/
    python -m actors.report POP_RUN SINGLE_RUN      # also compare.png in the first run's plots/

Figures: rating trajectories per member (mu with a +-sigma band and each sub-population's mean mu, beside
mu relative to the sub-population mean), valid and solve rates, program
complexity over steps (the paper's collapse-vs-expansion evidence: AST depth, cyclomatic complexity,
lines, variables), coverage, and the lineage of evolved members.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COMPLEXITY = ("program_ast_depth", "program_cyclomatic", "program_loc", "program_variables")


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist (is {run_dir} a run directory?)")
    rows = []
    for line in path.read_text().splitlines():
        if line.strip():
            rows.append(json.loads(line))
    rows = [r for r in rows if "step" in r]  # event records (a recovery) sit between the step rows
    if not rows:
        raise ValueError(f"{path} holds no steps yet")
    return rows


def _series(rows: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    pairs = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float))]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def sub_population_means(rows: list[dict[str, Any]]) -> dict[str, list[tuple[int, float]]]:
    """Role -> (step, mean mu of that role's members at that step): games between a teacher and a student
    conserve the sum of their mus, and replacement (``evolution.replacement``) keeps each role's mean, so
    these lines move only through draws' asymmetries and the ratings' dynamics, not through evolution."""
    means: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for row in rows:
        by_role: dict[str, list[float]] = defaultdict(list)
        for m in row.get("members", []):
            by_role[m["role"]].append(m["mu"])
        for role, mus in sorted(by_role.items()):
            means[role].append((row["step"], sum(mus) / len(mus)))
    return dict(means)


def relative_ratings(rows: list[dict[str, Any]]) -> dict[str, list[tuple[int, float, str]]]:
    """Member -> (step, mu minus its sub-population's mean mu at that step, role)."""
    means = {role: dict(points) for role, points in sub_population_means(rows).items()}
    out: dict[str, list[tuple[int, float, str]]] = defaultdict(list)
    for row in rows:
        for m in row.get("members", []):
            out[m["id"]].append((row["step"], m["mu"] - means[m["role"]][row["step"]], m["role"]))
    return dict(out)


def plot_ratings(rows: list[dict[str, Any]], out: Path) -> Path:
    """Raw mu (+-sigma band, with each sub-population's mean mu in black) beside mu relative to the
    sub-population mean (what matching, culling and parent selection inside a sub-population see)."""
    trajectories: dict[str, list[tuple[int, float, float, str]]] = defaultdict(list)
    for row in rows:
        for m in row.get("members", []):
            trajectories[m["id"]].append((row["step"], m["mu"], m["sigma"], m["role"]))
    relative = relative_ratings(rows)
    fig, (raw, rel) = plt.subplots(1, 2, figsize=(14, 4.5))
    for member, points in sorted(trajectories.items()):
        steps = [p[0] for p in points]
        mu = [p[1] for p in points]
        sigma = [p[2] for p in points]
        style = "-" if points[0][3] == "teacher" else "--"
        (line,) = raw.plot(steps, mu, style, label=member)
        raw.fill_between(steps, [a - b for a, b in zip(mu, sigma)], [a + b for a, b in zip(mu, sigma)],
                         color=line.get_color(), alpha=0.1)
        rel.plot([p[0] for p in relative[member]], [p[1] for p in relative[member]], style, color=line.get_color(), label=member)
    for role, points in sub_population_means(rows).items():
        raw.plot([p[0] for p in points], [p[1] for p in points], "-" if role == "teacher" else "--", color="black",
                 linewidth=2.5, label=f"mean ({role}s)")
    raw.set(xlabel="step", ylabel="TrueSkill mu (band: +-sigma)", title="Ratings per member (solid: teachers; black: role means)")
    rel.axhline(0.0, color="black", linewidth=1)
    rel.set(xlabel="step", ylabel="mu - mean mu of its sub-population", title="Ratings relative to the sub-population mean")
    raw.legend(fontsize=7, ncol=2)
    return _save(fig, out / "ratings.png")


def plot_rates(rows: list[dict[str, Any]], out: Path) -> Path:
    fig, ax = plt.subplots(figsize=(8, 4))
    for key in ("valid_rate", "solve_rate"):
        ax.plot(*_series(rows, key), label=key)
    ax.set(xlabel="step", ylabel="rate", ylim=(-0.02, 1.02), title="Valid proposals and student solve rate")
    ax.legend()
    return _save(fig, out / "rates.png")


def plot_complexity(rows: list[dict[str, Any]], out: Path) -> Path:
    fig, axes = plt.subplots(1, len(COMPLEXITY), figsize=(14, 3.5))
    for ax, key in zip(axes, COMPLEXITY):
        ax.plot(*_series(rows, key))
        ax.set(xlabel="step", title=key.removeprefix("program_"))
    fig.suptitle("Complexity of valid proposed programs")
    return _save(fig, out / "complexity.png")


def plot_coverage(rows: list[dict[str, Any]], out: Path) -> Path:
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.plot(*_series(rows, "coverage"))
    ax.set(xlabel="step", ylabel="distinct AST n-grams seen", title="Problem-space coverage")
    return _save(fig, out / "coverage.png")


def plot_lineage(rows: list[dict[str, Any]], out: Path) -> Path:
    """Members on the y axis, birth step on x; an arrow from each parent to its child."""
    born: dict[str, int] = {}
    events = [e for r in rows for e in r.get("evolution", [])]
    for row in rows:
        for m in row.get("members", []):
            born.setdefault(m["id"], row["step"] if m.get("parent") else 0)
    order = {member: i for i, member in enumerate(sorted(born, key=lambda k: (born[k], k)))}
    fig, ax = plt.subplots(figsize=(8, max(3, 0.35 * len(order))))
    for member, y in order.items():
        ax.plot([born[member]], [y], "o")
        ax.annotate(member, (born[member], y), fontsize=7, xytext=(4, 2), textcoords="offset points")
    for e in events:
        for parent in e.get("parents", []):
            if parent in order and e["child"] in order:
                ax.annotate("", (born[e["child"]], order[e["child"]]), (born[parent], order[parent]),
                            arrowprops={"arrowstyle": "->", "alpha": 0.6})
        ax.annotate(e.get("operator", ""), (born.get(e["child"], e["step"]), order.get(e["child"], 0)),
                    fontsize=6, xytext=(4, -8), textcoords="offset points", color="gray")
    ax.set(xlabel="step born", yticks=[], title=f"Lineage ({len(events)} evolution events)")
    return _save(fig, out / "lineage.png")


def plot_comparison(runs: list[tuple[str, list[dict[str, Any]]]], out: Path) -> Path:
    keys = ("solve_rate", "valid_rate", "program_ast_depth", "program_loc", "coverage", "student_reward")
    fig, axes = plt.subplots(2, 3, figsize=(14, 7))
    for ax, key in zip(axes.flat, keys):
        for label, rows in runs:
            ax.plot(*_series(rows, key), label=label)
        ax.set(xlabel="step", title=key)
    axes.flat[0].legend()
    fig.suptitle("Population vs single agent")
    return _save(fig, out / "compare.png")


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_report(run_dirs: list[Path]) -> list[Path]:
    """Write the plots of ``run_dirs[0]`` (and a comparison with the others) into its plots/."""
    first = Path(run_dirs[0])
    rows = read_metrics(first)
    out = first / "plots"
    out.mkdir(exist_ok=True)
    written = [plot(rows, out) for plot in (plot_ratings, plot_rates, plot_complexity, plot_coverage, plot_lineage)]
    if len(run_dirs) > 1:
        runs = [(Path(d).name, read_metrics(Path(d))) for d in run_dirs]
        written.append(plot_comparison(runs, out))
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m actors.report", description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run directories; the first gets the plots")
    args = parser.parse_args(argv)
    try:
        paths = write_report(args.runs)
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for path in paths:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
