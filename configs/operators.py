"""The evolution operators, one torch-free spec each: the one table the config schema, the strength checks and the
replacement policy derive from (``evolution.operators`` attaches each function by name).

Adding an operator is one entry here plus its function in ``evolution/operators.py`` (``MUTATIONS`` or
``CROSSOVERS``); ``tests/test_evolution_operator_family.py`` checks that the two name the same operators.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class OperatorSpec:
    """What the config and the replacement policy know of an operator (docs/evolution.md)."""

    name: str
    kind: str  # "mutation" (one parent) or "crossover" (two)
    weight: float  # default relative probability of drawing it
    strength: float  # default strength
    strength_range: tuple[float, float] = (0.0, math.inf)  # both inclusive
    neutral: float = 0.0  # the strength at which it returns its (first) parent: retries halve the distance to it
    shrinkable: bool = True  # false: a rejected child is not retried at a smaller strength (strength is unused)


SPECS: dict[str, OperatorSpec] = {spec.name: spec for spec in (
    OperatorSpec("perturb_singular_values", "mutation", 1.0, 0.1),
    OperatorSpec("rotate_subspace", "mutation", 1.0, 0.1, (0.0, math.pi / 2)),
    OperatorSpec("gaussian_noise", "mutation", 0.5, 0.05),
    OperatorSpec("layer_noise", "mutation", 0.5, 0.1),
    OperatorSpec("mask_components", "mutation", 0.5, 0.25, (0.0, 1.0)),
    OperatorSpec("swap_slots", "crossover", 1.0, 0.0, shrinkable=False),
    OperatorSpec("blend_svd", "crossover", 1.0, 0.5, (0.0, 1.0)),
    OperatorSpec("dare", "crossover", 0.5, 0.1, (0.0, 0.99)),
    OperatorSpec("splice_svd", "crossover", 0.5, 0.5, (0.0, 1.0)),
    OperatorSpec("extrapolate", "crossover", 0.5, 1.5, (1.0, 2.5), neutral=1.0),
)}
"""Every operator by name, mutations first."""


def names(kind: str) -> tuple[str, ...]:
    """The operators of ``kind`` ("mutation" or "crossover"), in table order."""
    return tuple(name for name, spec in SPECS.items() if spec.kind == kind)


def default_operators() -> dict[str, dict[str, float]]:
    """Operator name -> its default ``{"weight", "strength"}``."""
    return {name: {"weight": spec.weight, "strength": spec.strength} for name, spec in SPECS.items()}


def check_strength(operator: str, strength: float) -> float:
    """Return ``strength`` as a float, or raise ValueError naming the operator and its valid range."""
    low, high = SPECS[operator].strength_range if operator in SPECS else (-math.inf, math.inf)
    try:
        value = float(strength)
    except (TypeError, ValueError):
        raise ValueError(f"{operator}: strength must be a number, got {strength!r}") from None
    if not math.isfinite(value) or not low <= value <= high:
        raise ValueError(f"{operator}: strength {strength!r} is outside [{low}, {high}]")
    return value
