"""Structural difficulty (``reporting.structural_difficulty``): solve rate by program-size bin, the central bins, the
reward's OLS slope on lines of code with its bootstrap interval, the ratio of long to short, and the gate; each on
constructed tasks whose answer is known."""

from __future__ import annotations

import numpy as np
import pytest

from reporting.structural_difficulty import (
    bin_label, bootstrap_slope_interval, central_bins, reward_slope, solve_by_bin, structural_gate, structural_readout,
)


def task(family: str, loc: int, rho: float, depth: int = 7) -> dict:
    return {"family": family, "loc": loc, "ast_depth": depth, "rho": rho, "teacher_reward": 0.0 if rho == 0 else 1 - rho}


def test_bins_are_labelled_as_the_reports_write_them():
    assert [bin_label(v, ((1, 2), (3, 4), (5, 6), (7, 10_000))) for v in (1, 2, 4, 6, 7, 40)] == \
        ["1-2", "1-2", "3-4", "5-6", "7+", "7+"]
    assert [bin_label(v, ((1, 5), (6, 6), (7, 7), (8, 10_000))) for v in (3, 6, 7, 9)] == ["1-5", "6", "7", "8+"]
    assert bin_label(0, ((1, 2),)) is None


def test_solve_by_bin_is_the_mean_rho_per_bin_and_family():
    tasks = [task("code_o", 1, 1.0), task("code_o", 2, 0.5), task("code_i", 2, 0.25), task("code_o", 8, 0.0, depth=9),
             task("code_i", 5, 0.75, depth=6)]
    by_loc = solve_by_bin(tasks, "loc")
    assert by_loc["pooled"]["1-2"] == {"n": 3, "solve": round((1.0 + 0.5 + 0.25) / 3, 4)}
    assert by_loc["pooled"]["3-4"] == {"n": 0, "solve": None} and by_loc["pooled"]["7+"] == {"n": 1, "solve": 0.0}
    assert by_loc["code_o"]["1-2"] == {"n": 2, "solve": 0.75} and by_loc["code_i"]["5-6"] == {"n": 1, "solve": 0.75}
    by_depth = solve_by_bin(tasks, "ast_depth")
    assert by_depth["pooled"]["7"] == {"n": 3, "solve": round(1.75 / 3, 4)} and by_depth["pooled"]["8+"]["n"] == 1


def test_central_bins_are_the_narrowest_run_holding_the_share():
    assert central_bins([10, 60, 25, 5]) == (1, 2)  # 85 of 100 in two bins; no single bin holds 80
    assert central_bins([85, 5, 5, 5]) == (0, 0)
    assert central_bins([40, 0, 0, 45, 15]) == (0, 3)  # the narrowest run that reaches 80 of 100
    assert central_bins([10, 45, 40, 45, 10]) == (1, 3)  # 130 of 150 in three bins; no two hold 120


def test_reward_slope_is_ols_over_the_central_bins_with_a_bootstrap_interval():
    """Rewards exactly 0.05 per line plus noise on 1-6 lines, 80 % of the tasks, and a few 20-line tasks with reward 0
    that the central bins leave out: the OLS slope of the used tasks is the closed form, its interval covers 0.05."""
    rng = np.random.default_rng(0)
    tasks = []
    for loc in (1, 2, 3, 4, 5, 6):
        for _ in range(40):
            tasks.append({"family": "code_o", "loc": loc, "ast_depth": 7, "rho": 0.5,
                          "teacher_reward": 0.1 + 0.05 * loc + float(rng.normal(0, 0.05))})
    tasks += [{"family": "code_o", "loc": 20, "ast_depth": 9, "rho": 0.0, "teacher_reward": 0.0}] * 20
    out = reward_slope(tasks, reps=500, seed=1)
    used = [t for t in tasks if t["loc"] <= 6]
    x = np.array([t["loc"] for t in used], float)
    y = np.array([t["teacher_reward"] for t in used])
    want = ((x - x.mean()) * (y - y.mean())).sum() / ((x - x.mean()) ** 2).sum()
    assert out["bins"] == ["1-2", "3-4", "5-6"] and out["n"] == 240
    assert out["slope"] == pytest.approx(want, abs=1e-5) and out["ci"][0] < 0.05 < out["ci"][1]
    assert out["ci"][1] - out["ci"][0] < 0.02
    assert reward_slope(tasks, reps=500, seed=1) == out  # seeded


def test_bootstrap_interval_matches_the_resampled_slopes_by_hand():
    x, y = [1.0, 2.0, 3.0, 4.0, 6.0], [0.2, 0.1, 0.4, 0.3, 0.7]
    lo, hi = bootstrap_slope_interval(x, y, reps=50, seed=3)
    idx = np.random.default_rng(3).integers(0, 5, size=(50, 5))
    slopes = [np.polyfit(np.array(x)[i], np.array(y)[i], 1)[0] for i in idx if np.ptp(np.array(x)[i]) > 0]
    assert (lo, hi) == pytest.approx(tuple(np.percentile(slopes, [2.5, 97.5])), abs=1e-9)
    assert bootstrap_slope_interval([1.0, 2.0], [0.0, 1.0]) is None


def gated(short_solve: float, long_solve: float, n: int = 40, slope: float = 0.05) -> dict:
    """n tasks in each LOC bin: solve rates interpolated from short to long, reward rising by ``slope`` a line."""
    rng = np.random.default_rng(2)
    tasks = []
    for loc, solve in ((2, short_solve), (4, None), (6, None), (8, long_solve)):
        solve = solve if solve is not None else (short_solve + long_solve) / 2
        for _ in range(n):
            tasks.append({"family": "code_i", "loc": loc, "ast_depth": 7, "rho": solve,
                          "teacher_reward": 0.2 + slope * loc + float(rng.normal(0, 0.02))})
    return structural_gate(structural_readout(tasks, reps=300))


def test_the_gate_needs_enough_tasks_a_ratio_of_0_6_and_a_positive_slope():
    assert gated(0.8, 0.4)["holds"] is True  # ratio 0.5, slope 0.05 with a narrow interval, 40 a bin
    readout = structural_readout([task("code_o", 1, 0.8), task("code_o", 9, 0.2), task("code_i", 2, 0.5),
                                  task("code_i", 7, 0.5)], reps=50)
    assert readout["ratio_long_to_short"] == round(0.35 / 0.65, 4)
    assert readout["ratio_long_to_short_by_family"] == {"code_i": 1.0, "code_o": 0.25}
    ratio = gated(0.8, 0.6)
    assert ratio["ratio_long_to_short"]["value"] == 0.75 and ratio["holds"] is False
    assert gated(0.8, 0.4, slope=-0.05)["reward_slope_per_line"]["holds"] is False
    few = gated(0.8, 0.4, n=20)
    assert few["bins_used"] == {"counts": {"1-2": 20, "3-4": 20, "5-6": 20, "7+": 20}, "min": 30, "holds": False}
    assert few["holds"] is False
    empty = structural_gate(structural_readout([task("code_o", 3, 0.5)] * 5))
    assert empty["ratio_long_to_short"]["holds"] is None and empty["holds"] is False  # too few tasks: it fails
    unmeasured = gated(0.0, 0.4)  # nothing short solved: no ratio, the other checks hold
    assert unmeasured["ratio_long_to_short"]["value"] is None and unmeasured["holds"] is None


def test_the_bench_keeps_each_valid_tasks_rho_and_program_size(tmp_path):
    """``bench.tiny_coder.solve`` on the shipped test model: one record per task, its rho the share of its k judged
    rollouts that solved it (summing to the bench's solved count), its size the verifier's metrics of its program,
    its teacher reward the run's (0 unsolved, else 1 - rho)."""
    import random

    from bench.tiny_coder import Outcome, Sampling, solve
    from configs.schema import RewardsConfig
    from inference import make_engine
    from tinycoder import ensure_model
    from verifier import Task, identity_task
    from verifier.metrics import program_metrics
    from verifier.sandbox import Verifier

    longer = "def f(xs):\n    total = 0\n    for x in xs:\n        total += x\n    return total"
    tasks = {"code_o": [identity_task("code_o"), Task("code_o", longer, ["[1, 2]"], ["3"])],
             "code_i": [identity_task("code_i")]}
    out = Outcome()
    with Verifier() as verifier:
        engine = make_engine("hf", ensure_model("test", progress=False), max_adapters=1, max_lora_rank=8)
        solve(engine, verifier, tasks, Sampling(0.6, 48, 2, 3, 4), random.Random(0), out, RewardsConfig())
        cut = Outcome()  # two tokens end no answer: every rollout is cut at max_tokens
        solve(engine, verifier, tasks, Sampling(0.6, 2, 2, 3, 4), random.Random(0), cut, RewardsConfig())
        engine.close()
    assert [t["truncated"] for t in cut.tasks] == [1.0] * 3 and sum(cut.solved.values()) == 0
    assert [t["steps"] for t in out.tasks] == [0, 5, None]  # identity: no step; [1, 2]: total, x, total, x, total
    assert all(t["truncated"] in (0.0, 0.25, 0.5, 0.75, 1.0) for t in out.tasks)
    assert [(t["family"], t["loc"], t["ast_depth"]) for t in out.tasks] == [
        (task.family, program_metrics(task.program)["loc"], program_metrics(task.program)["ast_depth"])
        for family in ("code_o", "code_i") for task in tasks[family]]
    assert all(t["rho"] in (0.0, 0.25, 0.5, 0.75, 1.0) for t in out.tasks)
    assert sum(4 * t["rho"] for t in out.tasks) == sum(out.solved.values()) and sum(out.rollouts.values()) == 12
    assert all(t["teacher_reward"] == (0.0 if t["rho"] == 0 else 1 - t["rho"]) for t in out.tasks)


def test_the_truncated_share_is_read_by_bin_where_every_record_has_it():
    tasks = [{**task("code_o", 1, 1.0), "truncated": 0.0}, {**task("code_o", 8, 0.0), "truncated": 0.75},
             {**task("code_i", 9, 0.5), "truncated": 0.25}]
    readout = structural_readout(tasks, reps=20)
    assert readout["truncated_by_loc"]["pooled"]["7+"] == {"n": 2, "truncated": 0.5}
    assert readout["truncated_by_loc"]["code_o"]["1-2"] == {"n": 1, "truncated": 0.0}
    assert "truncated_by_loc" not in structural_readout([task("code_o", 1, 1.0)] + tasks, reps=20)


def test_code_o_tasks_with_their_executed_steps_are_read_by_steps_bin():
    tasks = [{**task("code_o", 3, 1.0), "steps": 1}, {**task("code_o", 3, 0.0), "steps": 20},
             {**task("code_o", 9, 0.5), "steps": 2}, {**task("code_i", 9, 0.5), "steps": None}]
    by_steps = structural_readout(tasks, reps=20)["solve_by_steps"]
    assert by_steps["code_o"]["0-2"] == {"n": 2, "solve": 0.75} and by_steps["code_o"]["15+"] == {"n": 1, "solve": 0.0}
    assert "code_i" not in by_steps and by_steps["pooled"]["3-6"] == {"n": 0, "solve": None}
    steps_by_loc = structural_readout(tasks, reps=20)["steps_by_loc"]["code_o"]
    assert steps_by_loc["3-4"] == {"n": 2, "steps": 10.5} and steps_by_loc["7+"] == {"n": 1, "steps": 2.0}
    assert "solve_by_steps" not in structural_readout([task("code_o", 3, 1.0)], reps=20)
