"""Stress test of the prompt budget on a real local Ray cluster: buffers pre-filled with tasks at the size
limits, K at its maximum, a context too small for some prompts. The step runs to the end: references are
trimmed so every prompt that runs is within budget, the code_f prompts that cannot fit are rejected by the
engine alone and counted in the step's row, and nothing crashes."""

from __future__ import annotations

import json

import pytest

from rollouts import StepPrompts
from configs import load_config
from verifier.tasks import Task

MAX_SEQ_LEN, MAX_TOKENS = 1024, 96


@pytest.fixture(scope="module")
def tiny_model():
    from tinycoder import ensure_model

    return ensure_model("test", progress=False)


def max_size_tasks(prompts: StepPrompts, count: int) -> list[Task]:
    """code_o tasks whose program, input and output each sit just under their character and token limits."""
    limits, tokens = prompts.limits, prompts.count_tokens
    tasks = []
    for i in range(count):
        program = f"def f(a):\n    v = {i}\n"
        while True:
            longer = program + f"    v = (v * {i + 3} + {len(program)}) % 1000003\n"
            if len(longer) + 13 > limits.program_chars or tokens(longer + "    return a") > limits.program_tokens:
                break
            program = longer
        program += "    return a"
        text = "'" + "ab" * 8
        while len(text) + 3 <= limits.input_chars and tokens(text + "ab'") <= min(limits.input_tokens, limits.output_tokens):
            text += "ab"
        text += "'"
        tasks.append(Task("code_o", program, [text], [text]))
    return tasks


@pytest.mark.slow
def test_a_step_with_maximum_size_tasks_and_k_runs_within_budget(tiny_model, tmp_path):
    import ray

    from actors.cluster import connect
    from actors.loop import run_step
    from planning.placement import plan_placement
    from actors.system import System

    overrides = ["model.tiny_variant=test", f"model.max_seq_len={MAX_SEQ_LEN}", f"inference.max_tokens={MAX_TOKENS}",
                 "tasks.references_k=16", "tasks.tasks_per_teacher=3", "tasks.rollouts_k=2",
                 "evolution.enabled=false", "verifier.actors=2"]
    probe = StepPrompts.from_config(load_config(None, overrides), tiny_model)
    seeds = max_size_tasks(probe, 20)
    assert all(probe.limits.task_problem(t, probe.count_tokens) is None for t in seeds)  # at the limits, not over
    assert min(probe.count_tokens(t.program) for t in seeds) > probe.budget  # a code_f prompt of one cannot fit
    seed_file = tmp_path / "seeds.jsonl"
    seed_file.write_text("".join(json.dumps(t.to_dict()) + "\n" for t in seeds))
    config = load_config(None, overrides + [f"tasks.seed_file={seed_file}"])
    prompts = StepPrompts.from_config(config, tiny_model)

    plan = plan_placement(config)
    connect(plan.totals(verifier_on_workers=False)["CPU"], dashboard=False)
    system = System.start(config, plan, str(tiny_model))
    try:
        system.publish_adapters(all_members=True)
        row, _ = run_step(system, 1, prompts)
    finally:
        system.stop()
        ray.shutdown()

    print(json.dumps({k: row[k] for k in ("prompt_budget", "prompt_tokens_max", "references_dropped", "dropped_requests",
                                          "dropped_reasons", "valid_rate", "solve_rate")}))
    teachers = config.population.teachers
    code_f = teachers * sum(1 for i in range(3) if config.tasks.families[i % 3] == "code_f")
    assert row["prompt_budget"] == MAX_SEQ_LEN - MAX_TOKENS
    assert 0 < row["prompt_tokens_max"] <= row["prompt_budget"], "every prompt that ran is within budget"
    assert row["references_dropped"] > 0, "16 maximum-size references cannot all fit: they were trimmed"
    assert row["dropped_requests"]["teacher"] == code_f, "each code_f prompt (one over-long program) is rejected alone"
    assert all("does not fit the context" in reason for reason in row["dropped_reasons"])
    assert sum(row["dropped_reasons"].values()) <= code_f + row["dropped_requests"]["student"]
    assert row["per_family"]["code_f"]["proposals"] == 0 and row["per_family"]["code_o"]["proposals"] == teachers
    assert {"valid_rate", "solve_rate", "teacher_reward", "train"} <= set(row)
