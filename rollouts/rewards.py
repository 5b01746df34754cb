"""The game's rewards, in one home: the population's teacher and student rewards and AZR's single-agent baseline.

- Teacher (PopuLoRA), per proposed task with solve rate rho of its matched student:
  ``r = invalid`` (-1) if the task is invalid, ``0`` if ``rho == 0``, else ``1 - rho``.
- Student: ``correct`` (1) for a correct well-formed answer, ``wrong`` (AZR: -0.5) for a
  well-formed wrong one, ``malformed`` (AZR: -1) otherwise.
- Learnability (AZR Eq. 4, single agent, rho measured on itself): ``1 - rho`` if ``0 < rho < 1``, else 0.
- :func:`proposer_reward`: which of the two a proposal earns (``population.single_agent``), with the values of
  ``rewards.*`` (``configs.schema.RewardsConfig``).

The verifier only runs code and says valid / correct; what that is worth is decided here.
"""

from __future__ import annotations

import math
from typing import Sequence

from configs.schema import RewardsConfig


def _check_rho(rho: float) -> float:
    if isinstance(rho, bool) or not isinstance(rho, (int, float)) or math.isnan(rho) or not 0.0 <= rho <= 1.0:
        raise ValueError(f"rho must be a solve rate in [0, 1], got {rho!r}")
    return float(rho)


def solve_rate(correct: Sequence[bool]) -> float:
    """rho: the fraction of rollouts that solved the task."""
    if len(correct) == 0:
        raise ValueError("solve_rate needs at least one rollout")
    return sum(bool(c) for c in correct) / len(correct)


def teacher_reward(valid: bool, rho: float | None, invalid: float = -1.0, unsolved: float = 0.0) -> float:
    """-1 (``invalid``) for an invalid task, 0 (``unsolved``, the floor) when the student never solves it,
    else 1 - rho."""
    if not valid:
        return float(invalid)
    if rho is None:
        raise ValueError("a valid task needs the student's solve rate rho")
    rho = _check_rho(rho)
    return float(unsolved) if rho == 0.0 else 1.0 - rho


def student_reward(correct: bool, well_formed: bool, wrong: float = -0.5, malformed: float = -1.0, correct_reward: float = 1.0) -> float:
    """``correct_reward`` for a correct well-formed answer, ``wrong`` for a well-formed wrong one, else ``malformed``."""
    if not well_formed:
        return float(malformed)
    return float(correct_reward) if correct else float(wrong)


def learnability_reward(rho: float) -> float:
    """AZR's proposer reward: 1 - rho for 0 < rho < 1, else 0 (too hard and too easy earn nothing)."""
    rho = _check_rho(rho)
    return 1.0 - rho if 0.0 < rho < 1.0 else 0.0


def proposer_reward(rho: float | None, rewards: RewardsConfig, single_agent: bool) -> float:
    """The proposer's reward of one proposal: the single agent's learnability (an invalid proposal costs
    ``rewards.teacher_invalid`` in both arms), else the population teacher's with ``rewards.*``'s values."""
    if rho is not None and single_agent:
        return learnability_reward(rho)
    return teacher_reward(rho is not None, rho, invalid=rewards.teacher_invalid, unsolved=rewards.teacher_unsolved)
