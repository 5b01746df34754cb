"""The league actor: a thin Ray shell over the league, the replacement policy and the task buffers.

It owns the member registry (ids, roles, ratings, lineage), PFSP matching, one FIFO task buffer per
family (reference sampling for proposal prompts), the evolution schedule and operators, and it
publishes the per-step Ray metrics. All of its state round-trips through ``state_dict``.
"""

from __future__ import annotations

import random
from typing import Any

import ray

LEAGUE_ROLE = {"teacher": "teacher", "student": "student", "agent": "both"}


@ray.remote(max_restarts=0)  # stateful: the driver recovers it from a checkpoint (actors.driver)
class LeagueActor:
    def __init__(self, config: dict[str, Any], members: list[tuple[str, str]], seed_file: str | None):
        from actors.cluster import route_actor_output

        route_actor_output("league")
        from configs import Config
        from evolution.heap import reuse_freed_blocks
        from evolution.league import League
        from evolution.replacement import ReplacementPolicy
        from verifier.buffers import make_buffers

        self.config = cfg = Config.model_validate(config)
        reuse_freed_blocks()  # children reuse the memory of the last one instead of faulting it in again
        lg = cfg.league
        self.league = League(mu=lg.mu, sigma=lg.sigma, beta=lg.beta, tau=lg.tau, draw_probability=lg.draw_probability,
                             solve_threshold=lg.solve_threshold, pfsp_weighting=lg.pfsp_weighting,
                             pfsp_exponent=lg.pfsp_exponent, epsilon=lg.epsilon, winrate_decay=lg.winrate_decay,
                             unsolved_is_teacher_win=lg.unsolved_is_teacher_win, matching=lg.matching, seed=cfg.run.seed)
        for member, role in members:
            self.league.add_member(member, LEAGUE_ROLE[role])
        self.roles = dict(members)
        ev = cfg.evolution
        self.policy = ReplacementPolicy(
            period=ev.period, operators={k: v.model_dump() for k, v in ev.operators.items()},
            protection_steps=ev.protection_steps, tournament_size=ev.tournament_size,
            max_relative_change=ev.max_relative_change, sigma_reset=ev.sigma_reset, rating_entry=ev.rating_entry, seed=cfg.run.seed,
            enabled=ev.enabled and not cfg.population.single_agent,
        )
        self.buffers = make_buffers(cfg.tasks.buffer_capacity, seed_file, cfg.tasks.families)
        self.rng = random.Random(cfg.run.seed)
        self.next_id = {"teacher": cfg.population.teachers, "student": cfg.population.students}
        self._metrics = None

    def __repr__(self) -> str:
        return "LeagueActor(league)"

    def ready(self) -> bool:
        return True

    # matching and references -------------------------------------------------------------------
    def match(self, step: int) -> list[tuple[str, str]]:
        teachers = [m for m, r in self.roles.items() if r in ("teacher", "agent")]
        students = [m for m, r in self.roles.items() if r in ("student", "agent")]
        pairs = self.league.match(teachers, students)
        return [(t, pairs[t]) for t in teachers]

    def references(self, counts: dict[str, int], k: int) -> dict[str, list[list[Any]]]:
        """``counts[family]`` lists of K reference tasks; for code_f one task whose program the teacher
        probes, drawn from the code_o/code_i buffers as in AZR (the code_f buffer when those are absent)."""
        out: dict[str, list[list[Any]]] = {}
        io_buffers = [self.buffers[f] for f in ("code_o", "code_i") if f in self.buffers] or [self.buffers["code_f"]]
        for family, n in counts.items():
            if family == "code_f":
                pool = [task for buffer in io_buffers for task in buffer]
                out[family] = [[self.rng.choice(pool)] for _ in range(n)]
            else:
                out[family] = [self.buffers[family].sample(k, self.rng) for _ in range(n)]
        return out

    # results -----------------------------------------------------------------------------------
    def record(self, step: int, outcomes: list[tuple[str, str, bool, float]], valid_tasks: list[dict[str, Any]]) -> None:
        """Rate every match from its per-task (valid, rho) outcomes; valid tasks enter the buffers."""
        from verifier.tasks import Task

        by_pair: dict[tuple[str, str], list[tuple[bool, float]]] = {}
        for teacher, student, valid, rho in outcomes:
            by_pair.setdefault((teacher, student), []).append((valid, rho))
        for (teacher, student), games in by_pair.items():
            self.league.record(teacher, student, games)
        for data in valid_tasks:
            task = Task.from_dict(data)
            task.meta.setdefault("step", step)  # proposed at this step; seed tasks carry no step
            self.buffers[task.family].add(task)

    def members(self) -> list[dict[str, Any]]:
        rows = []
        for member_id in self.league.members():
            m = self.league.member(member_id)
            r = self.league.rating(member_id)
            rows.append({"id": m.id, "role": self.roles[m.id], "mu": round(m.mu, 4), "sigma": round(m.sigma, 4),
                         "conservative": round(r.conservative, 4), "parent": self.policy.parents_of(m.id) or None})
        return rows

    # evolution ---------------------------------------------------------------------------------
    def plan_replacements(self, step: int, last_step: int | None = None) -> list[Any]:
        """Per sub-population: the weakest unprotected member, the parents of its child, the operator; none unless
        evolution is due at ``step`` of a run ending at ``last_step`` (``ReplacementPolicy.due``)."""
        if not self.policy.due(step, last_step):
            return []
        return [sel for role in ("teacher", "student") if (sel := self.policy.select(self.league, role, step)) is not None]

    @ray.method(num_returns=2)
    def make_child(self, selection: Any, *parent_states: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """Make the child from the parents' adapters (``parent_states`` in the order of ``selection.parents``),
        put it in the victim's place; returns (its lineage event, its state dict).

        Two returns, so the driver fetches the event only and hands the state dict's reference on to the
        learner: the parents' and the child's weights move between actors by reference, never through
        the driver.
        """
        import torch

        generator = torch.Generator().manual_seed(self.config.run.seed * 100_003 + selection.step)
        offspring = self.policy.make_child(selection, list(parent_states), generator)
        prefix = selection.role[0]
        child_id = f"{prefix}{self.next_id[selection.role]}"
        self.next_id[selection.role] += 1
        record = self.policy.commit(self.league, selection, offspring, child_id=child_id)
        del self.roles[selection.victim]
        self.roles[child_id] = selection.role
        event = {**record.to_dict(), "child": child_id, "replaced": selection.victim}
        return event, offspring.child.state_dict

    # metrics and state -------------------------------------------------------------------------
    def publish_metrics(self, row: dict[str, Any]) -> None:
        from actors.telemetry import StepMetrics

        if self._metrics is None:
            self._metrics = StepMetrics()
        self._metrics.publish(row)

    def state_dict(self) -> dict[str, Any]:
        return {
            "league": self.league.state_dict(),
            "policy": self.policy.state_dict(),
            "buffers": {f: b.state_dict() for f, b in self.buffers.items()},
            "roles": self.roles,
            "next_id": self.next_id,
            "rng": list(self.rng.getstate()[1]) + [self.rng.getstate()[0], self.rng.getstate()[2]],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.league.load_state_dict(state["league"])
        self.policy.load_state_dict(state["policy"])
        for family, buffer_state in state["buffers"].items():
            self.buffers[family].load_state_dict(buffer_state)
        self.roles = dict(state["roles"])
        self.next_id = dict(state["next_id"])
        rng = state["rng"]
        self.rng.setstate((rng[-2], tuple(rng[:-2]), rng[-1]))
