"""The time plan's overlapped steps: the formula on a hand-checked case, against the loop's schedule, in the plan."""

from __future__ import annotations

import pytest

from actors.loop import drains_after  # the loop's rule (imports ray; starts nothing)
from configs import PRESETS_DIR, load_config
from planning.time_plan import Cluster, Layout, Overlap, drained_steps, plan_time

from test_time_plan import DIMS, HOST, KIND, LENGTHS  # the hand-checked case's model, device and lengths


def config(*overrides: str):
    return load_config(PRESETS_DIR / "tiny.yaml", [
        "lora.rank=2", "tasks.tasks_per_teacher=4", "tasks.rollouts_k=2", "tasks.families=[code_o]",
        "inference.max_tokens=50", "run.steps=20", "run.checkpoint_every=5", "evolution.period=5", *overrides])


def overlapped(*overrides: str):
    return config("run.max_staleness=1", "rl.importance_correction=tis", "resources.inference_cpus=1",
                  "resources.learner_cpus=1", *overrides)


def test_the_formula_on_a_hand_checked_case():
    # G = 0.1 + 2 + 0.5 + 3 + 0.4 = 6, T = 4, R = 0.3 + 0.2 = 0.5; a quarter of the steps drain
    o = Overlap.of({"league": 0.1, "propose": 2.0, "validate": 0.5, "solve": 3.0, "judge": 0.4, "train": 4.0,
                    "handover": 0.3, "evolve": 0.2}, drained_fraction=0.25)
    assert (o.generation_s, o.train_s, o.rest_s) == pytest.approx((6.0, 4.0, 0.5))
    assert o.serial_step_s == pytest.approx(10.5)
    assert o.step_s == pytest.approx(6.0 + 0.25 * 4.0 + 0.5)  # max + f min + R = 7.5
    assert o.speedup == pytest.approx(10.5 / 7.5)
    assert o.bound == pytest.approx(1 + 4 / 6)
    # the bound is the speed-up of a pipeline that never drains and does nothing else
    assert Overlap(6.0, 4.0, 0.0, 0.0).speedup == pytest.approx(o.bound)
    colocated = Overlap(6.0, 4.0, 0.5, 0.25, possible=False)
    assert colocated.step_s == colocated.serial_step_s and colocated.speedup == 1.0 and colocated.bound == 1.0


def schedule_seconds(cfg, steps: int, g: float, t: float, r: float) -> float:
    """The loop's schedule step by step (actors/loop.py run_step, the driver's drains_after), not the formula:
    a step not generated ahead generates first; an overlapped step's train window holds the next generation."""
    total, ahead = 0.0, False
    for step in range(1, steps + 1):
        if not ahead:
            total += g
        overlap = not drains_after(cfg, step, steps)
        total += (max(g, t) if overlap else t) + r
        ahead = overlap
    return total


@pytest.mark.parametrize("overrides", [(), ("run.checkpoint_every=3",), ("evolution.enabled=false",),
                                       ("run.steps=7", "run.checkpoint_every=8", "evolution.period=8"),
                                       ("run.steps=1",)])
@pytest.mark.parametrize("g,t", [(6.0, 4.0), (2.5, 7.0)])
def test_the_formula_is_the_loops_schedule(overrides, g, t):
    cfg = overlapped(*overrides)
    steps = cfg.run.steps
    assert drained_steps(cfg, steps) == sum(drains_after(cfg, s, steps) for s in range(1, steps + 1))
    o = Overlap(g, t, 0.3, drained_steps(cfg, steps) / steps)
    assert o.step_s * steps == pytest.approx(schedule_seconds(cfg, steps, g, t, 0.3))


def test_the_plan_predicts_overlap_from_its_phases():
    cfg = overlapped()
    plan = plan_time(cfg, DIMS, Layout(1, 1), Cluster(1, 2, "T"), LENGTHS, {"T": KIND}, HOST, checkpointing=False)
    phases = {p.name: p.seconds for p in plan.phases}
    assert plan.drained_fraction == pytest.approx(4 / 20)  # steps 5, 10, 15, 20
    o = plan.overlap()
    assert o.generation_s == pytest.approx(sum(phases[p] for p in ("league", "propose", "validate", "solve", "judge")))
    assert o.train_s == pytest.approx(phases["train"])
    assert o.serial_step_s == pytest.approx(plan.step_seconds)
    assert plan.overlap(0.0).step_s == pytest.approx(max(o.generation_s, o.train_s) + o.rest_s)
    assert "overlapped (run.max_staleness 1, on here)" in plan.render()
    assert plan.to_dict()["overlap"]["overlap_vs_serial"] == pytest.approx(o.speedup, abs=1e-4)
    colocated = plan_time(cfg, DIMS, Layout(2, 2, colocated=True), Cluster(1, 2, "T"), LENGTHS, {"T": KIND}, HOST)
    assert colocated.overlap().speedup == 1.0 and "not possible" in colocated.render()


def test_learners_sharing_cores_on_cpu_train_in_turn():
    """Teachers 2 x 4 x 30 tokens, students 8 x 70 (two of 280): on one shared core the train phase is all tokens',
    on their own cores the busiest learner's; on two shared cores no faster than the busiest."""
    cfg, cpu = config(), Cluster(1, 0, "cpu")

    def train(cores):
        plan = plan_time(cfg, DIMS, Layout(0, 0), cpu, LENGTHS, {"cpu": KIND}, HOST, checkpointing=False, learner_cores=cores)
        return next(p.seconds for p in plan.phases if p.name == "train")

    assert train(1) == pytest.approx(train(None) * (240 + 560) / 560)
    assert train(2) == pytest.approx(train(None))


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="drained fraction"):
        Overlap.of({"train": 1.0}, 1.5)
    with pytest.raises(ValueError, match="learner_cores"):
        plan_time(config(), DIMS, Layout(0, 0), Cluster(1, 0, "cpu"), LENGTHS, {"cpu": KIND}, HOST, learner_cores=0)
    with pytest.raises(ValueError, match="steps 0"):
        drained_steps(config(), 0)
