"""Does a teacher move toward the tasks that earn it more? A fixed synthetic curriculum played through the real
reward (``rollouts.teacher_samples``), advantage grouping (``rollouts.learner_samples``), normalisation and update
(``learners.policy_learner.PolicyLearner``) on a tiny Qwen2: whatever the study's regime, a wiring error in that
path (a sign, a group, a floor) shows here as a teacher that does not move toward its better-paid programs."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from configs.schema import RewardsConfig
from inference.requests import Generation
from learners.adapter_optim import AdapterOptimizers
from learners.batching import micro_batches
from learners.multi_lora import LoRASpec, MultiLoRAModel
from learners.pg_loss import PGConfig, group_normalised_advantages
from learners.policy_learner import PolicyLearner, UpdateConfig, forward_loss_tokens
from rollouts import ProposalJob, learner_samples, teacher_samples
from verifier.metrics import program_metrics
from verifier.prompts import teacher_prompt, teacher_response
from verifier.tasks import identity_task

SIMPLE = "def f(a):\n    return a"
COMPLEX = "def f(xs):\n    total = 0\n    for x in xs:\n        if x > 0:\n            total += x\n    return total"
INPUT = "[3, -1, 4]"


@dataclass
class Curriculum:
    """The matched student's fixed solve rates of the simple and the complex task, and the arm."""

    rho_simple: float
    rho_complex: float
    single_agent: bool = False


def proposals(tokenizer) -> list[ProposalJob]:
    """One step of one teacher: a simple and a complex program in each of code_o and code_i (groups of two, as
    in the tiny default), each a real proposal text with the engine's token ids."""
    jobs = []
    for family in ("code_o", "code_i"):
        prompt = teacher_prompt(family, [identity_task(family)])
        prompt_ids = tokenizer(prompt)["input_ids"]
        for program in (SIMPLE, COMPLEX):
            ids = tokenizer(teacher_response(family, program=program, inputs=[INPUT]))["input_ids"]
            generation = Generation(text="", token_ids=ids, logprobs=[-1.0] * len(ids), adapter="t0", adapter_version=0,
                                    finish_reason="stop", prompt_token_ids=prompt_ids)
            jobs.append(ProposalJob("t0", "s0", family, prompt, generation=generation))
    return jobs


def complex_preference(model: MultiLoRAModel, batch_samples) -> float:
    """Mean over families of log pi(complex proposal) - log pi(simple proposal), summed over completion tokens."""
    total = torch.zeros(len(batch_samples), dtype=torch.float64)
    with torch.no_grad():
        for batch in micro_batches(batch_samples, 0, 4096, "pad"):
            tokens = forward_loss_tokens(model, batch)
            total.index_add_(0, tokens.sample, tokens.logprobs.double())
    model.set_adapter_index(None)
    return float((total[1] - total[0] + total[3] - total[2]) / 2)


def preference_change(model_dir, curriculum: Curriculum, norm: str, steps: int = 3) -> tuple[float, list[float]]:
    """Train the teacher ``steps`` times on the curriculum; the change of its complex preference and its rewards."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model = MultiLoRAModel(base, LoRASpec(rank=4, alpha=8, num_slots=1), init_b_std=0.0, seed=0)
    learner = PolicyLearner(model, AdapterOptimizers(model, lr=3e-3), PGConfig(),
                            UpdateConfig(micro_batch_tokens=4096, advantage_norm=norm), pad_token_id=0)
    jobs = proposals(tokenizer)
    rho = [curriculum.rho_simple, curriculum.rho_complex] * 2
    samples = teacher_samples(jobs, rho, RewardsConfig(), curriculum.single_agent)
    batch, _ = learner_samples(samples, {"t0": 0}, {"t0": 0}, "family", "off")
    assert {s.group for s in batch} == {("teacher", "code_o"), ("teacher", "code_i")}
    before = complex_preference(model, batch)
    for _ in range(steps):
        learner.step(batch)
    return complex_preference(model, batch) - before, [s.reward for s in samples]


def test_the_complex_program_is_the_more_complex_one():
    simple, complex_ = program_metrics(SIMPLE), program_metrics(COMPLEX)
    assert all(complex_[k] > simple[k] for k in ("ast_depth", "cyclomatic", "loc", "variables"))


@pytest.mark.parametrize("norm", ["whiten", "center"])
def test_a_teacher_moves_toward_harder_tasks_that_earn_more(tiny_qwen2, norm):
    # Population teacher: the simple task is always solved (rho = 1: reward 0), the complex one sometimes
    # (rho = 0.25: reward 0.75). The teacher must come to prefer the complex program.
    change, rewards = preference_change(tiny_qwen2, Curriculum(rho_simple=1.0, rho_complex=0.25), norm)
    assert rewards == [0.0, 0.75, 0.0, 0.75]
    # Measured: +28.6 nats after 3 steps either way (AdamW's step size hides the advantage's scale).
    assert change > 5, f"the teacher's preference for the complex program moved by {change:+.3f} ({norm})"


def test_the_single_agent_proposer_moves_toward_learnable_tasks(tiny_qwen2):
    # AZR's learnability: rho = 1 earns 0, rho = 0.5 earns 0.5.
    change, rewards = preference_change(tiny_qwen2, Curriculum(1.0, 0.5, single_agent=True), "whiten")
    assert rewards == [0.0, 0.5, 0.0, 0.5]
    assert change > 5


def test_the_floor_sends_a_teacher_of_a_weak_student_to_easier_tasks(tiny_qwen2):
    # The suspected mechanism: a complex task the student never solves earns the floor (0), a simple one
    # solved sometimes earns 1 - rho > 0, so the teacher moves to the simple one. The reward decides, not the wiring.
    change, rewards = preference_change(tiny_qwen2, Curriculum(rho_simple=0.75, rho_complex=0.0), "center")
    assert rewards == [0.25, 0.0, 0.25, 0.0]
    assert change < -5  # measured -24.5


def test_whitening_a_group_of_two_erases_the_reward_gap_and_centring_keeps_it():
    groups, tokens = ["g", "g"], [5, 5]
    small_gap = group_normalised_advantages([0.0, 0.75], groups, tokens)
    large_gap = group_normalised_advantages([-1.0, 0.0], groups, tokens)
    torch.testing.assert_close(small_gap, large_gap)
    torch.testing.assert_close(small_gap.abs(), torch.ones(2), atol=1e-5, rtol=0)
    centred = group_normalised_advantages([0.0, 0.75], groups, tokens, whiten=False)
    torch.testing.assert_close(centred, torch.tensor([-0.375, 0.375]))
    assert group_normalised_advantages([0.5, 0.5], groups, tokens, whiten=False).abs().sum() == 0
