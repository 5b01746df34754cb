"""The numbers behind the report's figures: each metric's measured series, its smoothed trend and fitted
line (``reporting.report_trends``), and ``summary.md``, which states them per figure.

A step counts for a metric only where it measured it: ``step_metrics`` writes 0.0 for the mean of nothing,
so the complexity metrics (means over the programs the teachers wrote) need ``written_programs >= 1``, and the
solve rate and student reward (means over the students' rollouts) need ``rollouts >= 1``. Rows without
those counts (older logs) count wherever the value is a number.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from reporting.report_eval import summary_section as eval_section
from reporting.report_trends import LineFit, fit_line, rolling_mean, smoothing_half_width

Rows = list[dict[str, Any]]

MEASURED_BY = {
    "program_ast_depth": "written_programs",
    "program_cyclomatic": "written_programs",
    "program_loc": "written_programs",
    "program_variables": "written_programs",
    "buffer_program_ast_depth": "buffer_programs",
    "buffer_program_cyclomatic": "buffer_programs",
    "buffer_program_loc": "buffer_programs",
    "buffer_program_variables": "buffer_programs",
    "solve_rate": "rollouts",
    "student_reward": "rollouts",
}
"""Metric -> the row's count of what its value averages; the step measured the metric only if that count is >= 1."""

LABELS = {
    "valid_rate": "valid proposals (rate)",
    "teacher_reward": "teacher reward",
    "solve_rate": "solve rate",
    "student_reward": "student reward",
    "program_ast_depth": "AST depth",
    "program_cyclomatic": "cyclomatic complexity",
    "program_loc": "lines of code",
    "program_variables": "variables",
    "coverage": "AST n-grams seen (cumulative)",
    "distinct_structures": "distinct program structures (cumulative)",
    "new_structures": "new program structures per step",
}

ROLE_METRICS = {"teachers": ("valid_rate", "teacher_reward"), "students": ("solve_rate", "student_reward")}
"""The rates figure's two rows: what the teachers' proposals score, and what the students' answers score."""
COMPLEXITY = ("program_ast_depth", "program_cyclomatic", "program_loc", "program_variables")
COVERAGE = ("coverage", "distinct_structures", "new_structures")
CUMULATIVE = frozenset({"coverage", "distinct_structures"})
"""Running totals: not smoothed; their OLS slope is the mean growth per step, but their residuals are not
independent, so no CI."""
COMPARED = ("solve_rate", "valid_rate", "teacher_reward", "student_reward",
            "program_ast_depth", "program_cyclomatic", "program_loc", "coverage")
"""The comparison figure's panels, one per metric (population vs single agent in each)."""


def series(rows: Rows, key: str) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values) of the rows that measured ``key`` (module docstring), in step order."""
    count = MEASURED_BY.get(key)
    pairs = [(r["step"], float(r[key])) for r in rows
             if isinstance(r.get(key), (int, float)) and not isinstance(r.get(key), bool)
             and (count is None or not isinstance(r.get(count), int) or r[count] >= 1)]
    pairs.sort()
    return np.array([p[0] for p in pairs], dtype=float), np.array([p[1] for p in pairs], dtype=float)


@dataclass(frozen=True)
class Trend:
    """A metric's measured points, their centred rolling mean (the points themselves for a running total)
    and (from 3 points) their OLS line."""

    key: str
    steps: np.ndarray
    values: np.ndarray
    smoothed: np.ndarray
    fit: LineFit | None

    @property
    def n(self) -> int:
        return len(self.steps)

    @property
    def mean(self) -> float:
        return float(self.values.mean())


def trend(rows: Rows, key: str) -> Trend | None:
    """The trend of ``key`` over ``rows``; None where no step measured it."""
    steps, values = series(rows, key)
    if len(steps) == 0:
        return None
    smoothed = values if key in CUMULATIVE else rolling_mean(values, smoothing_half_width(len(values)))
    fit = fit_line(steps, values) if len(steps) >= 3 else None
    return Trend(key, steps, values, smoothed, fit)


def roles(rows: Rows) -> list[str]:
    """The members' roles in order of appearance ("teacher", "student"; "agent" in a single-agent run)."""
    return list(dict.fromkeys(m["role"] for r in rows for m in r.get("members", [])))


def is_single_agent(rows: Rows) -> bool:
    return "agent" in roles(rows)


def run_label(name: str, rows: Rows) -> str:
    """``name`` and what it is: "single agent" or "population xT+yS" (counted on the first step)."""
    if is_single_agent(rows):
        return f"{name} (single agent)"
    first = Counter(m["role"] for m in rows[0].get("members", []))
    return f"{name} (population {first['teacher']}T+{first['student']}S)"


def _num(value: float) -> str:
    return f"{value:.4g}" if abs(value) < 1e4 else f"{value:.0f}"


TREND_COLUMNS = ("metric", "n steps", "mean", "first (smoothed)", "last (smoothed)", "OLS slope / step", "95% CI +-",
                 "trend")


def trend_header(*leading: str) -> list[str]:
    """The markdown header of a trend table, with ``leading`` columns (e.g. role, run) before the metric."""
    columns = (*leading, *TREND_COLUMNS)
    return ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]


def trend_row(label: str, t: Trend | None) -> str:
    """One table row: n, mean, first and last smoothed value, slope and its 95 % CI half-width, direction."""
    if t is None:
        return f"| {label} | 0 | - | - | - | - | - | - |"
    slope = _num(t.fit.slope) if t.fit else "-"
    if t.fit is None or t.key in CUMULATIVE:
        ci = direction = "-"
    else:
        ci, direction = _num(t.fit.slope_ci), t.fit.direction
    return (f"| {label} | {t.n} | {_num(t.mean)} | {_num(float(t.smoothed[0]))} | {_num(float(t.smoothed[-1]))} "
            f"| {slope} | {ci} | {direction} |")


def _ratings_table(rows: Rows) -> list[str]:
    first_seen: dict[str, tuple[int, float]] = {}
    last: dict[str, tuple[int, dict[str, Any]]] = {}
    for row in rows:
        for m in row.get("members", []):
            first_seen.setdefault(m["id"], (row["step"], m["mu"]))
            last[m["id"]] = (row["step"], m)
    final_step = rows[-1]["step"]
    lines = ["| member | role | steps present | mu at first | mu at last | sigma at last | alive at the end |",
             "|---|---|---|---|---|---|---|"]
    for member, (step, m) in sorted(last.items(), key=lambda kv: (kv[1][1]["role"], first_seen[kv[0]][0], kv[0])):
        born, mu0 = first_seen[member]
        lines.append(f"| {member} | {m['role']} | {born}-{step} | {_num(mu0)} | {_num(m['mu'])} | {_num(m['sigma'])} "
                     f"| {'yes' if step == final_step else 'no'} |")
    return lines


def write_summary(runs: list[tuple[str, Rows]], out: Path, statuses: dict[str, str] | None = None) -> Path:
    """``out/summary.md``: per figure of the first run the numbers behind it, and with more runs the
    comparison's numbers per metric and run. ``statuses``: run name -> how it stopped (status.json in words)."""
    name, rows = runs[0]
    steps = [r["step"] for r in rows]
    h = smoothing_half_width(len(rows))
    lines = [
        f"# Report: {run_label(name, rows)}",
        "",
        *[f"Status of {run_name}: {said}." for run_name, said in (statuses or {}).items()],
        *([""] if statuses else []),
        f"{len(rows)} steps ({min(steps)}-{max(steps)}). Smoothed: centred rolling mean over 2h+1 measured steps, "
        f"h = clamp(n // 10, 1, 5) with n the metric's measured steps ({2 * h + 1} at n = {len(rows)}), one-sided at "
        "the ends (first/last smoothed = mean of the first/last h+1 points). Slope: ordinary "
        "least squares of the raw values on the step; its 95% CI is t(0.975, n-2) * s / sqrt(Sxx) "
        "(`reporting/report_trends.py`). trend: rises / falls where that CI excludes 0, else flat. A step counts "
        "for the complexity metrics only with >= 1 valid task, for the solve rate and student reward only with "
        ">= 1 rollout. Running totals (cumulative) are not smoothed and get no CI (their residuals are not "
        "independent).",
        "",
    ]
    single = is_single_agent(rows)
    lines += ["## rates.png: teachers and students apart", "",
              "The single agent proposes (teacher rows) and solves (student rows)." if single else
              "Teachers are scored by their proposals (validity, reward), students by their answers.", "",
              *trend_header("role")]
    for role, keys in ROLE_METRICS.items():
        for key in keys:
            lines.append(f"| {role} " + trend_row(LABELS[key], trend(rows, key)))
    lines += ["", "## complexity.png: programs of the valid proposals (with the fitted line's 95% band)", "",
              *trend_header()]
    lines += [trend_row(LABELS[key], trend(rows, key)) for key in COMPLEXITY]
    lines += ["", "## coverage.png: problem-space coverage", "", *trend_header()]
    lines += [trend_row(LABELS[key], trend(rows, key)) for key in COVERAGE]
    lines += ["", "## ratings.png: TrueSkill per member", ""] + _ratings_table(rows)
    events = [e for r in rows for e in r.get("evolution", [])]
    operators = Counter(e.get("operator", "?") for e in events)
    lines += ["", "## lineage.png: evolution", "",
              f"{len(events)} evolution events" + (": " + ", ".join(f"{op} {k}" for op, k in sorted(operators.items()))
                                                   if events else ".")]
    if len(runs) > 1:
        lines += ["", "## compare.png: " + " vs ".join(run_label(n, r) for n, r in runs), "",
                  *trend_header("run")]
        for key in COMPARED:
            for run_name, run_rows in runs:
                lines.append(f"| {run_name} " + trend_row(LABELS[key], trend(run_rows, key)))
    section = eval_section([(run_label(n, r), r) for n, r in runs])
    lines += ["", *section] if section else []
    path = out / "summary.md"
    path.write_text("\n".join(lines) + "\n")
    return path
