"""The study's maths (``reporting.study``) on synthetic runs with known trends, and the step metrics it reads
(``reporting.step_metrics``): the programs the teachers wrote apart from the buffer's."""

from __future__ import annotations

from dataclasses import dataclass, field

import math

import numpy as np
import pytest

from reporting.step_metrics import step_row
from reporting.study import (
    all_of,
    coverage_at,
    coverage_at_equal_programs,
    lineages,
    paired_probe_difference,
    seed_band,
    seed_drain_step,
    seed_slopes,
    study_against,
    study_summary,
    welch_difference,
)
from reporting.report_trends import t_quantile_975 as t_975
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


def test_seed_slopes_take_the_seed_as_the_unit():
    runs = [synthetic_run(-1.0, seed) for seed in range(4)]
    slopes = seed_slopes(runs, "program_loc")
    assert slopes.mean == pytest.approx(-1.0, abs=0.1) and len(slopes.per_seed) == 4
    b = np.array(slopes.per_seed)
    assert slopes.ci == pytest.approx(3.182446 * b.std(ddof=1) / 2, rel=1e-5)  # t_{0.975, 3} sd / sqrt(4)
    assert slopes.direction == "falls"
    mixed = runs[:3] + [synthetic_run(+3.0, 9)]  # one seed the other way widens the interval over 0
    assert seed_slopes(mixed, "program_loc").direction == "flat"
    assert seed_slopes(runs[:1], "program_loc").direction == "flat"  # one seed: no interval, no direction


def test_welch_difference_on_hand_numbers():
    d = welch_difference([1.0, 2.0, 3.0, 4.0], [0.0, 0.0, 1.0, 1.0])
    se = math.sqrt(np.var([1, 2, 3, 4], ddof=1) / 4 + np.var([0, 0, 1, 1], ddof=1) / 4)
    qa, qb = np.var([1, 2, 3, 4], ddof=1) / 4, np.var([0, 0, 1, 1], ddof=1) / 4
    df = (qa + qb) ** 2 / (qa ** 2 / 3 + qb ** 2 / 3)
    assert d["difference"] == 2.0 and d["df"] == pytest.approx(df, abs=0.01)
    assert d["ci"] == pytest.approx(t_975(int(df)) * se, abs=1e-4)
    assert welch_difference([1.0], [0.0, 1.0])["ci"] is None
    assert all_of(["holds"] * 4) == "holds" and all_of(["fails"] * 4) == "fails"
    assert all_of(["holds", "holds", "inconclusive", "holds"]) == "inconclusive"


def test_seed_band_is_the_t_interval_of_the_seed_mean():
    runs = [synthetic_run(0.0, seed) for seed in range(3)]
    band = seed_band(runs, "program_loc", smooth=False)
    values = np.array([runs[s][0]["program_loc"] for s in range(3)])
    assert band["mean"][0] == pytest.approx(values.mean())
    assert band["hi"][0] - band["mean"][0] == pytest.approx(4.302653 * values.std(ddof=1) / np.sqrt(3), rel=1e-5)


def probe_counts(rate: float, tasks: int = 60, samples: int = 4, shift: int = 0) -> list[int]:
    """Per-task correct counts whose mean rate is about ``rate`` (a deterministic spread over the tasks)."""
    return [min(samples, max(0, round(rate * samples + ((t * 7 + shift) % 5 - 2) * 0.5))) for t in range(tasks)]


def test_verdicts_follow_the_slopes_symmetrically_with_enough_seeds():
    """Synthetic runs with a known interaction: population +0.8, single -0.8 per 100 steps, 4 seeds each."""
    population = [synthetic_run(+0.8, seed) for seed in range(4)]
    single = [synthetic_run(-0.8, seed + 10, written=3) for seed in range(4)]
    probes = {"population": [[probe_counts(0.5, shift=s), probe_counts(0.45, shift=s + 1)] for s in range(4)],
              "single": [[probe_counts(0.25, shift=s)] for s in range(4)], "base": probe_counts(0.2), "samples": 4}
    summary = study_summary(population, single, probes)
    assert summary["powered"] and summary["min_seeds"] == 4
    verdicts = summary["verdicts"]
    interaction = summary["comparisons"]["population_minus_single_complexity_slope"]
    for key in COMPLEXITY:
        assert interaction[key]["difference"] == pytest.approx(1.6, abs=0.15) and interaction[key]["verdict"] == "holds"
    assert verdicts["population_minus_single_complexity_slope"] == "holds"
    assert verdicts["single_complexity_down"] == "holds"
    assert verdicts["population_complexity_up"] == "holds"
    assert verdicts["population_mean_probe_ge_single"] == "holds"
    assert verdicts["weakest_member_probe_ge_single"] == "holds"
    # The same coverage per step with twice the programs: at 180 programs (the single agent's end) the population
    # has written them by step 30 and covers half as much.
    assert summary["comparisons"]["coverage_at_equal_programs"]["programs"] == 180
    assert verdicts["population_coverage_at_equal_programs_higher"] == "fails"
    weakest = summary["comparisons"]["probe_weakest_member_minus_single_weakest_of_n"]
    assert weakest["single_draws"] == 2 and weakest["b"] <= summary["comparisons"]["probe_weakest_member_minus_single"]["b"]
    flipped = study_summary(single, population)["verdicts"]  # the same rule each way
    assert flipped["population_minus_single_complexity_slope"] == "fails"
    assert flipped["single_complexity_down"] == "fails" and flipped["population_complexity_up"] == "fails"
    assert summary["single"]["metrics"]["unsolved_share"]["first"] == pytest.approx(0.4)
    assert summary["single"]["proposer_token_share"] == pytest.approx(0.25)
    level = study_summary([synthetic_run(0.0, s) for s in range(4)], [synthetic_run(0.0, s + 20) for s in range(4)])
    assert level["verdicts"]["population_minus_single_complexity_slope"] == "inconclusive"  # no effect: no claim


def test_under_four_seeds_no_verdict_is_quoted():
    population = [synthetic_run(+0.8, seed) for seed in range(2)]
    single = [synthetic_run(-0.8, seed + 10) for seed in range(2)]
    summary = study_summary(population, single)
    assert not summary["powered"]
    assert set(summary["verdicts"].values()) == {"inconclusive"}
    assert summary["unpowered"]["population_minus_single_complexity_slope"] == "holds"  # computed, kept apart


def test_probe_difference_is_paired_by_task_and_bootstrapped_over_tasks_and_seeds():
    hard = [0] * 30 + [4] * 30  # half the tasks nobody solves, half everybody: the task mix is shared by both arms
    better = [[[min(4, c + (t % 2)) for t, c in enumerate(hard)]] for _ in range(4)]
    d = paired_probe_difference(better, [[hard]] * 4, samples=4)
    assert d["difference"] == pytest.approx(15 / 240)  # +1 answer on half of the unsolved half: 15 of 240
    assert 0 < d["lo"] <= d["difference"] <= d["hi"]  # pairing removes the tasks' spread from the interval
    same = paired_probe_difference([[hard]] * 4, [[hard]] * 4, samples=4)
    assert same["difference"] == 0 and same["lo"] == same["hi"] == 0
    with pytest.raises(ValueError, match="same tasks"):
        paired_probe_difference([[hard]], [[hard[:10]]], samples=4)
    weakest = paired_probe_difference([[hard, [4] * 60]] * 4, [[hard]] * 4, samples=4, weakest=True)
    assert weakest["difference"] == 0  # the weakest student is the one like the single agent


def test_lineages_coverage_at_and_seed_drain():
    rows = synthetic_run(0.0, 0, steps=40)
    rows[0]["members"] = [{"id": "t0", "role": "teacher"}, {"id": "t1", "role": "teacher"}]
    rows[9]["evolution"] = [{"child": "t2", "parents": ["t0"], "replaced": "t1"}]
    rows[19]["evolution"] = [{"child": "t3", "parents": ["t2", "t0"], "replaced": "t0"}]
    rows[-1]["members"] = [{"id": "t2", "role": "teacher"}, {"id": "t3", "role": "teacher"}]
    assert lineages(rows) == 1  # both living teachers descend from t0: one lineage left
    assert coverage_at(rows, 6 * 5) == rows[4]["coverage"]
    # Within a step, linear between the counts before and after it (from (0, 0) before step 1); past the end, the end.
    assert coverage_at(rows, 6 * 4 + 3) == pytest.approx((rows[3]["coverage"] + rows[4]["coverage"]) / 2)
    assert coverage_at(rows, 2) == pytest.approx(rows[0]["coverage"] / 3)
    assert coverage_at(rows, 10_000) == rows[-1]["coverage"]
    assert seed_drain_step(rows) == 23  # the first step with under 10 % seed draws (1 - 23/25)


def concave_coverage_run(written: int, seed: int, steps: int = 60) -> list[dict]:
    """A run whose coverage is one concave curve of its written programs, 40 sqrt(count) (a seed's offset apart)."""
    rows, count = synthetic_run(0.0, seed, steps=steps, written=written), 0
    for row in rows:
        count += written
        row["coverage"] = 40 * math.sqrt(count) + seed % 3
    return rows


def test_coverage_is_compared_at_an_equal_number_of_written_programs():
    """Both arms cover the same for the same programs; the population writes twice as many. Per program it covers
    less by construction (the concave curve); at an equal count the arms are level and the verdict says nothing."""
    population = [concave_coverage_run(6, s) for s in range(4)]
    single = [concave_coverage_run(3, s + 1) for s in range(4)]
    summary = study_summary(population, single)
    per_program = summary["comparisons"]["coverage_per_program"]
    assert per_program["difference"] < 0 and per_program["difference"] + per_program["ci"] < 0  # the old, biased one
    matched = summary["comparisons"]["coverage_at_equal_programs"]
    assert matched == coverage_at_equal_programs(population, single) and matched["programs"] == 180
    assert matched["per_seed"]["population"][0] == pytest.approx(40 * math.sqrt(180), abs=0.01)
    assert abs(matched["difference"]) < 1 and summary["verdicts"]["population_coverage_at_equal_programs_higher"] == "inconclusive"
    assert "population_coverage_per_proposal_higher" not in summary["verdicts"]


def test_the_weakest_member_is_matched_by_the_weakest_of_as_many_single_agent_draws():
    """A population of exact copies of the single agent (each student's answers drawn from the same per-task rates):
    its weakest student lies below the single agent by the minimum of 4 noisy draws alone. The matched single score
    is the minimum of 4 resampled answer sets: it moves down by about E[min of 4 standard normals] = -1.029 times the
    sd of a resampled mean rate (the expected bias, -0.016 here, is the unmatched difference's), and the matched
    interval holds the copies' true difference, 0."""
    rng = np.random.default_rng(1)
    tasks, samples, seeds, students = 200, 4, 8, 4
    rates = rng.uniform(0.05, 0.6, size=tasks)
    single = [[rng.binomial(samples, rates).tolist()] for _ in range(seeds)]
    copies = [[rng.binomial(samples, rates).tolist() for _ in range(students)] for _ in range(seeds)]
    plain = paired_probe_difference(copies, single, samples, weakest=True)
    matched = paired_probe_difference(copies, single, samples, weakest=True, single_draws=students)
    observed = [np.array(seed[0]) / samples for seed in single]
    sd = np.mean([math.sqrt(float((p * (1 - p)).sum()) / samples) / tasks for p in observed])
    assert plain["b"] - matched["b"] == pytest.approx(1.029 * sd, rel=0.1)
    assert plain["a"] == matched["a"] and matched["single_draws"] == students
    assert matched["lo"] < 0 < matched["hi"]  # the copies' true difference, 0
    one = paired_probe_difference(copies, single, samples, weakest=True, single_draws=1)
    assert one == plain  # one draw is the single agent as measured


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
    train = {"t0": {"update_norm": 0.5, "kl_to_base": 0.01}, "s0": {"update_norm": 0.25}}
    row = step_row(5, [], Coverage(), ("code_o",), [], [], [], [], [], [], train, [], {})
    assert (row["update_norm/t0"], row["kl_to_base/t0"], row["update_norm/s0"]) == (0.5, 0.01, 0.25)
    assert "kl_to_base/s0" not in row  # no readout of s0 this step


def test_the_members_readouts_are_averaged_per_role_and_trended():
    """``<role>_<stat>``: the mean over the role's members of their update's statistic where they reported it (the KL
    readout every other step here), the single agent's one member under both roles; trended like every rate."""
    from reporting.study import arm_summary, with_derived

    rows = []
    for step in range(1, 21):
        row = synthetic_run(0.0, 0, steps=20)[step - 1]
        row["members"] = [{"id": "t0", "role": "teacher"}, {"id": "t1", "role": "teacher"}, {"id": "s0", "role": "student"}]
        row["train"] = {"t0": {"update_norm": 0.01 * step, "entropy": 0.3}, "t1": {"update_norm": 0.03 * step, "entropy": 0.5},
                        "s0": {"update_norm": 0.1, "entropy": 0.2, **({"kl_to_base": 0.002 * step} if step % 2 == 0 else {})}}
        row["idle_student_share"] = 0.5 if step % 4 == 0 else 0.0
        rows.append(row)
    derived = with_derived(rows)
    assert derived[3]["teacher_update_norm"] == pytest.approx(0.08) and derived[3]["teacher_entropy"] == pytest.approx(0.4)
    assert derived[3]["student_kl_to_base"] == pytest.approx(0.008) and "student_kl_to_base" not in derived[2]
    assert "teacher_kl_to_base" not in derived[3]
    metrics = arm_summary([rows, rows])["metrics"]
    assert metrics["teacher_update_norm"]["slope"] == pytest.approx(2.0)  # 0.02 a step, per 100 steps
    assert metrics["student_kl_to_base"]["slope"] == pytest.approx(0.2)
    idle = metrics["idle_student_share"]  # half the students idle every 4th step: none of steps 1-3, step 20 of 18-20
    assert idle["first"] == 0.0 and idle["last"] == pytest.approx(0.5 / 3, abs=1e-4)
    single = dict(rows[1], members=[{"id": "a0", "role": "agent"}], train={"a0": {"kl_to_base": 0.05}})
    assert with_derived([single])[0]["teacher_kl_to_base"] == with_derived([single])[0]["student_kl_to_base"] == 0.05


def test_one_study_against_another_is_the_welch_difference_of_their_seed_slopes():
    """A learned study whose population falls 1.0 a 100 steps faster than its control's, and whose single agent's
    slope equals the control's: holds/fails by the same rule, and under 4 seeds nothing is quoted."""
    learned = study_summary([synthetic_run(-2.0, s) for s in range(4)], [synthetic_run(-0.5, 10 + s) for s in range(4)])
    control = study_summary([synthetic_run(-1.0, 20 + s) for s in range(4)], [synthetic_run(-0.5, 30 + s) for s in range(4)])
    against = study_against(learned, control, keys=COMPLEXITY)
    pop = against["population"]["program_loc"]
    assert pop["difference"] == pytest.approx(-1.0, abs=0.1) and pop["verdict"] == "fails" and pop["powered"]
    expected = welch_difference(learned["population"]["metrics"]["program_loc"]["per_seed"],
                                control["population"]["metrics"]["program_loc"]["per_seed"])
    assert {k: pop[k] for k in expected} == expected
    assert against["single"]["program_loc"]["verdict"] == "inconclusive"
    assert study_against(control, learned, keys=COMPLEXITY)["population"]["program_loc"]["verdict"] == "holds"
    few = study_summary([synthetic_run(-2.0, s) for s in range(2)], [synthetic_run(-0.5, s) for s in range(2)])
    unpowered = study_against(few, control, keys=COMPLEXITY)["population"]["program_loc"]
    assert unpowered["verdict"] == "inconclusive" and not unpowered["powered"]
    assert pop["paired"] is None  # summaries without their seeds: nothing to pair


def test_studies_that_share_seeds_are_also_compared_paired_by_seed():
    """Each seed's slope has a part both studies share (their common random numbers): Welch counts it as noise and
    cannot tell the -1.0 effect from 0; paired by seed it cancels. Seeds missing on one side are left out."""
    shared = {0: -1.5, 1: 0.5, 2: 1.2, 3: -0.4, 4: 0.9}
    ids = {"population": [0, 1, 2, 3], "single": [0, 1, 2, 3]}
    learned = study_summary([synthetic_run(-2.0 + shared[s], s) for s in range(4)],
                            [synthetic_run(-0.5, 10 + s) for s in range(4)], seed_ids=ids)
    control = study_summary([synthetic_run(-1.0 + shared[s], 20 + s) for s in range(1, 5)],
                            [synthetic_run(-0.5, 30 + s) for s in range(1, 5)],
                            seed_ids={"population": [1, 2, 3, 4], "single": [1, 2, 3, 4]})
    assert learned["population"]["seed_ids"] == [0, 1, 2, 3]
    pop = study_against(learned, control, keys=COMPLEXITY)["population"]["program_loc"]
    assert pop["verdict"] == "inconclusive"  # Welch: the shared spread swamps the effect
    paired = pop["paired"]
    assert paired["seeds"] == [1, 2, 3] and paired["difference"] == pytest.approx(-1.0, abs=0.1)
    d = np.array(learned["population"]["metrics"]["program_loc"]["per_seed"][1:]) - \
        np.array(control["population"]["metrics"]["program_loc"]["per_seed"][:3])
    assert paired["ci"] == pytest.approx(t_975(2) * d.std(ddof=1) / math.sqrt(3), abs=1e-4)
    assert paired["ci"] < 0.2 and paired["correlation"] > 0.99
    assert paired["verdict"] == "inconclusive"  # 3 pairs: under the seed minimum, nothing quoted
    both = study_summary([synthetic_run(-1.0 + shared[s], 20 + s) for s in range(4)],
                         [synthetic_run(-0.5, 30 + s) for s in range(4)], seed_ids=ids)
    assert study_against(learned, both, keys=COMPLEXITY)["population"]["program_loc"]["paired"]["verdict"] == "fails"

