"""The report's trend statistics (reporting.report_trends) against independent computations: an explicit window
loop, numpy's polyfit and its covariance, Student's t by numerical integration of its density, published
t-table values, and the CI's coverage on simulated lines."""

from __future__ import annotations

import math

import numpy as np
import pytest

from student_t import t975_by_integration

from reporting.report_trends import (
    fit_line, rolling_mean, smoothing_half_width, t_quantile_975, t_two_sided_probability,
)


@pytest.mark.parametrize("half_width", [0, 1, 2, 5])
def test_rolling_mean_is_the_mean_of_the_centred_window_cut_at_the_ends(half_width):
    y = np.random.default_rng(half_width).normal(size=23)
    expected = [y[max(0, i - half_width): i + half_width + 1].mean() for i in range(len(y))]
    assert rolling_mean(y, half_width) == pytest.approx(expected, rel=1e-12, abs=1e-12)


def test_smoothing_window_grows_with_the_run_and_is_capped():
    assert [smoothing_half_width(n) for n in (1, 5, 19, 20, 35, 60, 500)] == [1, 1, 1, 2, 3, 5, 5]


@pytest.mark.parametrize("df", [1, 2, 3, 4, 7, 10, 29, 58])
def test_t_quantile_matches_the_integrated_density(df):
    assert t_quantile_975(df) == pytest.approx(t975_by_integration(df), abs=2e-3)
    assert t_two_sided_probability(t_quantile_975(df), df) == pytest.approx(0.95, abs=1e-9)


def test_t_quantile_matches_published_table_values():
    table = {1: 12.706, 2: 4.303, 5: 2.571, 10: 2.228, 30: 2.042, 120: 1.980}
    assert {df: round(t_quantile_975(df), 3) for df in table} == table


def test_fit_matches_polyfit_and_its_scaled_covariance():
    rng = np.random.default_rng(0)
    x = np.arange(1, 41, dtype=float)
    y = 3.0 - 0.07 * x + rng.normal(scale=0.5, size=len(x))
    fit = fit_line(x, y)
    (slope, intercept), cov = np.polyfit(x, y, 1, cov=True)  # cov scaled by residual SS / (n - 2)
    assert (fit.slope, fit.intercept) == pytest.approx((slope, intercept), rel=1e-9)
    assert fit.slope_ci == pytest.approx(t975_by_integration(38) * math.sqrt(cov[0, 0]), rel=1e-3)
    assert fit.direction == "falls"


def test_band_is_narrowest_at_the_mean_step_and_equals_t_s_over_root_n_there():
    rng = np.random.default_rng(1)
    x = np.arange(10, dtype=float)
    fit = fit_line(x, rng.normal(size=10))
    band = fit.band(np.array([0.0, x.mean(), 9.0]))
    assert band[1] == pytest.approx(fit.t * fit.residual_sd / math.sqrt(10))
    assert band[0] > band[1] < band[2]


def test_slope_ci_covers_the_true_slope_95_percent_of_the_time():
    """With 8 points a normal quantile (1.96) would cover only ~90 %; the t quantile covers 95 %."""
    rng = np.random.default_rng(2)
    x = np.arange(8, dtype=float)
    hits = 0
    trials = 4000
    for _ in range(trials):
        fit = fit_line(x, 1.0 + 0.3 * x + rng.normal(size=8))
        hits += abs(fit.slope - 0.3) <= fit.slope_ci
    assert 0.935 <= hits / trials <= 0.965


def test_flat_noise_is_flat_and_bad_input_is_refused():
    rng = np.random.default_rng(3)
    assert fit_line(np.arange(30), rng.normal(size=30)).direction == "flat"
    with pytest.raises(ValueError, match="at least 3 points"):
        fit_line([1, 2], [1, 2])
    with pytest.raises(ValueError, match="all x are equal"):
        fit_line([2, 2, 2], [1, 2, 3])
    with pytest.raises(ValueError, match="one length"):
        fit_line([1, 2, 3], [1, 2])
