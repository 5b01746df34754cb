"""Ray application metrics (``ray.util.metrics``) for the dashboard and Prometheus.

Exported with Ray's ``ray_`` prefix, e.g. ``ray_populora_member_mu{member="t0",role="teacher"}``.
The league actor publishes the per-step numbers; each verifier actor its own throughput.
"""

from __future__ import annotations

from typing import Any

from ray.util.metrics import Counter, Gauge, Histogram

PHASES = ("match", "propose", "validate", "solve", "judge", "train", "handover", "record", "evolve", "evaluate")


class StepMetrics:
    """Gauges of one step: per-member rating, rates, rewards, phase durations, evolution events."""

    def __init__(self) -> None:
        self.mu = Gauge("populora_member_mu", "TrueSkill mu per member", tag_keys=("member", "role"))
        self.sigma = Gauge("populora_member_sigma", "TrueSkill sigma per member", tag_keys=("member", "role"))
        self.rate = Gauge("populora_rate", "valid-proposal and solve rates", tag_keys=("kind",))
        self.reward = Gauge("populora_reward", "mean reward per role", tag_keys=("role",))
        self.member_reward = Gauge("populora_member_reward", "mean reward per member", tag_keys=("member", "role"))
        self.phase = Histogram(
            "populora_phase_seconds", "duration of each phase of a step",
            boundaries=[0.01, 0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600], tag_keys=("phase",),
        )
        self.evolutions = Counter("populora_evolution_events", "members replaced by evolved children", tag_keys=("role",))
        self.step = Gauge("populora_step", "last completed step")
        self.verifier_queue = Gauge("populora_verifier_queue", "executions submitted in the current phase")

    def publish(self, row: dict[str, Any]) -> None:
        self.step.set(row["step"])
        for member in row["members"]:
            tags = {"member": member["id"], "role": member["role"]}
            self.mu.set(member["mu"], tags=tags)
            self.sigma.set(member["sigma"], tags=tags)
            if member.get("reward") is not None:
                self.member_reward.set(member["reward"], tags=tags)
        for kind in ("valid_rate", "solve_rate"):
            self.rate.set(row[kind], tags={"kind": kind})
        self.reward.set(row["teacher_reward"], tags={"role": "teacher"})
        self.reward.set(row["student_reward"], tags={"role": "student"})
        for phase, seconds in row["phase_seconds"].items():
            self.phase.observe(seconds, tags={"phase": phase})
        for event in row["evolution"]:
            self.evolutions.inc(tags={"role": event["role"]})
        self.verifier_queue.set(row.get("verifier_executions", 0))


class VerifierMetrics:
    """Throughput of one verifier actor."""

    def __init__(self) -> None:
        self.items = Counter("populora_verifier_items", "verifier items (proposals or answers) judged")
        self.throughput = Gauge("populora_verifier_items_per_s", "items per second of the last batch")

    def observe(self, items: int, seconds: float) -> None:
        self.items.inc(items)
        self.throughput.set(items / seconds if seconds > 0 else 0.0)
