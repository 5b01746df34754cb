"""Plots of a run (or a comparison of two) from its ``metrics.jsonl``, and ``summary.md`` beside them.

    python -m reporting RUN_DIR                 # plots and summary.md into RUN_DIR/plots/
    python -m reporting POP_RUN SINGLE_RUN      # also compare.png (and its table) in the first run's plots/

Figures (each trend: the raw per-step values as faint dots behind a centred rolling mean, whose window and
formula ``reporting.report_trends`` states):

- ``ratings.png``: per role (teachers, students; the single agent) a row: TrueSkill mu per member with a
  +-sigma band and the role's mean mu, beside mu relative to the role's mean.
- ``rates.png``: teachers and students apart: the teachers' valid-proposal rate and reward, the students'
  solve rate and reward.
- ``complexity.png``: AST depth, cyclomatic complexity, lines and variables of the programs the teachers
  wrote (the paper's collapse-vs-expansion evidence), each with its least-squares line, the line's 95 %
  confidence band, and the slope +- its 95 % CI.
- ``coverage.png``: distinct AST n-grams and program structures seen so far, and new structures per step.
- ``lineage.png``: the evolved members, an arrow from each parent to its child.
- ``compare.png`` (two or more runs): one panel per metric, the runs overlaid (population vs single agent,
  the paper's layout).
- ``eval.png`` (where ``eval.every`` was set): per benchmark, each member's score, the population mean, the
  weakest member and the base against the training step, lineage shown, beside the compared runs' means
  (``reporting.report_eval``).

``summary.md`` (``reporting.report_summary``) holds the numbers behind each figure.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from reporting.report_eval import has_eval, plot_eval  # noqa: E402
from reporting.report_trends import smoothing_half_width  # noqa: E402
from reporting.run_dir import RunDirectory  # noqa: E402
from reporting.report_summary import (  # noqa: E402
    COMPARED, COMPLEXITY, COVERAGE, CUMULATIVE, LABELS, ROLE_METRICS, Trend, is_single_agent, roles, run_label,
    trend, write_summary,
)

ROLE_TITLES = {"teacher": "Teachers", "student": "Students", "agent": "The single agent"}
SINGLE_AGENT_REWARDS = {"teacher_reward": "reward as proposer", "student_reward": "reward as solver"}
RUN_COLORS = ("tab:blue", "tab:red", "tab:green", "tab:purple")
def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The step rows of ``run_dir/metrics.jsonl`` (``RunDirectory.read_metrics``: event records left out, a line
    cut by a kill ends the log); a clear error where there is no log or no step yet."""
    run = RunDirectory(Path(run_dir))
    if not run.metrics_path.is_file():
        raise FileNotFoundError(f"{run.metrics_path} does not exist (is {run_dir} a run directory?)")
    rows = run.read_metrics()
    if not rows:
        raise ValueError(f"{run.metrics_path} holds no steps yet")
    return rows


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


def draw_trend(ax: Any, t: Trend | None, color: str, label: str, fit_label: str | None = None) -> None:
    """Raw values as faint dots, the rolling mean as a line labelled ``label``; with ``fit_label`` also the OLS
    line (dashed, labelled ``fit_label`` and its slope +- 95 % CI) and the line's 95 % band."""
    if t is None:
        return
    ax.plot(t.steps, t.values, "o", markersize=3, color=color, alpha=0.3, zorder=1)
    ax.plot(t.steps, t.smoothed, "-", linewidth=2, color=color, label=label, zorder=3)
    if fit_label is not None and t.fit is not None:
        xs = np.linspace(t.steps.min(), t.steps.max(), 100)
        line, band = t.fit.predict(xs), t.fit.band(xs)
        ax.plot(xs, line, "--", linewidth=1.2, color=color, zorder=2,
                label=f"{fit_label}{t.fit.slope:+.3g} ± {t.fit.slope_ci:.2g} / step")
        ax.fill_between(xs, line - band, line + band, color=color, alpha=0.12, linewidth=0, zorder=0)


def smoothing_label(t: Trend | None) -> str:
    return f"rolling mean ({2 * smoothing_half_width(t.n) + 1} steps)" if t is not None else "rolling mean"


def plot_ratings(rows: list[dict[str, Any]], out: Path) -> Path:
    """One row per role: raw mu (+-sigma band, the role's mean mu in black) beside mu relative to the role's
    mean (what matching, culling and parent selection inside a sub-population see)."""
    trajectories: dict[str, list[tuple[int, float, float, str]]] = defaultdict(list)
    for row in rows:
        for m in row.get("members", []):
            trajectories[m["id"]].append((row["step"], m["mu"], m["sigma"], m["role"]))
    relative = relative_ratings(rows)
    means = sub_population_means(rows)
    role_list = roles(rows)
    fig, axes = plt.subplots(len(role_list), 2, figsize=(14, 3.6 * len(role_list)), squeeze=False)
    for (raw, rel), role in zip(axes, role_list):
        # in order of birth, so the members alive together get neighbouring (distinct) colours
        members = sorted((m for m, points in trajectories.items() if points[0][3] == role),
                         key=lambda m: (trajectories[m][0][0], len(m), m))
        for i, member in enumerate(members):
            color = f"C{i % 10}"
            points = trajectories[member]
            steps = [p[0] for p in points]
            mu = np.array([p[1] for p in points])
            sigma = np.array([p[2] for p in points])
            raw.plot(steps, mu, "-", color=color, linewidth=1.3, label=member)
            raw.fill_between(steps, mu - sigma, mu + sigma, color=color, alpha=0.08, linewidth=0)
            rel.plot([p[0] for p in relative[member]], [p[1] for p in relative[member]], "-", color=color,
                     linewidth=1.3, label=member)
        if len({p[1] for m in members for p in trajectories[m]}) == 1:
            raw.text(0.5, 0.9, "no rated games: mu stays at its prior", transform=raw.transAxes, ha="center",
                     color="dimgray")
        points = means[role]
        raw.plot([p[0] for p in points], [p[1] for p in points], "-", color="black", linewidth=2.5,
                 label=f"mean of the {role}s")
        title = ROLE_TITLES.get(role, role)
        raw.set(xlabel="step", ylabel="TrueSkill mu (band: +-sigma)", title=f"{title}: rating per member")
        rel.axhline(0.0, color="black", linewidth=1)
        rel.set(xlabel="step", ylabel="mu - mean mu of the role", title=f"{title}: rating relative to the role's mean")
        raw.legend(fontsize=7, ncol=1 + len(members) // 8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return _save(fig, out / "ratings.png")


def plot_rates(rows: list[dict[str, Any]], out: Path) -> Path:
    """Teachers (valid-proposal rate, reward) in the top row, students (solve rate, reward) below: smoothed."""
    single = is_single_agent(rows)
    fig, axes = plt.subplots(2, 2, figsize=(12, 7), sharex=True)
    colors = {"teachers": "tab:blue", "students": "tab:orange"}
    for ax_row, (role, keys) in zip(axes, ROLE_METRICS.items()):
        who = ("The agent proposing" if role == "teachers" else "The agent solving") if single else role.capitalize()
        for ax, key in zip(ax_row, keys):
            t = trend(rows, key)
            draw_trend(ax, t, colors[role], smoothing_label(t))
            limits = (-0.02, 1.02) if key.endswith("_rate") else (-1.05, 1.05)
            label = SINGLE_AGENT_REWARDS.get(key, LABELS[key]) if single else LABELS[key]
            ax.set(ylim=limits, title=f"{who}: {label}", ylabel=label)
            if key.endswith("_reward"):
                ax.axhline(0.0, color="gray", linewidth=0.8)
            ax.grid(alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=8, loc="lower right")
    for ax in axes[1]:
        ax.set_xlabel("step")
    fig.suptitle(f"{'Proposing and solving' if single else 'Teachers and students'} "
                 "(dots: each step; line: centred rolling mean)")
    return _save(fig, out / "rates.png")


def plot_complexity(rows: list[dict[str, Any]], out: Path) -> Path:
    """Each complexity metric smoothed, with its OLS line, the line's 95 % band and the slope +- CI."""
    fig, axes = plt.subplots(2, 2, figsize=(12, 7), sharex=True)
    for ax, key in zip(axes.flat, COMPLEXITY):
        t = trend(rows, key)
        draw_trend(ax, t, "tab:purple", smoothing_label(t), fit_label="least squares: ")
        ax.set(title=LABELS[key])
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8, loc="best")
    for ax in axes[1]:
        ax.set_xlabel("step")
    fig.suptitle("Complexity of the valid proposed programs "
                 "(mean per step; dashed: least-squares line, band: its 95% CI)")
    return _save(fig, out / "complexity.png")


def plot_coverage(rows: list[dict[str, Any]], out: Path) -> Path:
    """Cumulative n-grams and structures (raw running totals) and new structures per step (smoothed)."""
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    for ax, key in zip(axes, COVERAGE):
        t = trend(rows, key)
        if key in CUMULATIVE and t is not None:
            ax.plot(t.steps, t.values, "-", color="tab:green", linewidth=2)
        else:
            draw_trend(ax, t, "tab:green", smoothing_label(t))
            if t is not None:
                ax.legend(fontsize=8)
        ax.set(xlabel="step", title=LABELS[key])
        ax.grid(alpha=0.3)
    fig.suptitle("Problem-space coverage of the valid proposals")
    return _save(fig, out / "coverage.png")


def plot_lineage(rows: list[dict[str, Any]], out: Path) -> Path:
    """One bar per member over the steps it was present at (teachers above students); an arrow from each
    parent's bar to the child's at the child's first step, labelled with the operator."""
    span: dict[str, list[int]] = {}
    role: dict[str, str] = {}
    for row in rows:
        for m in row.get("members", []):
            span.setdefault(m["id"], [row["step"], row["step"]])[1] = row["step"]
            role[m["id"]] = m["role"]
    events = [e for r in rows for e in r.get("evolution", [])]
    role_order = {r: i for i, r in enumerate(roles(rows))}
    members = sorted(span, key=lambda k: (role_order[role[k]], span[k][0], k))
    y = {member: len(members) - 1 - i for i, member in enumerate(members)}  # the first role and the oldest on top
    colors = {"teacher": "tab:blue", "student": "tab:orange", "agent": "tab:purple"}
    fig, ax = plt.subplots(figsize=(11, max(3.0, 0.32 * len(members) + 1.2)))
    for member in members:
        first, last = span[member]
        color = colors.get(role[member], "gray")
        ax.plot([first - 0.5, last + 0.5], [y[member], y[member]], "-", color=color, linewidth=5, alpha=0.7,
                solid_capstyle="butt")  # the bar covers each step the member was present at, as a cell
        ax.annotate(member, (first - 0.5, y[member]), fontsize=8, xytext=(-4, 0), textcoords="offset points",
                    ha="right", va="center")
    for e in events:
        child = e.get("child")
        if child not in y:
            continue
        born = span[child][0]
        for parent in e.get("parents", []):
            if parent in y:
                ax.annotate("", (born, y[child]), (born, y[parent]),
                            arrowprops={"arrowstyle": "->", "color": "gray", "alpha": 0.8})
        ax.annotate(e.get("operator", ""), (born, y[child]), fontsize=7, xytext=(3, 5), textcoords="offset points",
                    color="dimgray")
    handles = [plt.Line2D([], [], color=colors.get(r, "gray"), linewidth=5, label=ROLE_TITLES.get(r, r))
               for r in role_order]
    ax.legend(handles=handles, loc="upper right", fontsize=8)
    ax.set(xlabel="step", yticks=[], ylim=(-0.8, len(members) - 0.2),
           title=f"Lineage: each member's life (bar) and its parents (arrows); {len(events)} evolution events")
    steps = [r["step"] for r in rows]
    width = max(steps) - min(steps) + 1
    ax.set_xlim(min(steps) - 0.06 * width - 1, max(steps) + 0.12 * width + 1)  # room for the names and operators
    ax.grid(axis="x", alpha=0.3)
    return _save(fig, out / "lineage.png")


def plot_comparison(runs: list[tuple[str, list[dict[str, Any]]]], out: Path) -> Path:
    """One panel per metric, every run in each (smoothed over faint raw dots; complexity with its OLS line)."""
    fig, axes = plt.subplots(2, 4, figsize=(18, 8), sharex=True)
    for ax, key in zip(axes.flat, COMPARED):
        for (name, rows), color in zip(runs, RUN_COLORS):
            t = trend(rows, key)
            if key in CUMULATIVE and t is not None:
                ax.plot(t.steps, t.values, "-", color=color, linewidth=2, label=run_label(name, rows))
            else:
                draw_trend(ax, t, color, "_nolegend_", fit_label=f"{name}: " if key in COMPLEXITY else None)
        ax.set(title=LABELS[key])
        ax.grid(alpha=0.3)
        if key in COMPLEXITY:
            ax.legend(fontsize=7, loc="best")
    for ax in axes[1]:
        ax.set_xlabel("step")
    handles = [plt.Line2D([], [], color=color, linewidth=2, label=run_label(name, rows))
               for (name, rows), color in zip(runs, RUN_COLORS)]
    fig.legend(handles=handles, loc="upper right", ncol=len(runs))
    fig.suptitle("Population vs single agent (dots: each step; line: centred rolling mean; dashed: least-squares line)",
                 x=0.01, ha="left")
    return _save(fig, out / "compare.png")


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_report(run_dirs: list[Path]) -> list[Path]:
    """Write the plots of ``run_dirs[0]`` (and a comparison with the others) and ``summary.md`` into its plots/;
    return the written paths (the figures, then summary.md)."""
    first = Path(run_dirs[0])
    rows = read_metrics(first)
    out = first / "plots"
    out.mkdir(exist_ok=True)
    written = [plot(rows, out) for plot in (plot_ratings, plot_rates, plot_complexity, plot_coverage, plot_lineage)]
    runs = [(first.name, rows)] + [(Path(d).name, read_metrics(Path(d))) for d in run_dirs[1:]]
    if len(runs) > 1:
        written.append(plot_comparison(runs, out))
    if any(has_eval(run_rows) for _, run_rows in runs):
        written.append(plot_eval([(run_label(name, run_rows), run_rows) for name, run_rows in runs], out))
    written.append(write_summary(runs, out, run_statuses(run_dirs)))
    return written


def run_statuses(run_dirs: list[Path]) -> dict[str, str]:
    """Run name -> how it stopped, from its status.json ("it finished at step 60", "it failed at step 14
    ...: cause", "it recorded no status ...")."""
    return {Path(d).name: RunDirectory.describe_status(RunDirectory(Path(d)).read_status()) for d in run_dirs}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reporting", description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run directories; the first gets the plots")
    args = parser.parse_args(argv)
    try:
        paths = write_report(args.runs)
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for name, said in run_statuses(args.runs).items():
        print(f"{name}: {said}", file=sys.stderr)  # stdout lists the written files only
    for path in paths:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
