"""The study's maths (``reporting.study``) on synthetic runs with known trends, and the step metrics it reads
(``reporting.step_metrics``): the programs the teachers wrote apart from the buffer's."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest

from reporting.step_metrics import step_row
from reporting.study import (
    coverage_at,
    lineages,
    pooled_slope,
    proportion_difference,
    seed_band,
    seed_drain_step,
    study_summary,
)
from verifier.metrics import Coverage
from verifier.tasks import Task

COMPLEXITY = ("program_ast_depth", "program_cyclomatic", "program_loc", "program_variables")


def synthetic_run(slope: float, seed: int, steps: int = 60, written: int = 6) -> list[dict]:
    """Rows whose complexity metrics follow 4 + slope * step / 100 plus noise, with a coverage that grows."""
    rng = np.random.default_rng(seed)
    rows = []
    for step in range(1, steps + 1):
        value = 4 + slope * step / 100
        rows.append({
            "step": step, "members": [{"id": "t0", "role": "teacher"}, {"id": "s0", "role": "student"}],
            **{k: value + rng.normal(scale=0.05) for k in COMPLEXITY},
            "written_programs": written, "rollouts": 8, "valid_rate": 0.9, "solve_rate": 0.3 + 0.001 * step,
            "teacher_reward": 0.1, "student_reward": 0.0, "coverage": 10 * step + (seed % 3),
            "rho_histogram": [2, 1, 1, 0, 0, 1], "buffer_programs": 4, "buffer_seed_share": max(0.0, 1 - step / 25),
            "evolution": [], "tokens": {"teacher": {"completion": 100}, "student": {"completion": 300}},
        })
    return rows


def test_pooled_slope_recovers_the_trend_and_needs_every_seed_to_agree():
    runs = [synthetic_run(-1.0, seed) for seed in range(3)]
    slope = pooled_slope(runs, "program_loc")
    assert slope.slope == pytest.approx(-1.0, abs=0.1) and slope.ci < 0.2
    assert slope.direction == "falls" and len(slope.per_seed) == 3
    mixed = runs[:2] + [synthetic_run(+1.5, 9)]  # the pooled line may fall; one seed rising makes it no claim
    assert pooled_slope(mixed, "program_loc").direction == "flat"


def test_seed_band_is_the_t_interval_of_the_seed_mean():
    runs = [synthetic_run(0.0, seed) for seed in range(3)]
    band = seed_band(runs, "program_loc", smooth=False)
    values = np.array([runs[s][0]["program_loc"] for s in range(3)])
    assert band["mean"][0] == pytest.approx(values.mean())
    assert band["hi"][0] - band["mean"][0] == pytest.approx(4.302653 * values.std(ddof=1) / np.sqrt(3), rel=1e-5)


def test_verdicts_follow_the_slopes():
    population = [synthetic_run(+0.8, seed) for seed in range(3)]
    single = [synthetic_run(-0.8, seed + 10, written=3) for seed in range(3)]
    probes = {"population": [[(30, 100), (25, 100)]] * 3, "single": [[(20, 100)]] * 3, "base": (18, 100)}
    summary = study_summary(population, single, probes)
    verdicts = summary["verdicts"]
    assert verdicts["single_complexity_down"] == "holds"
    assert verdicts["population_complexity_not_down"] == "holds"
    assert verdicts["population_mean_probe_ge_single"] == "holds"  # 0.275 vs 0.20 over 600 and 300 answers
    assert verdicts["weakest_member_probe_ge_single"] == "inconclusive"  # 0.25 vs 0.20
    assert verdicts["population_coverage_per_proposal_higher"] == "fails"  # same coverage, twice the programs
    assert summary["comparisons"]["coverage_at_equal_programs"]["programs"] == 180
    flipped = study_summary(single, population)["verdicts"]
    assert flipped["single_complexity_down"] == "fails" and flipped["population_complexity_not_down"] == "fails"
    assert summary["single"]["metrics"]["unsolved_share"]["first"] == pytest.approx(0.4)
    assert summary["single"]["proposer_token_share"] == pytest.approx(0.25)


def test_probe_difference_is_the_two_proportion_interval():
    d = proportion_difference([(50, 100)], [(40, 100)])
    assert d["difference"] == pytest.approx(0.1)
    assert d["ci"] == pytest.approx(1.96 * np.sqrt(0.25 / 100 + 0.24 / 100), abs=1e-4)
    with pytest.raises(ValueError):
        proportion_difference([], [(1, 2)])


def test_lineages_coverage_at_and_seed_drain():
    rows = synthetic_run(0.0, 0, steps=40)
    rows[0]["members"] = [{"id": "t0", "role": "teacher"}, {"id": "t1", "role": "teacher"}]
    rows[9]["evolution"] = [{"child": "t2", "parents": ["t0"], "replaced": "t1"}]
    rows[19]["evolution"] = [{"child": "t3", "parents": ["t2", "t0"], "replaced": "t0"}]
    rows[-1]["members"] = [{"id": "t2", "role": "teacher"}, {"id": "t3", "role": "teacher"}]
    assert lineages(rows) == 1  # both living teachers descend from t0: one lineage left
    assert coverage_at(rows, 6 * 5) == rows[4]["coverage"]
    assert seed_drain_step(rows) == 23  # the first step with under 10 % seed draws (1 - 23/25)


@dataclass
class Job:
    teacher: str
    family: str
    student: str = "s0"
    text: str = ""
    reference_tasks: list = field(default_factory=list)


@dataclass
class Verdict:
    valid: bool
    task: Task | None = None
    reason: str = ""


def test_step_row_measures_written_programs_apart_from_buffer_programs():
    written = "def f(xs):\n    total = 0\n    for x in xs:\n        total += x\n    return total"
    probed = "def f(a):\n    return a"
    seed = Task("code_o", probed, ["1"], ["1"])
    proposed = Task("code_o", written, ["[1]"], ["1"], meta={"step": 3})
    jobs = [Job("t0", "code_o", reference_tasks=[seed, proposed]), Job("t0", "code_f", reference_tasks=[seed]),
            Job("t1", "code_i", reference_tasks=[seed]), Job("t1", "code_o")]
    code_f_task = Task("code_f", probed, ["1", "2"], ["1", "2"], message="identity")
    validations = [Verdict(True, Task("code_o", written, ["[1]"], ["1"])), Verdict(True, code_f_task),
                   Verdict(False, reason="no f"), Verdict(True, Task("code_o", written, ["[2]"], ["2"]))]
    rho = [0.0, 0.5, None, 1.0]
    row = step_row(4, [], Coverage(), ("code_o", "code_i", "code_f"), jobs, validations, [], [], rho, [], {}, [], {})
    assert row["written_programs"] == 2 and row["valid_tasks"] == 3  # the code_f task's program is not the teacher's
    assert row["program_loc"] == 5 and row["program_variables"] == 3
    assert row["buffer_programs"] == 4 and row["buffer_seed_share"] == 0.75
    assert row["buffer_program_loc"] == pytest.approx((2 * 3 + 5) / 4)
    assert row["rho_by_teacher"] == {"t0": [1, 0, 1, 0, 0, 0], "t1": [0, 0, 0, 0, 0, 1]}
