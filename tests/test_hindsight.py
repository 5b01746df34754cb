"""Hindsight supervision (``rollouts.hindsight``, off by default): for a valid task no rollout solved, the known
answer becomes a supervised target that the real verifier judges correct, joins no advantage group, and raises the
student's probability of that answer in a real update."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from configs import load_config
from configs.schema import Config
from inference.requests import Generation
from learners.adapter_optim import AdapterOptimizers
from learners.batching import Sample as LearnerSample
from learners.data_parallel import step_targets
from learners.multi_lora import LoRASpec, MultiLoRAModel
from learners.pg_loss import PGConfig
from learners.policy_learner import PolicyLearner, UpdateConfig, forward_loss_tokens
from learners.batching import micro_batches
from rollouts import SolveJob, StepPrompts
from rollouts.hindsight import hindsight_samples
from tinycoder import ensure_model
from verifier.families import judge_answers
from verifier.sandbox import Verifier
from verifier.tasks import Task

PROGRAM = "def f(a, b):\n    return a * 2 + len(b)"
TASKS = [Task("code_o", PROGRAM, ["3, 'xy'"], ["8"]), Task("code_i", PROGRAM, ["3, 'xy'"], ["8"]),
         Task("code_f", PROGRAM, ["1, ''", "2, 'a'", "0, 'abc'"], ["2", "5", "3"], message="double a, add b's length")]


@pytest.fixture(scope="module")
def model_dir():
    return ensure_model("test", progress=False)


@pytest.mark.parametrize("style", ["compact", "r1"])
def test_targets_are_the_known_answers_and_the_verifier_accepts_them(model_dir, style):
    config = load_config(None, ["model.tiny_variant=test", f"tasks.prompt_style={style}", "rl.hindsight_coef=0.5"])
    prompts = StepPrompts.from_config(config, model_dir)
    tokenizer = prompts.prompter.tokenizer
    solves = []
    for i, task in enumerate(TASKS):
        prompt = prompts.prompter.student(task)
        ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        gen = Generation("wrong", [5, 6], [-1.0, -1.0], "s0", 3, "stop", prompt_token_ids=ids)
        solves.append(SolveJob(task, i, "s0", prompt, [gen, gen]))
    rho = [0.0, 0.0, 0.0]
    targets = hindsight_samples(solves, rho, prompts, coef=0.5)
    assert [t.family for t in targets] == ["code_o", "code_i", "code_f"]
    assert all(t.fixed_advantage == 0.5 and t.role == "student" and t.member == "s0" for t in targets)
    assert all(t.completion_ids[-1] == tokenizer.eos_token_id for t in targets)
    assert all(t.prompt_ids == s.generations[0].prompt_token_ids for t, s in zip(targets, solves))
    texts = [tokenizer.decode(t.completion_ids, skip_special_tokens=True) for t in targets]
    if style == "r1":  # the prompt ends with <think>: the completion goes on from there
        texts = ["<think>" + text for text in texts]
    with Verifier() as verifier:
        verdicts = judge_answers(verifier, list(zip(TASKS, texts)))
    assert [v.correct for v in verdicts] == [True, True, True], [v.reason for v in verdicts]
    assert hindsight_samples(solves, [0.25, None, 0.0], prompts, coef=0.5)[0].family == "code_f"  # only rho = 0
    assert hindsight_samples(solves, rho, prompts, coef=0.0) == []  # off by default


def test_a_target_keeps_its_advantage_and_raises_the_answers_probability(tiny_qwen2):
    vocab = AutoModelForCausalLM.from_pretrained(tiny_qwen2).config.vocab_size
    g = torch.Generator().manual_seed(3)
    ids = [torch.randint(4, vocab, (10,), generator=g).tolist() for _ in range(3)]
    sampled = [LearnerSample(0, i[:4], i[4:], r, group=("student", "code_o")) for i, r in zip(ids[:2], (1.0, -0.5))]
    target = LearnerSample(0, ids[2][:4], ids[2][4:], 0.0, group=("student", "code_o"), fixed_advantage=0.5)
    targets = step_targets(sampled + [target])
    torch.testing.assert_close(targets.advantages, torch.tensor([1.0, -1.0, 0.5]))  # the pair whitens alone
    assert targets.slot_token_totals == {0: 18.0}  # the target's tokens count in N_a

    base = AutoModelForCausalLM.from_pretrained(tiny_qwen2, dtype=torch.float32)
    model = MultiLoRAModel(base, LoRASpec(rank=4, alpha=8, num_slots=1), init_b_std=0.0, seed=0)
    learner = PolicyLearner(model, AdapterOptimizers(model, lr=1e-2), PGConfig(), UpdateConfig(micro_batch_tokens=64), 0)

    def answer_logprob() -> float:
        (batch,) = micro_batches([target], 0, 64, "pad")
        with torch.no_grad():
            return float(forward_loss_tokens(model, batch).logprobs.sum())

    before = answer_logprob()
    for _ in range(3):
        learner.step([target])
    assert answer_logprob() > before + 0.1


def test_hindsight_needs_the_importance_correction_off():
    with pytest.raises(ValueError, match="rl.hindsight_coef"):
        Config.model_validate({"rl": {"hindsight_coef": 0.5, "importance_correction": "tis"}})
    assert Config().rl.hindsight_coef == 0
