"""Structural difficulty: whether the students fail more on bigger programs, and whether the teacher's reward pays for
them. Pure (numpy; no Ray, no torch): the bench (``bench.tiny_coder``) and the run reports
(``reporting.complexity_payoff``) feed it one record per valid task.

A task record: ``family``, the program's ``loc`` and ``ast_depth`` (``verifier.metrics.program_metrics``), ``rho``
(the share of the student's rollouts that solved it) and, for the slope, ``teacher_reward`` (the population
teacher's reward of the task: 0 when rho = 0, else 1 - rho, ``rollouts.rewards``).

- **Solve rate by bin** (:func:`solve_by_bin`): per bin of lines of code (:data:`LOC_BINS`) or AST depth
  (:data:`AST_DEPTH_BINS`), the number of valid tasks ``n`` and the students' solve rate ``solve``, the mean rho
  over them (every task has the same k rollouts, so this is solved rollouts over rollouts), per family and pooled.
- **Reward slope** (:func:`reward_slope`): the OLS slope b of per-task ``teacher_reward`` on lines of code,
  b = sum (x - x_bar)(y - y_bar) / sum (x - x_bar)^2 (``reporting.report_trends.fit_line``), over the tasks of the
  narrowest run of consecutive LOC bins that holds at least :data:`CENTRAL_SHARE` of the valid tasks
  (:func:`central_bins`: the tails, a few very long programs, do not set it), with a 95 % percentile bootstrap
  interval over tasks (Efron and Tibshirani 1993, ch. 13: resample the tasks with replacement, refit, take the
  2.5 and 97.5 percentiles of the slopes).
- **Ratio** (:func:`structural_readout`): the pooled solve rate on tasks of 7+ lines over that on 1-2 lines.
- **Gate** (:func:`structural_gate`, :data:`STRUCTURAL_GATE`): every bin used (the ratio's two and the slope's) holds
  at least 30 valid tasks, the ratio is at most 0.6, and the slope is above 0 with its interval above 0.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Mapping, Sequence

import numpy as np

from reporting.report_trends import fit_line

Bins = tuple[tuple[int, int], ...]
LOC_BINS: Bins = ((1, 2), (3, 4), (5, 6), (7, 10_000))
"""Lines-of-code bins of valid programs (inclusive)."""
AST_DEPTH_BINS: Bins = ((1, 5), (6, 6), (7, 7), (8, 10_000))
"""AST-depth bins (inclusive): the toy's programs sit at depth 6-8 (the shipped corpora's seed tasks 4-10)."""
STEP_BINS: Bins = ((0, 2), (3, 6), (7, 14), (15, 10_000))
"""Bins of a code_o task's executed steps (``tinycoder.line_trace.step_counts``: the events a line-by-line reader of
the program on the task's input passes through), where the bench records them."""
BINS: dict[str, Bins] = {"loc": LOC_BINS, "ast_depth": AST_DEPTH_BINS}
"""The program-size metrics every task record has, and their bins."""
METRIC_BINS: dict[str, Bins] = {**BINS, "steps": STEP_BINS}
CENTRAL_SHARE = 0.8
STRUCTURAL_GATE = {"min_tasks_per_bin": 30, "max_ratio_long_to_short": 0.6, "slope_above": 0.0}
"""The structural gate, fixed before any variant is built for it (the toy's mechanism needs a student for whom
bigger programs are harder, and a teacher's reward that pays for them)."""
SHORT_BIN, LONG_BIN = "1-2", "7+"


def bin_label(value: float, bins: Bins) -> str | None:
    """``"lo-hi"`` (``"lo+"`` for the open last bin) of the bin of ``bins`` holding ``value``; None outside them."""
    for lo, hi in bins:
        if lo <= value <= hi:
            return f"{lo}+" if hi >= 10_000 else f"{lo}-{hi}" if hi > lo else f"{lo}"
    return None


def labels(bins: Bins) -> list[str]:
    return [bin_label(lo, bins) for lo, _ in bins]


def solve_by_bin(tasks: Sequence[Mapping[str, Any]], metric: str, value: str = "rho",
                 name: str = "solve") -> dict[str, dict[str, dict[str, float | int | None]]]:
    """Per family and ``pooled``, per bin of ``metric`` (``loc``, ``ast_depth`` or ``steps``, :data:`METRIC_BINS`): ``n`` valid tasks and
    the students' solve rate ``solve`` = mean rho (None for an empty bin). Every bin is listed, in order. Another
    per-task ``value`` gives its mean under ``name`` (the bench's ``truncated``: the share of rollouts cut at
    ``max_tokens``)."""
    bins = METRIC_BINS[metric]
    groups: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for task in tasks:
        label = None if task.get(metric) is None else bin_label(task[metric], bins)
        if label is None:
            continue
        for family in ("pooled", task["family"]):
            groups[family][label].append(float(task[value]))
    return {family: {label: {"n": len(by[label]), name: round(float(np.mean(by[label])), 4) if by[label] else None}
                     for label in labels(bins)}
            for family, by in sorted(groups.items())}


def central_bins(counts: Sequence[int], share: float = CENTRAL_SHARE) -> tuple[int, int]:
    """(first, last) indices of the narrowest run of consecutive bins whose counts sum to at least ``share`` of the
    total; among runs of one width, the one holding the most (then the first)."""
    total = sum(counts)
    if total <= 0:
        raise ValueError("no task in any bin")
    best: tuple[int, int, int] | None = None  # (width, -held, first)
    for first in range(len(counts)):
        held = 0
        for last in range(first, len(counts)):
            held += counts[last]
            if held >= share * total:
                key = (last - first, -held, first)
                if best is None or key < best:
                    best = key
                break
    width, _, first = best
    return first, first + width


def bootstrap_slope_interval(x: Sequence[float], y: Sequence[float], reps: int = 2000, seed: int = 0,
                             level: float = 0.95) -> tuple[float, float] | None:
    """Percentile bootstrap interval of the OLS slope of ``y`` on ``x``: ``reps`` resamples of the (x, y) pairs with
    replacement (numpy's PCG64 seeded with ``seed``), each refitted; resamples whose x are all equal are dropped.
    None when fewer than 3 pairs."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if len(x) < 3:
        return None
    idx = np.random.default_rng(seed).integers(0, len(x), size=(reps, len(x)))
    xs, ys = x[idx], y[idx]
    dx = xs - xs.mean(axis=1, keepdims=True)
    sxx = (dx ** 2).sum(axis=1)
    ok = sxx > 0
    slopes = (dx[ok] * (ys[ok] - ys[ok].mean(axis=1, keepdims=True))).sum(axis=1) / sxx[ok]
    tail = (1 - level) / 2 * 100
    lo, hi = np.percentile(slopes, [tail, 100 - tail])
    return float(lo), float(hi)


def reward_slope(tasks: Sequence[Mapping[str, Any]], reps: int = 2000, seed: int = 0) -> dict[str, Any]:
    """The OLS slope of ``teacher_reward`` on ``loc`` over the tasks of the central LOC bins (module docstring), with
    its bootstrap interval; ``bins`` names the bins used, ``n`` the tasks. ``slope`` None when it cannot be fitted."""
    by_bin = [[t for t in tasks if bin_label(t["loc"], LOC_BINS) == label] for label in labels(LOC_BINS)]
    counts = [len(b) for b in by_bin]
    if not sum(counts):
        return {"bins": [], "n": 0, "slope": None, "ci": None}
    first, last = central_bins(counts)
    used = [t for b in by_bin[first:last + 1] for t in b]
    x, y = [float(t["loc"]) for t in used], [float(t["teacher_reward"]) for t in used]
    out: dict[str, Any] = {"bins": labels(LOC_BINS)[first:last + 1], "n": len(used), "slope": None, "ci": None}
    if len(x) >= 3 and np.ptp(x) > 0:
        out["slope"] = round(fit_line(x, y).slope, 5)
        interval = bootstrap_slope_interval(x, y, reps, seed)
        out["ci"] = None if interval is None else [round(v, 5) for v in interval]
    return out


def structural_readout(tasks: Sequence[Mapping[str, Any]], reps: int = 2000, seed: int = 0) -> dict[str, Any]:
    """The bins (solve rate and count by LOC and by AST depth, per family and pooled), the reward slope on lines of
    code with its interval, and ``ratio_long_to_short``: the pooled solve rate at 7+ lines over that at 1-2 lines
    (None when either is empty or the short bin's rate is 0), and the same per family
    (``ratio_long_to_short_by_family``; the gate reads the pooled one). With a ``truncated`` share in every record
    (the bench's), ``truncated_by_loc``: its mean by LOC bin, which tells a student that errs on a longer program
    from one that runs out of tokens on it. Where records hold ``steps`` (the bench's code_o tasks), ``solve_by_steps``:
    the solve rate by :data:`STEP_BINS`, and ``steps_by_loc``: their mean steps by LOC bin (whether longer programs
    ask more work)."""
    by_loc = solve_by_bin(tasks, "loc")

    def ratio(bins: Mapping[str, Mapping[str, Any]]) -> float | None:
        short, long = bins.get(SHORT_BIN, {}).get("solve"), bins.get(LONG_BIN, {}).get("solve")
        return round(long / short, 4) if short and long is not None else None

    out = {"tasks": len(tasks), "solve_by_loc": by_loc, "solve_by_ast_depth": solve_by_bin(tasks, "ast_depth"),
           "ratio_long_to_short": ratio(by_loc.get("pooled", {})),
           "ratio_long_to_short_by_family": {f: ratio(bins) for f, bins in by_loc.items() if f != "pooled"},
           "reward_slope_per_line": reward_slope(tasks, reps, seed)}
    if tasks and all("truncated" in t for t in tasks):
        out["truncated_by_loc"] = solve_by_bin(tasks, "loc", value="truncated", name="truncated")
    stepped = [t for t in tasks if t.get("steps") is not None]
    if stepped:
        out["solve_by_steps"] = solve_by_bin(stepped, "steps")
        out["steps_by_loc"] = solve_by_bin(stepped, "loc", value="steps", name="steps")
    return out


def structural_gate(readout: Mapping[str, Any]) -> dict[str, Any]:
    """:data:`STRUCTURAL_GATE` on a :func:`structural_readout`: ``bins_used`` with their counts and whether each holds
    enough tasks, ``ratio`` and ``slope`` checks, and ``holds`` (:func:`all_checks` of the three: False when one
    fails, None when none fails but one could not be measured)."""
    gate = STRUCTURAL_GATE
    pooled = readout["solve_by_loc"].get("pooled", {})
    slope = readout["reward_slope_per_line"]
    used = sorted(set([SHORT_BIN, LONG_BIN] + list(slope["bins"])), key=labels(LOC_BINS).index)
    counts = {label: pooled.get(label, {}).get("n", 0) for label in used}
    enough = all(n >= gate["min_tasks_per_bin"] for n in counts.values())
    ratio = readout["ratio_long_to_short"]
    ci = slope["ci"]
    checks = {
        "bins_used": {"counts": counts, "min": gate["min_tasks_per_bin"], "holds": enough},
        "ratio_long_to_short": {"value": ratio, "max": gate["max_ratio_long_to_short"],
                                "holds": None if ratio is None else ratio <= gate["max_ratio_long_to_short"]},
        "reward_slope_per_line": {"value": slope["slope"], "ci": ci, "above": gate["slope_above"],
                                  "holds": None if slope["slope"] is None or ci is None
                                  else slope["slope"] > gate["slope_above"] and ci[0] > gate["slope_above"]},
    }
    return {**checks, "holds": all_checks([c["holds"] for c in checks.values()])}


def all_checks(verdicts: Sequence[bool | None]) -> bool | None:
    """False when any check fails, else None when any could not be measured, else True."""
    if False in verdicts:
        return False
    return None if None in verdicts else True
