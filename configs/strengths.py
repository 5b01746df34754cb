"""Each operator's strength range and neutral strength (no torch: the config schema checks them before any
actor starts)."""

from __future__ import annotations

import math

# strength ranges: (low, high), both inclusive
STRENGTH_RANGE: dict[str, tuple[float, float]] = {
    "perturb_singular_values": (0.0, math.inf),
    "rotate_subspace": (0.0, math.pi / 2),
    "gaussian_noise": (0.0, math.inf),
    "blend_svd": (0.0, 1.0),
    "layer_noise": (0.0, math.inf),
    "mask_components": (0.0, 1.0),
    "dare": (0.0, 0.99),
    "splice_svd": (0.0, 1.0),
    "extrapolate": (1.0, 2.5),
}
# the strength at which an operator returns its (first) parent; the replacement policy's retries halve the
# distance to it
NEUTRAL_STRENGTH: dict[str, float] = {"extrapolate": 1.0}


def check_strength(operator: str, strength: float) -> float:
    """Return ``strength`` as a float, or raise ValueError naming the operator and its valid range."""
    low, high = STRENGTH_RANGE.get(operator, (-math.inf, math.inf))
    try:
        value = float(strength)
    except (TypeError, ValueError):
        raise ValueError(f"{operator}: strength must be a number, got {strength!r}") from None
    if not math.isfinite(value) or not low <= value <= high:
        raise ValueError(f"{operator}: strength {strength!r} is outside [{low}, {high}]")
    return value
