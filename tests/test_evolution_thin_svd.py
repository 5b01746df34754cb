"""Thin SVD from LoRA factors against dense SVDs of Delta W."""

from __future__ import annotations

import math

import pytest
import torch
from evolution_adapters import dense_svd, principal_cosines
from hypothesis import given, settings
from hypothesis import strategies as st

from evolution.thin_svd import balanced_factors, factored_svd, householder_svd, tall_inner, tall_times, thin_svd


def factors(seed: int, rank: int, d_out: int, d_in: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(rank, d_in, generator=gen), torch.randn(d_out, rank, generator=gen)


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    rank=st.integers(1, 8),
    d_out=st.integers(1, 40),
    d_in=st.integers(1, 40),
    scaling=st.floats(0.1, 4.0),
)
def test_singular_values_and_reconstruction_match_dense(seed, rank, d_out, d_in, scaling):
    a, b = factors(seed, rank, d_out, d_in)
    dense = scaling * b.double() @ a.double()
    u, sigma, vh = thin_svd(a, b, scaling)
    expected = torch.linalg.svdvals(dense)[: sigma.numel()]
    k = min(rank, d_out, d_in)
    top = float(expected[0])
    assert torch.allclose(sigma[:k], expected[:k], atol=1e-5 * top, rtol=1e-5)
    assert torch.all(sigma[k:] <= 1e-5 * top)  # beyond min(d_out, d_in) only null directions remain
    rebuilt = (u.double() * sigma) @ vh.double()
    assert torch.allclose(rebuilt, dense, atol=1e-5 * top)


def test_singular_vectors_span_the_dense_ones():
    a, b = factors(0, 6, 50, 30)
    u, sigma, vh = thin_svd(a, b)
    du, ds, dvh = dense_svd(b.double() @ a.double(), 6)
    assert torch.allclose(principal_cosines(u.double(), du), torch.ones(6, dtype=torch.float64), atol=1e-5)
    assert torch.allclose(principal_cosines(vh.double().mT, dvh.mT), torch.ones(6, dtype=torch.float64), atol=1e-5)
    assert torch.allclose(u.mT @ u, torch.eye(6), atol=1e-5)


@pytest.mark.parametrize("smallest", [1e-1, 5e-2, 1e-4])
def test_matches_householder_reference_however_conditioned(smallest):
    # kappa(B) = 10: Cholesky fast path; 20: float32 eigen root; 1e4: Gram recomputed in float64
    gen = torch.Generator().manual_seed(3)
    q, _ = torch.linalg.qr(torch.randn(64, 8, generator=gen, dtype=torch.float64))
    b = (q * torch.logspace(0, math.log10(smallest), 8, dtype=torch.float64)).float()
    a = torch.randn(8, 48, generator=gen)
    _, sigma, _ = thin_svd(a, b)
    _, reference, _ = householder_svd(a, b)
    dense = torch.linalg.svdvals(b.double() @ a.double())[:8]
    assert torch.allclose(sigma, reference, rtol=1e-5, atol=1e-9)
    assert torch.allclose(sigma, dense, rtol=1e-5, atol=1e-9)


def test_zero_factor_gives_null_directions_not_nan():
    a, b = factors(1, 4, 12, 10)
    u, sigma, vh = thin_svd(a, torch.zeros_like(b))
    assert torch.all(sigma == 0) and torch.isfinite(u).all() and torch.isfinite(vh).all()


def test_balanced_factors_rebuild_delta_with_equal_norms():
    a, b = factors(2, 5, 30, 20)
    u, sigma, vh = thin_svd(a, b, scaling=2.0)
    new_a, new_b = balanced_factors(u, sigma.float(), vh, scaling=2.0)
    assert torch.allclose(2.0 * new_b @ new_a, 2.0 * b @ a, rtol=1e-4, atol=1e-4)
    assert torch.allclose(new_b.mT @ new_b, new_a @ new_a.mT, atol=1e-3)  # both diag(sigma / s)


def test_blend_of_two_products_is_the_weighted_sum():
    a1, b1 = factors(4, 3, 16, 12)
    a2, b2 = factors(5, 3, 16, 12)
    weights = torch.tensor([0.3] * 3 + [0.7] * 3, dtype=torch.float64)
    svd = factored_svd([b1, b2], [a1.mT, a2.mT], weights)
    target = 0.3 * b1.double() @ a1.double() + 0.7 * b2.double() @ a2.double()
    assert torch.allclose(svd.sigma, torch.linalg.svdvals(target)[:6], rtol=1e-5, atol=1e-6)


def test_nan_factor_is_a_clear_error():
    a, b = factors(6, 2, 5, 5)
    b[0, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN or Inf"):
        thin_svd(a, b)


@pytest.mark.parametrize("rows", [1024, 2048 + 300])  # whole 512-row blocks only, and a remainder
def test_row_blocked_products_equal_the_plain_ones(rows):
    gen = torch.Generator().manual_seed(rows)
    x, y = torch.randn(rows, 16, generator=gen), torch.randn(rows, 8, generator=gen)
    m, n = torch.randn(16, 5, generator=gen), torch.randn(8, 5, generator=gen)
    assert torch.allclose(tall_inner(x, y), x.mT @ y, rtol=1e-5, atol=1e-3)
    assert torch.allclose(tall_times([(x, m), (y, n)]), x @ m + y @ n, rtol=1e-5, atol=1e-4)
    # column-major operands (A^T of a row-major A) are blocked as views; X^T X takes the symmetric route,
    # also for a second view of the same data and for an odd width
    strided = torch.randn(16, rows, generator=gen).mT
    assert torch.allclose(tall_inner(strided, x), strided.contiguous().mT @ x, rtol=1e-5, atol=1e-3)
    for z in (x, strided, y[:, :7]):
        same_data = z.view(z.shape) if z.is_contiguous() else z.mT.mT
        expected = z.double().mT @ z.double()
        for out in (tall_inner(z, z), tall_inner(z, same_data)):
            assert torch.allclose(out.double(), expected, rtol=1e-5, atol=1e-3)
