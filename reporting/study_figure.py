"""The figure of a multi-seed study (``studies/dynamics.py``), laid out like the paper's: the complexity of the
programs the teachers wrote, the solve and valid rates, the teacher reward and coverage over training, the
population and the single agent overlaid, each as the mean of its seeds' smoothed series inside the 95 % band
across seeds (``reporting.study.seed_band``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from reporting.report_summary import CUMULATIVE  # noqa: E402
from reporting.study import seed_band, seed_slopes, with_derived  # noqa: E402

Rows = list[dict[str, Any]]

PANELS = (
    ("program_ast_depth", "AST depth (written programs)"),
    ("program_cyclomatic", "cyclomatic complexity"),
    ("program_loc", "lines of code"),
    ("program_variables", "variables"),
    ("solve_rate", "solve rate"),
    ("valid_rate", "valid proposals (rate)"),
    ("teacher_reward", "teacher (proposer) reward"),
    ("coverage", "AST n-grams seen (cumulative)"),
)
ARM_STYLE = {"population": ("tab:blue", "population"), "single": ("tab:orange", "single agent")}


def draw_study(population: Sequence[Rows], single: Sequence[Rows], path: Path) -> Path:
    """Write the figure to ``path``; each legend entry carries the mean of the arm's per-seed slopes per 100 steps +- its t interval."""
    arms = {"population": [with_derived(r) for r in population], "single": [with_derived(r) for r in single]}
    fig, axes = plt.subplots(2, 4, figsize=(18, 8))
    for ax, (key, title) in zip(axes.flat, PANELS):
        for arm, runs in arms.items():
            color, name = ARM_STYLE[arm]
            band = seed_band(runs, key)
            if not band["steps"]:
                continue
            steps = np.array(band["steps"])
            slope = seed_slopes(runs, key) if key not in CUMULATIVE else None
            label = f"{name} ({len(runs)} seeds)" + (f": {slope.mean:+.2f} +- {slope.ci:.2f} / 100 steps" if slope else "")
            ax.plot(steps, band["mean"], color=color, label=label)
            ax.fill_between(steps, band["lo"], band["hi"], color=color, alpha=0.2, linewidth=0)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.legend(fontsize=7)
    fig.suptitle("population vs single agent: mean of the seeds' rolling means, 95% band across seeds; "
                 "legend: mean of the seeds' OLS slopes +- its t interval")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
