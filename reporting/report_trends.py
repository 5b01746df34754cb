"""Trend statistics behind the report's figures: a centred rolling mean and an ordinary-least-squares line
with its 95 % confidence band. Pure maths (numpy and math only; no Ray, no plotting).

Smoothing, over the n measured points y_0..y_{n-1} of a metric (in step order):

    s_i = mean{ y_j : |j - i| <= h, 0 <= j < n }        (centred; the window is cut at both ends)
    h   = clamp(n // 10, 1, 5)                           (window 2h+1: 3 points below 20 steps, 5 at 20, 11 from 50)

At the ends the window is one-sided: s_0 is the mean of the first h+1 points and s_{n-1} of the last h+1,
so on a steady trend the smoothed ends lag the fitted line by about h/2 steps.

Fit of y = a + b x over the points (x_i = step, y_i):

    x̄, ȳ the means;  Sxx = Σ (x_i - x̄)²;  b = Σ (x_i - x̄)(y_i - ȳ) / Sxx;  a = ȳ - b x̄
    s² = Σ (y_i - a - b x_i)² / (n - 2)                  (residual variance, n - 2 degrees of freedom)
    SE(b) = s / √Sxx;  slope 95 % CI: b ± t · SE(b)
    band of the fitted line at x:  a + b x ± t · s · √(1/n + (x - x̄)² / Sxx)
    t = t_{0.975, n-2}, the two-sided 95 % quantile of Student's t with n - 2 degrees of freedom.

The quantile is found by bisection on Student's t distribution function in closed form for integer
degrees of freedom ν (Abramowitz & Stegun 26.7.3-4), with θ = atan(t / √ν):

    ν odd:   P(|T| <= t) = (2/π) [θ + sin θ (cos θ + (2/3) cos³θ + ...
                                          + (2·4···(ν-3))/(1·3···(ν-2)) cos^(ν-2) θ)]
    ν even:  P(|T| <= t) = sin θ [1 + (1/2) cos²θ + (1·3)/(2·4) cos⁴θ + ...
                                  + (1·3···(ν-3))/(2·4···(ν-2)) cos^(ν-2) θ]

(the sums are empty for ν = 1 and ν = 2).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


def smoothing_half_width(n: int) -> int:
    """h = clamp(n // 10, 1, 5): the half-width of the rolling window for n measured points."""
    return max(1, min(5, n // 10))


def rolling_mean(values: np.ndarray | list[float], half_width: int) -> np.ndarray:
    """s_i = mean of y_j over |j - i| <= half_width, j inside the series (centred, cut at the ends)."""
    y = np.asarray(values, dtype=float)
    if half_width < 0:
        raise ValueError(f"half_width must be >= 0, got {half_width}")
    n = len(y)
    if n == 0:
        return y
    cumulative = np.concatenate(([0.0], np.cumsum(y)))
    index = np.arange(n)
    lo = np.maximum(index - half_width, 0)
    hi = np.minimum(index + half_width + 1, n)
    return (cumulative[hi] - cumulative[lo]) / (hi - lo)


def t_two_sided_probability(t: float, df: int) -> float:
    """P(|T| <= t) for Student's t with integer ``df`` degrees of freedom (A&S 26.7.3-4, module docstring)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    theta = math.atan(abs(t) / math.sqrt(df))
    c2 = math.cos(theta) ** 2
    if df % 2:
        term, total = math.cos(theta), 0.0
        if df > 1:
            total = term
            for k in range(3, df - 1, 2):  # the coefficient of cos^k is (2·4···(k-1)) / (1·3···k)
                term *= c2 * (k - 1) / k
                total += term
        return 2 / math.pi * (theta + math.sin(theta) * total)
    term = total = 1.0
    for k in range(2, df - 1, 2):  # the coefficient of cos^k is (1·3···(k-1)) / (2·4···k)
        term *= c2 * (k - 1) / k
        total += term
    return math.sin(theta) * total


def t_quantile_975(df: int) -> float:
    """t_{0.975, df}: the t with P(|T| <= t) = 0.95, by bisection to 1e-10."""
    lo, hi = 0.0, 1.0
    while t_two_sided_probability(hi, df) < 0.95:
        hi *= 2
    while hi - lo > 1e-10:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_two_sided_probability(mid, df) < 0.95 else (lo, mid)
    return (lo + hi) / 2


@dataclass(frozen=True)
class LineFit:
    """The least-squares line y = intercept + slope * x over n points, with what its 95 % band needs."""

    n: int
    slope: float
    intercept: float
    slope_ci: float  # half-width of the slope's 95 % CI: t · SE(b)
    residual_sd: float  # s
    x_mean: float
    sxx: float
    t: float  # t_{0.975, n-2}

    def predict(self, x: np.ndarray) -> np.ndarray:
        return self.intercept + self.slope * np.asarray(x, dtype=float)

    def band(self, x: np.ndarray) -> np.ndarray:
        """Half-width of the fitted line's 95 % CI at x: t · s · √(1/n + (x - x̄)² / Sxx)."""
        x = np.asarray(x, dtype=float)
        return self.t * self.residual_sd * np.sqrt(1 / self.n + (x - self.x_mean) ** 2 / self.sxx)

    @property
    def direction(self) -> str:
        """"rises" or "falls" where the slope's 95 % CI excludes 0, else "flat"."""
        if self.slope - self.slope_ci > 0:
            return "rises"
        if self.slope + self.slope_ci < 0:
            return "falls"
        return "flat"


def fit_line(x: np.ndarray | list[float], y: np.ndarray | list[float]) -> LineFit:
    """OLS of y on x (formulas in the module docstring); needs >= 3 points and x not all equal."""
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"x and y must be 1-d and of one length, got shapes {x.shape} and {y.shape}")
    n = len(x)
    if n < 3:
        raise ValueError(f"a line with a confidence band needs at least 3 points, got {n}")
    x_mean, y_mean = float(x.mean()), float(y.mean())
    sxx = float(((x - x_mean) ** 2).sum())
    if sxx == 0.0:
        raise ValueError("all x are equal: no slope to fit")
    slope = float(((x - x_mean) * (y - y_mean)).sum() / sxx)
    intercept = y_mean - slope * x_mean
    residual_sd = math.sqrt(float(((y - intercept - slope * x) ** 2).sum()) / (n - 2))
    t = t_quantile_975(n - 2)
    return LineFit(n=n, slope=slope, intercept=intercept, slope_ci=t * residual_sd / math.sqrt(sxx),
                   residual_sd=residual_sd, x_mean=x_mean, sxx=sxx, t=t)
