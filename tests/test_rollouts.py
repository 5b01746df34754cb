"""The pure glue of a step: proposal prompts from references, rho per proposal, rewards per completion."""

from __future__ import annotations

import pytest

from inference.requests import Generation
from rollouts import (
    ProposalJob,
    Sample,
    SolveJob,
    advantage_group,
    proposal_jobs,
    reference_counts,
    solve_rates,
    student_samples,
    teacher_families,
    teacher_samples,
)
from configs.schema import RewardsConfig
from learners.pg_loss import group_normalised_advantages
from verifier.families import Judgement
from verifier.tasks import identity_task


def generation(member: str) -> Generation:
    return Generation(text="x", token_ids=[5, 6], logprobs=[-0.1, -0.2], adapter=member, adapter_version=3,
                      finish_reason="stop", prompt_token_ids=[1, 2, 3])


def test_proposal_jobs_rotate_families_and_consume_references():
    pairs = [("t0", "s1"), ("t1", "s0")]
    families = ["code_o", "code_i", "code_f"]
    counts = reference_counts(pairs, families, 4)
    assert counts == {"code_o": 4, "code_i": 2, "code_f": 2}
    refs = {f: [[identity_task(f if f != "code_f" else "code_o")] for _ in range(n)] for f, n in counts.items()}
    jobs = proposal_jobs(pairs, families, 4, refs, n_inputs=4)
    assert [(j.teacher, j.student, j.family) for j in jobs[:4]] == [
        ("t0", "s1", "code_o"), ("t0", "s1", "code_i"), ("t0", "s1", "code_f"), ("t0", "s1", "code_o")]
    assert jobs[2].reference_program == identity_task("code_o").program
    assert all(j.prompt.startswith("User: ") for j in jobs)


FAMILIES = ["code_o", "code_i", "code_f"]
PAIRS_4X4 = [("t0", "s2"), ("t1", "s0"), ("t2", "s3"), ("t3", "s0")]


def references_for(counts: dict[str, int]) -> dict[str, list[list]]:
    """``counts[family]`` reference lists, each naming its family and index (code_f probes a code_o program)."""
    return {f: [[identity_task(f if f != "code_f" else "code_o")] for _ in range(n)] for f, n in counts.items()}


def jobs_of(pairs, rotation: str, step: int, per_teacher: int = 6):
    counts = reference_counts(pairs, FAMILIES, per_teacher, rotation, step)
    refs = references_for(counts)
    jobs = proposal_jobs(pairs, FAMILIES, per_teacher, refs, 4, None, rotation, step)
    return counts, jobs


def test_task_rotation_is_todays_round_robin_at_every_step():
    """The default: each teacher's 6 tasks are code_o, code_i, code_f, code_o, code_i, code_f whatever the step."""
    expected = [(t, s, FAMILIES[i % 3]) for t, s in PAIRS_4X4 for i in range(6)]
    for step in (1, 2, 3, 7):
        counts, jobs = jobs_of(PAIRS_4X4, "task", step)
        assert [(j.teacher, j.student, j.family) for j in jobs] == expected
        assert counts == {"code_o": 8, "code_i": 8, "code_f": 8}
    assert reference_counts(PAIRS_4X4, FAMILIES, 6) == counts  # the defaults are 'task'
    assert teacher_families(3, FAMILIES, 6) == FAMILIES * 2


def test_step_rotation_gives_each_teacher_one_family_rotating_by_step_and_member():
    seen: dict[str, set[str]] = {t: set() for t, _ in PAIRS_4X4}
    for step in range(1, 7):
        counts, jobs = jobs_of(PAIRS_4X4, "step", step)
        for position, (teacher, student) in enumerate(PAIRS_4X4):
            mine = [j for j in jobs if j.teacher == teacher]
            family = FAMILIES[(step + position) % 3]
            assert [(j.student, j.family) for j in mine] == [(student, family)] * 6
            seen[teacher].add(family)
        assert len({j.family for j in jobs[:18]}) == 3  # the first three teachers cover the three families
        # the references drawn by reference_counts are exactly what proposal_jobs consumes
        assert counts == {f: sum(j.family == f for j in jobs) for f in FAMILIES}
        assert sum(counts.values()) == 24
        assert all(j.reference_program == identity_task("code_o").program for j in jobs if j.family == "code_f")
    assert all(families == set(FAMILIES) for families in seen.values())  # over three steps, every family
    with pytest.raises(ValueError, match="family rotation"):
        teacher_families(0, FAMILIES, 6, "member")


def test_step_rotation_with_one_family_or_one_agent():
    assert teacher_families(2, ["code_i"], 4, "step", 5) == ["code_i"] * 4
    for step in (1, 2, 3):  # the single agent plays itself: its 6 proposals of a step are one family
        _, jobs = jobs_of([("a0", "a0")], "step", step)
        assert [j.family for j in jobs] == [FAMILIES[step % 3]] * 6


def test_step_rotation_makes_a_teachers_advantage_group_hold_all_its_proposals():
    """Groups are (member, role, family) (rollouts.samples.advantage_group with the learner's slot): with 'task' a
    teacher's 6 proposals make three groups of two, with 'step' one group of six."""
    from rollouts import learner_samples

    slots = {t: i for i, (t, _) in enumerate(PAIRS_4X4)}
    for rotation, sizes in (("task", [2] * 12), ("step", [6] * 4)):
        _, jobs = jobs_of(PAIRS_4X4, rotation, step=4)
        for j in jobs:
            j.generation = generation(j.teacher)
        samples = teacher_samples(jobs, [0.5] * len(jobs), RewardsConfig(), single_agent=False)
        batch, _ = learner_samples(samples, slots, {}, "family", "off")
        groups: dict[tuple, int] = {}
        for b in batch:
            groups[(b.slot, b.group)] = groups.get((b.slot, b.group), 0) + 1
        assert sorted(groups.values()) == sizes


def test_rho_and_rewards_population_and_single_agent():
    jobs = [ProposalJob("t0", "s0", "code_o", "p", generation=generation("t0")) for _ in range(4)]
    task = identity_task("code_o")
    solves = [SolveJob(task, i, "s0", "q", [generation("s0"), generation("s0")]) for i in (1, 2, 3)]
    verdicts = [
        [Judgement(True, False), Judgement(True, False)],   # rho 0
        [Judgement(True, True), Judgement(False, False)],   # rho 0.5 (one malformed)
        [Judgement(True, True), Judgement(True, True)],     # rho 1
    ]
    rho = solve_rates(4, solves, verdicts)
    assert rho == [None, 0.0, 0.5, 1.0]
    rewards = RewardsConfig()
    assert [s.reward for s in teacher_samples(jobs, rho, rewards, single_agent=False)] == [-1.0, 0.0, 0.5, 0.0]
    assert [s.reward for s in teacher_samples(jobs, rho, rewards, single_agent=True)] == [-1.0, 0.0, 0.5, 0.0]
    rho_mid = [None, 0.0, 0.25, 1.0]
    assert [s.reward for s in teacher_samples(jobs, rho_mid, rewards, single_agent=False)] == [-1.0, 0.0, 0.75, 0.0]
    students = student_samples(solves, verdicts, rewards)
    assert [s.reward for s in students] == [-0.5, -0.5, 1.0, -1.0, 1.0, 1.0]
    assert all(s.prompt_ids == [1, 2, 3] and s.adapter_version == 3 and s.role == "student" for s in students)
    assert [s.task for s in students] == [s.proposal for s in solves for _ in range(2)]


def test_advantage_groups_per_family_or_per_task():
    """'task' compares a task's rollouts with each other: a task all rollouts solve carries no signal,
    where the family-wide whitening would reward every one of them."""
    rollouts = [Sample("s0", "student", "code_o", [1], [5], [-0.1], r, task=t) for t, r in ((0, 1.0), (0, 1.0), (1, 1.0), (1, -0.5))]
    proposer = Sample("t0", "teacher", "code_o", [1], [5], [-0.1], 0.5)
    assert {advantage_group(s, "family") for s in rollouts} == {("student", "code_o")}
    assert [advantage_group(s, "task") for s in rollouts] == [("student", "code_o", 0)] * 2 + [("student", "code_o", 1)] * 2
    assert advantage_group(proposer, "task") == ("teacher", "code_o")
    with pytest.raises(ValueError, match="baseline"):
        advantage_group(proposer, "prompt")
    rewards = [s.reward for s in rollouts]
    per_task = group_normalised_advantages(rewards, [advantage_group(s, "task") for s in rollouts], [1] * 4)
    per_family = group_normalised_advantages(rewards, [advantage_group(s, "family") for s in rollouts], [1] * 4)
    assert per_task[:2].tolist() == [0.0, 0.0] and per_task[2] > 0 > per_task[3]
    assert per_family[0] > 0 and per_family[1] > 0


# -- prompts in a style, bounded tasks, dropped requests ---------------------------------------------------------

import pytest  # noqa: E402

from rollouts import (  # noqa: E402
    StepPrompts,
    bounded_validations,
    drop_rejected_proposals,
    drop_rejected_solves,
    judge_items,
    parsed_proposals,
    prompt_metrics,
)
from configs import load_config  # noqa: E402
from tests.conftest import build_tokenizer  # noqa: E402
from verifier.families import Validation, validate_proposals  # noqa: E402
from verifier.prompts import teacher_response  # noqa: E402
from verifier.sandbox import Verifier  # noqa: E402
from verifier.tasks import Task  # noqa: E402


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return build_tokenizer(tmp_path_factory.mktemp("rollouts_tok"))


@pytest.fixture(scope="module")
def verifier():
    with Verifier() as v:
        yield v


def step_prompts(tokenizer, *overrides: str) -> StepPrompts:
    return StepPrompts.from_config(load_config(None, ["tasks.prompt_style=r1", *overrides]), tokenizer=tokenizer)


def big_task(i: int, lines: int) -> Task:
    body = "".join(f"    x{k} = a + {k} * {i}\n" for k in range(lines))
    return Task("code_o", f"def f(a):\n{body}    return a", [str(i)], [str(i)])


def test_references_are_trimmed_longest_first_to_the_prompt_budget(tokenizer):
    refs = [big_task(i, lines=2 + 6 * (i % 4)) for i in range(16)]
    bare = step_prompts(tokenizer, "model.max_seq_len=100000").prompter
    room = bare.count_tokens(bare.teacher("code_o", [])) + 1500  # the framing and rules, and room for some references
    prompts = step_prompts(tokenizer, f"model.max_seq_len={room + 256}", "inference.max_tokens=256", "tasks.references_k=16")
    full = prompts.prompter.teacher("code_o", refs)
    assert prompts.count_tokens(full) > prompts.budget  # all 16 would not fit
    (job,) = proposal_jobs([("t0", "s0")], ["code_o"], 1, {"code_o": [refs]}, n_inputs=4, prompts=prompts)
    assert prompts.count_tokens(job.prompt) <= prompts.budget == room
    assert 0 < job.references < 16 and job.references + job.references_dropped == 16
    kept = [t for t in refs if t.program in job.prompt]
    assert len(kept) == job.references and max(len(t.program) for t in kept) <= min(
        len(t.program) for t in refs if t not in kept)  # the longest went first


def test_proposals_over_the_size_limits_are_invalid_with_the_reason(tokenizer, verifier):
    prompts = step_prompts(tokenizer, "tasks.max_program_chars=200", "tasks.max_program_tokens=40",
                           "tasks.max_input_chars=20", "tasks.max_output_chars=30")
    cases = {
        "long program": (big_task(1, 20).program, "1", "program is 4"),
        "many tokens": ("def f(a):\n    return a  # " + "\u00e9\u4e2d" * 15, "1", "tokens, over the limit of 40 (tasks.max_program_tokens)"),
        "long input": ("def f(a):\n    return 1", repr("x" * 30), "input is 32 characters, over the limit of 20 (tasks.max_input_chars)"),
        "fine": ("def f(a):\n    return a * 2", "3", None),
        "long output": ("def f(a):\n    return 'y' * a", "40", "output is 42 characters, over the limit of 30 (tasks.max_output_chars)"),
    }
    jobs = [ProposalJob("t0", "s0", "code_o", "p", text=teacher_response("code_o", program=p, inputs=[i]),
                        generation=generation("t0")) for p, i, _ in cases.values()]
    parsed = parsed_proposals(jobs, 4, prompts)
    checked = bounded_validations(validate_proposals(verifier, "code_o", parsed), prompts)
    for (name, (_, _, reason)), v in zip(cases.items(), checked):
        if reason is None:
            assert v.valid, (name, v.reason)
        else:
            assert not v.valid and reason in v.reason, (name, v.reason)
    rho = [None if not v.valid else 0.5 for v in checked]
    rewards = [s.reward for s in teacher_samples(jobs, rho, RewardsConfig(), single_agent=False)]
    assert rewards == [-1.0, -1.0, -1.0, 0.5, -1.0]


def test_a_task_whose_student_prompt_cannot_fit_is_invalid(tokenizer):
    small, large = Task("code_o", "def f(a):\n    return a", ["1"], ["1"]), big_task(3, 60)
    bare = step_prompts(tokenizer, "model.max_seq_len=100000").prompter
    room = bare.count_tokens(bare.student(small)) + 200
    prompts = step_prompts(tokenizer, f"model.max_seq_len={room + 256}", "inference.max_tokens=256")
    assert prompts.count_tokens(prompts.prompter.student(large)) > prompts.budget
    ok, too_large = bounded_validations([Validation(True, small, None), Validation(True, large, None)], prompts)
    assert ok.valid and not too_large.valid and too_large.task is None
    assert "too large to pose" in too_large.reason and f"budget of {prompts.budget}" in too_large.reason


def rejected(member: str, n: int = 1) -> list[Generation]:
    return [Generation("", [], [], member, 1, "rejected", error="request 0 does not fit the context: ...") for _ in range(n)]


def test_rejected_requests_are_dropped_alone_and_counted(tokenizer):
    prompts = step_prompts(tokenizer)
    jobs = [ProposalJob("t0", "s0", "code_o", "p", generation=generation("t0")),
            ProposalJob("t1", "s1", "code_i", "p", generation=rejected("t1")[0], references_dropped=2),
            ProposalJob("t0", "s0", "code_f", "p", generation=generation("t0"), references_dropped=1)]
    kept, dropped = drop_rejected_proposals(jobs)
    assert kept == [jobs[0], jobs[2]] and [(d.role, d.member, d.family) for d in dropped] == [("teacher", "t1", "code_i")]
    task = identity_task("code_o")
    validations = [Validation(True, task, None), Validation(True, task, None)]
    solves = [SolveJob(task, 0, "s0", "q", [generation("s0")] * 2), SolveJob(task, 1, "s0", "q", rejected("s0", 2))]
    solves_kept, validations, dropped_solves = drop_rejected_solves(solves, validations)
    assert solves_kept == solves[:1] and validations[0].valid and not validations[1].valid
    assert "solver request was rejected" in validations[1].reason and dropped_solves[0].role == "student"
    cut = Generation("x", [5], [-0.1], "s0", 1, "length", prompt_token_ids=[1] * 9)
    assert judge_items([SolveJob(task, 0, "s0", "q", [generation("s0"), cut])]) == [(task, "x", False), (task, "x", True)]
    row = prompt_metrics(kept, solves_kept, dropped + dropped_solves, prompts)
    assert row["dropped_requests"] == {"teacher": 1, "student": 1} and row["references_dropped"] == 1
    assert row["prompt_tokens_max"] == 3 and row["prompt_budget"] == prompts.budget and row["prompt_style"] == "r1"
    assert sum(row["dropped_reasons"].values()) == 2


def test_step_prompts_refuse_a_context_with_no_room(tokenizer):
    with pytest.raises(ValueError, match="leaves no room for a prompt"):
        step_prompts(tokenizer, "model.max_seq_len=256", "inference.max_tokens=256")


@pytest.mark.parametrize(
    "logprobs, problem",
    [
        ([-0.1, -0.2], None),
        ([0.0, 0.0], None),  # greedy rows: log 1
        (None, "missing"),
        ([], "missing"),
        ([-0.1], "misaligned"),
        ([-0.1, -0.2, -0.3], "misaligned"),
        ([-0.1, float("nan")], "non-finite"),
        ([-0.1, float("-inf")], "non-finite"),
        ([-0.1, 0.5], "above 0"),
    ],
)
def test_samples_without_aligned_behaviour_logprobs_are_dropped_and_counted(logprobs, problem):
    from rollouts import behaviour_problem, split_by_behaviour

    bad = Sample("s0", "student", "code_o", [1, 2], [5, 6], logprobs, 1.0)
    good = Sample("s1", "student", "code_o", [1, 2], [5, 6], [-0.3, -0.4], 1.0)
    why = behaviour_problem(bad)
    assert (why is None) if problem is None else (problem in why)
    kept, dropped = split_by_behaviour([good, bad, bad])
    if problem is None:
        assert kept == [good, bad, bad] and dropped == {}
    else:
        assert kept == [good] and dropped == {"s0": 2}


def test_learner_samples_carry_behaviour_logprobs_only_with_the_correction_and_count_what_is_dropped():
    from rollouts import learner_samples

    good = Sample("s0", "student", "code_o", [1, 2], [5, 6], [-0.1, -0.2], 1.0, adapter_version=3)
    stale = Sample("s0", "student", "code_i", [1, 2], [5], [-0.3], -1.0, adapter_version=2)
    bad = Sample("s1", "student", "code_o", [1], [5, 6, 7], [-0.1], 0.5, adapter_version=4)
    empty = Sample("s1", "student", "code_o", [1], [], [], 0.5, adapter_version=4)
    slots, versions = {"s0": 0, "s1": 1}, {"s0": 3, "s1": 4}
    batch, extra = learner_samples([good, stale, bad, empty], slots, versions, "family", "off")
    assert [(b.slot, b.behaviour_logprobs) for b in batch] == [(0, None), (0, None), (1, None)] and extra == {}
    batch, extra = learner_samples([good, stale, bad, empty], slots, versions, "family", "tis")
    assert [(b.slot, list(b.behaviour_logprobs), b.group) for b in batch] == [
        (0, [-0.1, -0.2], ("student", "code_o")), (0, [-0.3], ("student", "code_i"))]
    assert extra == {"s0": {"dropped_behaviour": 0.0, "behind": 0.5}, "s1": {"dropped_behaviour": 1.0, "behind": 0.0}}
