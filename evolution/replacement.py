"""Replace the weakest member of each sub-population by an evolved child of strong parents.

Truncation selection with quantile 1/N (PBT's exploit step), where the explore step acts in weight space.
Every ``period`` steps, per role ('teacher', 'student'):

1. **victim** = argmin of the conservative rating mu - 3 sigma over the members outside their protection
   window (a child is protected for ``protection_steps`` steps after birth, so a high-sigma newcomer is not
   culled on noise);
2. **operator** drawn with the configured weights (a crossover only when two distinct parents exist;
   with no feasible operator the child is a clone);
3. **parents**: tournament winners (best conservative rating among ``tournament_size`` members drawn at
   random from everyone but the victim; the second parent of a crossover from the rest);
4. **child** = operator(parents, strength). A child whose largest per-slot relative change of Delta W
   exceeds ``max_relative_change`` (or, for blend_svd, whose truncation error exceeds
   ``max_truncation_error``) is rejected and rebuilt with half the strength (blend: the weight moves
   halfway to the nearer parent; extrapolate: eta halfway back to 1), up to ``max_retries`` times; then
   swap_slots (two parents) or a clone;
5. the child takes the victim's place with sigma = ``sigma_reset`` and (``rating_entry='mean_preserving'``,
   the default) mu = the mean of its parents' mu, after which the whole sub-population, child included,
   moves by -(mu_child - mu_victim) / N. Games between a teacher and a student conserve the sum of their
   mus, but a child entering at its parent's mu in place of the weakest member adds mu_parent - mu_victim
   to its sub-population's sum at every replacement: a 60-step run of the default took both sub-populations'
   mean mu from 25 to 37-38 while the solve rate stayed flat. The shift keeps each sub-population's mean
   mu exactly where games left it and every rating difference inside it (so matching, selection and the
   child's place just below or at its parent are unchanged); culling still uses mu - 3 sigma.
   ``rating_entry='parents'`` is the old rule (no shift). The learner gives the child a fresh optimizer
   state. A lineage record keeps id, parents, operator, strength, step, relative change and the shift.

The three calls can run in different processes: ``select`` and ``commit`` where the league lives,
``make_child`` where the adapters live. ``evolve`` chains them in one process.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from evolution import operators as ops
from evolution.adapter_slots import Adapter
from evolution.league import League
from configs.operators import SPECS, check_strength, default_operators

STATE_VERSION = 1
SUB_POPULATIONS = ("teacher", "student")

DEFAULT_OPERATORS: dict[str, dict[str, float]] = default_operators()
RATING_ENTRIES = ("mean_preserving", "parents")
CLONE = "clone"  # the fallback child (a copy of its parent), never drawn
UNSHRINKABLE = (*(name for name, spec in SPECS.items() if not spec.shrinkable), CLONE)


@dataclass(frozen=True)
class Selection:
    """Who is replaced, by a child of whom, made how."""

    role: str
    victim: str
    parents: tuple[str, ...]
    operator: str
    strength: float
    step: int


@dataclass
class Offspring:
    """The accepted child and every attempt that led to it (operator, strength, changes, accepted)."""

    child: ops.Child
    attempts: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class LineageRecord:
    id: str
    role: str
    parents: list[str]
    operator: str
    strength: float
    step: int
    relative_change: float
    mean_relative_change: float
    truncation_error: float | None
    victim: str
    mu: float
    sigma: float
    attempts: int
    mean_shift: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "LineageRecord":
        return cls(**{**data, "parents": list(data["parents"])})


def _operator_table(spec: Mapping[str, Any] | None) -> dict[str, dict[str, float]]:
    """Normalise {name: {"weight", "strength"}} (dicts or objects with those attributes) and check it."""
    if spec is None:
        return {name: dict(v) for name, v in DEFAULT_OPERATORS.items()}
    table = {}
    for name, value in spec.items():
        if name not in SPECS:
            raise ValueError(f"unknown evolution operator {name!r}; valid: {list(SPECS)}")
        weight = value["weight"] if isinstance(value, Mapping) else getattr(value, "weight")
        strength = value["strength"] if isinstance(value, Mapping) else getattr(value, "strength")
        if not (isinstance(weight, (int, float)) and math.isfinite(weight) and weight >= 0):
            raise ValueError(f"{name}: weight must be a finite number >= 0, got {weight!r}")
        table[name] = {"weight": float(weight), "strength": check_strength(name, strength)}
    if not any(v["weight"] > 0 for v in table.values()):
        raise ValueError("every evolution operator weight is 0")
    return table


def apply_operator(name: str, strength: float, parents: Sequence[Adapter], generator: torch.Generator | None = None) -> ops.Child:
    """``name`` at ``strength`` (a table entry's meaning: blend_svd's weight, swap_slots none) on one parent
    (mutations, clone) or two (crossovers, in order)."""
    if name == CLONE:
        return ops.clone(parents[0])
    if name == "swap_slots":
        return ops.swap_slots(parents[0], parents[1], generator=generator)
    if name == "blend_svd":
        return ops.blend_svd(parents[0], parents[1], weight=strength, generator=generator)
    if SPECS[name].kind == "crossover":
        return ops.OPERATORS[name](parents[0], parents[1], strength=strength, generator=generator)
    return ops.OPERATORS[name](parents[0], strength=strength, generator=generator)


class ReplacementPolicy:
    """When to evolve, whom to replace, with which child (see module docstring)."""

    def __init__(
        self,
        period: int = 10,
        operators: Mapping[str, Any] | None = None,
        protection_steps: int = 10,
        tournament_size: int = 2,
        max_relative_change: float = 0.5,
        sigma_reset: float = 25.0 / 6,
        max_retries: int = 3,
        max_truncation_error: float = 0.5,
        seed: int = 0,
        enabled: bool = True,
        rating_entry: str = "mean_preserving",
    ) -> None:
        checks = [
            (isinstance(period, int) and period >= 1, f"period must be an int >= 1, got {period!r}"),
            (isinstance(protection_steps, int) and protection_steps >= 0, f"protection_steps must be an int >= 0, got {protection_steps!r}"),
            (isinstance(tournament_size, int) and tournament_size >= 1, f"tournament_size must be an int >= 1, got {tournament_size!r}"),
            (max_relative_change > 0, f"max_relative_change must be > 0, got {max_relative_change!r}"),
            (max_truncation_error > 0, f"max_truncation_error must be > 0, got {max_truncation_error!r}"),
            (sigma_reset > 0 and math.isfinite(sigma_reset), f"sigma_reset must be > 0, got {sigma_reset!r}"),
            (isinstance(max_retries, int) and max_retries >= 0, f"max_retries must be an int >= 0, got {max_retries!r}"),
            (rating_entry in RATING_ENTRIES, f"rating_entry must be one of {RATING_ENTRIES}, got {rating_entry!r}"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(f"ReplacementPolicy: {message}")
        self.config: dict[str, Any] = {
            "period": period, "operators": _operator_table(operators), "protection_steps": protection_steps,
            "tournament_size": tournament_size, "max_relative_change": float(max_relative_change),
            "sigma_reset": float(sigma_reset), "max_retries": max_retries,
            "max_truncation_error": float(max_truncation_error), "seed": int(seed), "enabled": bool(enabled),
            "rating_entry": rating_entry,
        }
        self.lineage: list[LineageRecord] = []
        self._children = 0
        self._rng = random.Random(seed)

    # ------------------------------------------------------------------------------------------ schedule

    def due(self, step: int, last_step: int | None = None) -> bool:
        """True every ``period`` steps: never at step 0, never when disabled, and never at the run's last step
        ``last_step`` (a child made there would never train, yet it would be in the final population and could be
        the export's pick). A run resumed to a later last step evolves at its next step that is a multiple of
        ``period`` and not its last. ``last_step`` None: no planned end (every multiple of ``period``)."""
        if last_step is not None and step >= last_step:
            return False
        return self.config["enabled"] and step > 0 and step % self.config["period"] == 0

    def parents_of(self, member_id: str) -> list[str]:
        """The parents of a child (from its lineage record); [] for a founding member."""
        records = [r for r in self.lineage if r.id == member_id]
        return list(records[-1].parents) if records else []

    def protected(self, member_id: str, step: int) -> bool:
        """Born (as a child) fewer than ``protection_steps`` steps before ``step``."""
        born = [r.step for r in self.lineage if r.id == member_id]
        return bool(born) and step - born[-1] < self.config["protection_steps"]

    # ------------------------------------------------------------------------------------------ selection

    def select(self, league: League, role: str, step: int) -> Selection | None:
        """The victim, parents and operator for ``role``; None when nobody can be replaced."""
        if role not in SUB_POPULATIONS:
            raise ValueError(f"role must be one of {SUB_POPULATIONS}, got {role!r}")
        pool = [m for m in league.members(role) if league.member(m).role == role]
        unprotected = [m for m in pool if not self.protected(m, step)]
        if len(pool) < 2 or not unprotected:
            return None
        victim = min(unprotected, key=lambda m: (league.rating(m).conservative, m))
        others = [m for m in pool if m != victim]
        operator, strength = self._draw_operator(two_parents=len(others) >= 2)
        parents = [self._tournament(league, others)]
        if operator != CLONE and SPECS[operator].kind == "crossover":
            parents.append(self._tournament(league, [m for m in others if m != parents[0]]))
            if operator == "extrapolate":  # past the stronger parent, away from the weaker one
                parents.sort(key=lambda m: (league.rating(m).conservative, m), reverse=True)
        return Selection(role, victim, tuple(parents), operator, strength, step)

    def _draw_operator(self, two_parents: bool) -> tuple[str, float]:
        table = self.config["operators"]
        feasible = [n for n, v in table.items() if v["weight"] > 0 and (two_parents or SPECS[n].kind == "mutation")]
        if not feasible:
            return CLONE, 0.0
        name = self._rng.choices(feasible, weights=[table[n]["weight"] for n in feasible])[0]
        return name, table[name]["strength"]

    def _tournament(self, league: League, candidates: Sequence[str]) -> str:
        drawn = self._rng.sample(list(candidates), min(self.config["tournament_size"], len(candidates)))
        return max(drawn, key=lambda m: (league.rating(m).conservative, m))

    # ------------------------------------------------------------------------------------------ the child

    def make_child(self, selection: Selection, parents: Sequence[Adapter], generator: torch.Generator | None = None) -> Offspring:
        """Apply the selected operator to the parents' adapters (in ``selection.parents`` order), with rejection."""
        if len(parents) != len(selection.parents):
            raise ValueError(f"{selection.operator} was selected with {len(selection.parents)} parent(s), got {len(parents)} adapter(s)")
        name, strength = selection.operator, selection.strength
        attempts: list[dict[str, Any]] = []
        for _ in range(self.config["max_retries"] + 1):
            child = self._apply(name, strength, parents, generator)
            accepted = self._acceptable(child)
            attempts.append({**child.summary(), "accepted": accepted})
            if accepted:
                return Offspring(child, attempts)
            if name in UNSHRINKABLE:
                break
            strength = self._shrink(name, strength)
        child = self._apply("swap_slots" if len(parents) == 2 else CLONE, 0.0, parents, generator)
        attempts.append({**child.summary(), "accepted": True})
        return Offspring(child, attempts)

    @staticmethod
    def _apply(name: str, strength: float, parents: Sequence[Adapter], generator: torch.Generator | None) -> ops.Child:
        return apply_operator(name, strength, parents, generator)

    def _acceptable(self, child: ops.Child) -> bool:
        change = child.max_relative_change
        truncation = child.max_truncation_error
        return (math.isfinite(change) and change <= self.config["max_relative_change"]
                and (truncation is None or truncation <= self.config["max_truncation_error"]))

    @staticmethod
    def _shrink(name: str, strength: float) -> float:
        if name == "blend_svd":  # halfway to the nearer parent (weight 1 is parent a, 0 parent b)
            return 1 - (1 - strength) / 2 if strength >= 0.5 else strength / 2
        neutral = SPECS[name].neutral if name in SPECS else 0.0  # extrapolate: eta halfway back to 1 (parent a)
        return neutral + (strength - neutral) / 2

    # ------------------------------------------------------------------------------------------ commit

    def commit(self, league: League, selection: Selection, offspring: Offspring, child_id: str | None = None) -> LineageRecord:
        """Put the child in the victim's place in the league and append its lineage record."""
        for member_id in (selection.victim, *selection.parents):
            if member_id not in league:
                raise ValueError(f"{member_id!r} of this selection is no longer in the league")
        if child_id is None:
            child_id = self._new_id(league, selection.role)
        if child_id in league:
            raise ValueError(f"child id {child_id!r} is already a league member")
        mu = sum(league.rating(p).mu for p in selection.parents) / len(selection.parents)
        victim_mu = league.rating(selection.victim).mu
        pool = [m for m in league.members(selection.role) if league.member(m).role == selection.role]
        league.remove_member(selection.victim)
        league.add_member(child_id, selection.role, parent=selection.parents[0], mu=mu, sigma=self.config["sigma_reset"])
        shift = 0.0
        if self.config["rating_entry"] == "mean_preserving" and pool:
            shift = -(mu - victim_mu) / len(pool)
            league.shift_mu([child_id if m == selection.victim else m for m in pool], shift)
        self._children += 1
        child = offspring.child
        record = LineageRecord(
            id=child_id, role=selection.role, parents=list(selection.parents), operator=child.operator,
            strength=child.strength, step=selection.step, relative_change=child.max_relative_change,
            mean_relative_change=child.mean_relative_change, truncation_error=child.max_truncation_error,
            victim=selection.victim, mu=mu + shift, sigma=self.config["sigma_reset"], attempts=len(offspring.attempts),
            mean_shift=shift,
        )
        self.lineage.append(record)
        return record

    def _new_id(self, league: League, role: str) -> str:
        n = self._children + 1
        while f"{role}-{n}" in league or any(r.id == f"{role}-{n}" for r in self.lineage):
            n += 1
        return f"{role}-{n}"

    def evolve(
        self, league: League, role: str, step: int, adapters: Mapping[str, Adapter], generator: torch.Generator | None = None
    ) -> tuple[LineageRecord, ops.Child] | None:
        """select + make_child + commit in one process; ``adapters`` maps member id -> state dict."""
        selection = self.select(league, role, step)
        if selection is None:
            return None
        missing = [p for p in selection.parents if p not in adapters]
        if missing:
            raise KeyError(f"no adapter for parent(s) {missing}")
        offspring = self.make_child(selection, [adapters[p] for p in selection.parents], generator)
        return self.commit(league, selection, offspring), offspring.child

    # ------------------------------------------------------------------------------------------ state

    def state_dict(self) -> dict[str, Any]:
        """JSON-ready state (config, lineage, RNG); ``load_state_dict`` restores it exactly."""
        version, internal, gauss = self._rng.getstate()
        return {
            "version": STATE_VERSION,
            "config": {**self.config, "operators": {k: dict(v) for k, v in self.config["operators"].items()}},
            "lineage": [r.to_dict() for r in self.lineage],
            "children": self._children,
            "rng": [version, list(internal), gauss],
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"replacement state version {state.get('version')!r} is not {STATE_VERSION}")
        fresh = ReplacementPolicy(**state["config"])
        self.config = fresh.config
        self.lineage = [LineageRecord.from_dict(r) for r in state["lineage"]]
        self._children = int(state["children"])
        version, internal, gauss = state["rng"]
        self._rng.setstate((version, tuple(internal), gauss))

    @classmethod
    def from_state_dict(cls, state: Mapping[str, Any]) -> "ReplacementPolicy":
        policy = cls(**state["config"])
        policy.load_state_dict(state)
        return policy
