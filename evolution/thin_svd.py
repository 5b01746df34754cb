"""SVD of a low-rank product s * X D Y^T straight from its factors, never forming the d_out x d_in matrix.

For one LoRA slot X = B (d_out x r), Y = A^T (d_in x r), D = I:

    B = Q_b R_b,  A^T = Q_a R_a                (thin QR, Q orthonormal, R r x r)
    s R_b R_a^T = U_m diag(sigma) V_m^T        (SVD of the r x r core)
    Delta W = s B A = (Q_b U_m) diag(sigma) (Q_a V_m)^T

costs O((d_in + d_out) r^2) instead of the O(d_out d_in min(d_out, d_in)) of a dense SVD. A blend of two
slots is the same computation on concatenated factors: w s B_a A_a + (1 - w) s B_b A_b =
s [B_a, B_b] diag(w I, (1 - w) I) [A_a; A_b], of rank <= 2r.

How R is computed (``gram_roots``): R only matters through R^T R = X^T X, so we take the Gram matrix
(one matrix product; on CPU tall-skinny Householder QR is memory bound and ~10x slower) and

- usually R = L^T from its Cholesky factor (Cholesky-QR): Q = X R^-1 is orthonormal up to about
  eps32 * kappa(X)^2, so this path is taken only while that (estimated by power iteration, with a margin)
  stays below ``ORTHONORMALITY_TOL``;
- otherwise R = Lambda^{1/2} W^T from X^T X = W Lambda W^T, the Gram recomputed in float64 when float32
  cannot resolve it, and directions with lambda_i <= NULL_TOL * lambda_max (singular values below 1e-6 of
  the largest, e.g. B = 0 of a fresh PEFT adapter) cut as null: they carry no part of Delta W and get
  Q columns of zero.

The small r x r factorisations run in float64, batched over slots. ``householder_svd`` is the textbook
route (torch.linalg.qr in float64), kept as a reference for tests and the benchmark.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from evolution.shards import in_pool_thread, thread_pool

FP32_EPS = torch.finfo(torch.float32).eps
ORTHONORMALITY_TOL = 1e-4
NULL_TOL = 1e-12
KAPPA_MARGIN = 4.0


@dataclass
class GramRoot:
    """X = Q R for X = [X_1, ..., X_m] (tall blocks), with R and its pseudo-inverse in float64.

    ``block_sq_norms[i]`` is ||X_i||_F^2 (the trace of its diagonal Gram block). ``cholesky``: R is the
    upper-triangular Cholesky root (the fast path of ``roots_of_grams``), so R[:k, :k] is the root of
    [X_1 .. X_j] (k their width) and R^+[:k, :k] its inverse.
    """

    root: torch.Tensor
    pinv: torch.Tensor
    block_sq_norms: list[float]
    cholesky: bool = False


ROW_BLOCK = 512  # rows per batch entry of ``tall_inner`` and ``tall_times``


def _unit_stride(x: torch.Tensor) -> bool:
    """Row- or column-major: one of the two dims has stride 1, so MKL reads each block without a copy."""
    return x.stride(-1) == 1 or x.stride(-2) == 1


def _same_view(x: torch.Tensor, y: torch.Tensor) -> bool:
    return y is x or (y.data_ptr() == x.data_ptr() and y.shape == x.shape and y.stride() == x.stride())


def tall_inner(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """X^T Y for tall X (d x p), Y (d x q), as a sum over blocks of ``ROW_BLOCK`` rows on CPU.

    Same products, reorganised for MKL: one batched call on (d / 512) blocks of 512 x 64 runs ~20% faster
    than one (64 x d) @ (d x 64) product on two cores (196 vs 164 GFLOP/s, operands from memory), which
    packs both whole operands first. Operands may be row-major (B factors) or column-major (A^T of a
    row-major A); the blocks are views either way. X^T X (y the same view of the same data) is symmetric:
    with X = [X_1, X_2] split by columns it is [[X_1^T X], [(X_1^T X_2)^T, X_2^T X_2]], three quarters of
    the products (17% less time for 64 columns on two cores). Other devices, short operands and the
    remainder rows: plain products.
    """
    main = x.shape[0] - x.shape[0] % ROW_BLOCK
    if x.device.type != "cpu" or main < 2 * ROW_BLOCK or not (_unit_stride(x) and _unit_stride(y)):
        return x.mT @ y
    xb = x[:main].unflatten(0, (-1, ROW_BLOCK))
    if _same_view(x, y) and x.shape[1] >= 2:
        half = x.shape[1] // 2
        top = torch.bmm(xb[..., :half].mT, xb).sum(0)  # X_1^T X: half x p
        low = torch.bmm(xb[..., half:].mT, xb[..., half:]).sum(0)
        out = torch.cat([top, torch.cat([top[:, half:].mT, low], 1)])
    else:
        out = torch.bmm(xb.mT, y[:main].unflatten(0, (-1, ROW_BLOCK))).sum(0)
    if main < x.shape[0]:
        out += x[main:].mT @ y[main:]
    return out


def tall_times(terms: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """sum_i X_i @ M_i for tall X_i (d x p_i) and small M_i (p_i x q), batched over blocks of ``ROW_BLOCK`` rows
    on CPU like ``tall_inner`` (~13% faster there for 64-wide factors); the first product writes, the others
    accumulate in place."""
    (x, m), rest = terms[0], terms[1:]
    main = x.shape[0] - x.shape[0] % ROW_BLOCK
    if x.device.type != "cpu" or main < 2 * ROW_BLOCK or not all(t.is_contiguous() for t, _ in terms):
        out = x @ m
        for t, n in rest:
            out.addmm_(t, n)
        return out
    blocks = main // ROW_BLOCK
    out = torch.empty(x.shape[0], m.shape[1], dtype=x.dtype, device=x.device)
    head = out[:main].view(blocks, ROW_BLOCK, m.shape[1])
    torch.bmm(x[:main].view(blocks, ROW_BLOCK, -1), m.expand(blocks, *m.shape), out=head)
    for t, n in rest:
        head.baddbmm_(t[:main].view(blocks, ROW_BLOCK, -1), n.expand(blocks, *n.shape))
    if main < x.shape[0]:
        tail = torch.mm(x[main:], m, out=out[main:])
        for t, n in rest:
            tail.addmm_(t[main:], n)
    return out


def block_gram(blocks: Sequence[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    """[X_1, ..., X_m]^T [X_1, ..., X_m] in float64, multiplied in ``dtype`` block by block (no concatenation)."""
    cast = [x.to(dtype) for x in blocks]
    rows = []
    for i, x in enumerate(cast):
        row = []
        for j, y in enumerate(cast):
            # only the upper blocks are multiplied; the lower ones are their transposes
            row.append(tall_inner(x, y) if j >= i else None)
        rows.append(row)
    for i in range(len(cast)):
        for j in range(i):
            rows[i][j] = rows[j][i].mT
    return torch.cat([torch.cat(row, dim=1) for row in rows], dim=0).to(torch.float64)


def on_threads(fn: Callable[..., tuple[torch.Tensor, ...]], *batches: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``fn(*batches)`` for a batched LAPACK routine, the batch split over ``torch.get_num_threads()`` threads.

    On CPU torch factorises the matrices of a batch one after another on one thread (196 SVDs of 128 x 128 in
    float64: 0.39 s); the chunks release the GIL, so two threads take about half that. torch's intra-op
    thread count is 1 while they run and restored after. CUDA and small batches run as one call.
    """
    threads = torch.get_num_threads()
    workers = min(threads, batches[0].shape[0] // 4)
    if batches[0].device.type != "cpu" or workers < 2 or in_pool_thread():
        return fn(*batches)
    chunks = zip(*(b.tensor_split(workers) for b in batches))
    # one intra-op thread while the pool runs: otherwise MKL starts an OpenMP team inside every chunk, and on
    # two cores four threads spin against each other (196 eighs of 128 x 128: 0.18 s -> 0.09 s)
    torch.set_num_threads(1)
    try:
        parts = list(thread_pool(workers).map(lambda chunk: fn(*chunk), chunks))
    finally:
        torch.set_num_threads(threads)
    return tuple(torch.cat(outputs) for outputs in zip(*parts))


def _group_by_shape(mats: Sequence[torch.Tensor]) -> dict[tuple, list[int]]:
    groups: dict[tuple, list[int]] = {}
    for i, m in enumerate(mats):
        groups.setdefault((tuple(m.shape), m.device), []).append(i)
    return groups


def check_finite(grams: torch.Tensor) -> None:
    """Raise ValueError if a Gram holds NaN or Inf (one sum: NaN and Inf propagate, float64 cannot overflow here)."""
    if not bool(torch.isfinite(grams.sum())):
        raise ValueError("LoRA factor holds NaN or Inf values")


def _kappa_squared(gram: torch.Tensor, inverse_root: torch.Tensor, iterations: int = 10) -> torch.Tensor:
    """Power-iteration estimate of kappa(X)^2 = lambda_max(G) * lambda_max(G^-1), G^-1 = R^-1 R^-T, batched.

    An estimate from below (Rayleigh quotients), so callers keep a safety margin; deterministic start.
    """
    # an estimate with a margin needs no float64: float32 halves the memory each of the 3 passes per step reads.
    # Row vectors: x^T G = (G x)^T (G symmetric) and y^T R^-1 R^-T = (G^-1 y)^T; MKL multiplies a batch of
    # 1 x k rows by k x k matrices ~10x faster than k x k matrices by k x 1 columns
    gram, inverse_root = gram.float(), inverse_root.float()
    k = gram.shape[-1]
    start = 1.0 + 0.5 * torch.cos(torch.arange(k, dtype=gram.dtype, device=gram.device))
    x = start.expand(gram.shape[0], k).unsqueeze(-2).contiguous()
    y = x.clone()
    for _ in range(iterations):
        x = x @ gram
        x = x / x.norm(dim=-1, keepdim=True)
        y = (y @ inverse_root) @ inverse_root.mT
        y = y / y.norm(dim=-1, keepdim=True)
    top = ((x @ gram) * x).sum((1, 2))
    inv_top = (y @ inverse_root).square().sum((1, 2))
    return (top * inv_top).double()


def _eigen_roots(grams: torch.Tensor, exact_grams: Sequence[Callable[[], torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    """(R, R^+) from G = W Lambda W^T (R = Lambda^{1/2} W^T), float64 Grams where float32 is not enough."""
    lam, vec = on_threads(torch.linalg.eigh, grams)
    top = lam[:, -1]
    ill = (top > 0) & (lam[:, 0] * ORTHONORMALITY_TOL < FP32_EPS * top)
    for pos in ill.nonzero().flatten().tolist():
        lam[pos], vec[pos] = torch.linalg.eigh(exact_grams[pos]())
    lam_max = lam[:, -1:].clamp_min(0)
    alive = (lam > NULL_TOL * lam_max) & (lam_max > 0)
    sqrt_lam = torch.where(alive, lam.clamp_min(0).sqrt(), torch.zeros_like(lam))
    inv_sqrt = torch.where(alive, 1.0 / torch.where(alive, sqrt_lam, torch.ones_like(lam)), torch.zeros_like(lam))
    return sqrt_lam[:, :, None] * vec.mT, vec * inv_sqrt[:, None, :]


def gram_roots(block_lists: Sequence[Sequence[torch.Tensor]]) -> list[GramRoot]:
    """``GramRoot`` of each X = [blocks...] (each block d x r_i, float32 or float64, views allowed).

    The Grams are multiplied in float32 block by block; see ``roots_of_grams`` for the roots.
    """
    grams = [block_gram(blocks, torch.float32) for blocks in block_lists]
    widths = [[x.shape[1] for x in blocks] for blocks in block_lists]
    exact = [lambda blocks=blocks: block_gram(blocks, torch.float64) for blocks in block_lists]
    return roots_of_grams(grams, widths, exact)


def roots_of_grams(
    grams: Sequence[torch.Tensor], widths: Sequence[Sequence[int]], exact_grams: Sequence[Callable[[], torch.Tensor]]
) -> list[GramRoot]:
    """``GramRoot`` of each X from its Gram X^T X (float64 holding float32 products; blocks of ``widths``).

    Fast path: R = L^T from the Cholesky factor when the estimated kappa^2 keeps eps32 kappa^2 (times a
    margin of ``KAPPA_MARGIN``) below ``ORTHONORMALITY_TOL``. Otherwise the symmetric root from an
    eigendecomposition, with the Gram recomputed in float64 (``exact_grams[i]()``) when float32 cannot
    resolve it and null directions cut (module docstring). The r x r factorisations run batched, one LAPACK
    call per Gram size.
    """
    roots: list[GramRoot | None] = [None] * len(grams)
    for indices in _group_by_shape(grams).values():
        stacked = torch.stack([grams[i] for i in indices])
        check_finite(stacked)
        chol, info = torch.linalg.cholesky_ex(stacked)
        fast = info == 0
        root = chol.mT.clone()
        eye = torch.eye(root.shape[-1], dtype=root.dtype, device=root.device).expand_as(root)
        invertible = root if bool(fast.all()) else torch.where(fast[:, None, None], root, eye)
        pinv = torch.linalg.solve_triangular(invertible, eye, upper=True)
        if fast.any():
            kappa_sq = _kappa_squared(stacked, pinv).nan_to_num(nan=math.inf)
            fast &= FP32_EPS * KAPPA_MARGIN * kappa_sq <= ORTHONORMALITY_TOL
        slow = (~fast).nonzero().flatten().tolist()
        if slow:
            root[slow], pinv[slow] = _eigen_roots(stacked[slow], [exact_grams[indices[p]] for p in slow])
        for pos, i in enumerate(indices):
            diag, norms, start = grams[i].diagonal().tolist(), [], 0
            for width in widths[i]:
                norms.append(sum(diag[start : start + width]))
                start += width
            roots[i] = GramRoot(root=root[pos], pinv=pinv[pos], block_sq_norms=norms, cholesky=bool(fast[pos]))
    return roots  # type: ignore[return-value]


def gram_root(blocks: Sequence[torch.Tensor]) -> GramRoot:
    """R with X = Q R for one X = [blocks...]; see module docstring."""
    return gram_roots([blocks])[0]


@dataclass
class FactoredSVD:
    """s X D Y^T = U diag(sigma) V^T with U = X @ left and V = Y @ right (float64 coefficient matrices).

    ``core_u``/``core_v`` are the SVD factors of the core s R_x D R_y^T; ``x_root``/``y_root`` the two
    Gram roots, so other products in the same span can be compared exactly in r-sized coordinates.
    """

    sigma: torch.Tensor
    left: torch.Tensor
    right: torch.Tensor
    core_u: torch.Tensor
    core_v: torch.Tensor
    x_root: GramRoot
    y_root: GramRoot

    def core_of(self, weights: torch.Tensor, scaling: float) -> torch.Tensor:
        """The core (in Q_x, Q_y coordinates) of s X diag(weights) Y^T, e.g. one parent of a blend."""
        return scaling * (self.x_root.root * weights[None, :]) @ self.y_root.root.mT


Product = tuple[Sequence[torch.Tensor], Sequence[torch.Tensor], torch.Tensor | None]


def _times_middle(root: torch.Tensor, middle: torch.Tensor) -> torch.Tensor:
    """R D for the middle factor D of X D Y^T: a vector (D = diag(middle)) or an m x m matrix, batched or not."""
    if middle.dim() == root.dim():
        return root @ middle
    return root * middle.unsqueeze(-2)


def canonical_signs(coef: torch.Tensor) -> torch.Tensor:
    """Per column j of ``coef`` (batched ``[..., m, k]``): +1 or -1 so that the column's entry of largest magnitude
    becomes positive (the convention of scikit-learn's ``svd_flip``).

    A singular pair (u_j, v_j) is defined up to a common sign, and LAPACK on CPU and cuSOLVER on CUDA choose
    differently. Anything drawn in that basis (``operators.rotate_subspace`` pairs v_j with a random direction)
    then differs by device. ``coef`` holds each vector's coefficients on the factor's own columns (U = X @ left),
    which do not depend on how the Gram root was taken, so the sign fixed here is the same on every device.
    Columns that are zero keep +1.
    """
    pick = coef.abs().argmax(dim=-2, keepdim=True)
    sign = torch.sign(coef.gather(-2, pick)).squeeze(-2)
    return torch.where(sign == 0, torch.ones_like(sign), sign)


def factored_svds(
    products: Sequence[Product], scaling: float = 1.0, roots: tuple[Sequence[GramRoot], Sequence[GramRoot]] | None = None
) -> list[FactoredSVD]:
    """Thin SVD of each s * [out_blocks] D [in_blocks]^T (blocks tall: d x r_i; D = diag(weights) for a vector,
    the m x m matrix itself for a matrix, I for None). ``roots``: the (out, in) ``GramRoot`` lists when the
    caller already has them (e.g. from diagonal blocks of a larger Gram, ``roots_of_grams``); the blocks are
    then not read."""
    if roots is None:
        x_roots = gram_roots([out for out, _, _ in products])
        y_roots = gram_roots([inp for _, inp, _ in products])
    else:
        x_roots, y_roots = list(roots[0]), list(roots[1])
    cores = []
    for (_, _, weights), x_root, y_root in zip(products, x_roots, y_roots):
        cores.append(x_root.root if weights is None else _times_middle(x_root.root, weights.to(x_root.root)))
    result: list[FactoredSVD | None] = [None] * len(products)
    for indices in _group_by_shape(cores).values():
        x_r = torch.stack([cores[i] for i in indices])
        y_r = torch.stack([y_roots[i].root for i in indices])
        core_u, sigma, core_vh = on_threads(torch.linalg.svd, scaling * x_r @ y_r.mT)
        left = torch.stack([x_roots[i].pinv for i in indices]) @ core_u
        sign = canonical_signs(left)  # one sign per singular pair, the same on every device
        left, core_u, core_vh = left * sign[:, None, :], core_u * sign[:, None, :], core_vh * sign[:, :, None]
        right = torch.stack([y_roots[i].pinv for i in indices]) @ core_vh.mT
        for pos, i in enumerate(indices):
            result[i] = FactoredSVD(sigma[pos], left[pos], right[pos], core_u[pos], core_vh[pos].mT, x_roots[i], y_roots[i])
    return result  # type: ignore[return-value]


@dataclass
class OneSidedSVD:
    """Top ``k`` components of W = X D Y^T, from the Gram root of X and the plain Gram of Y (no root of Y).

    W W^T = Q_x K Q_x^T with K = R_x D G_y D R_x^T = U_m diag(lambda) U_m^T, so

        sigma = sqrt(lambda),   U = Q_x U_m = X R_x^+ U_m,   sigma V^T = U^T W = U_m^T R_x D Y^T.

    The balanced factors of the top-k product come as float32 coefficients: X @ ``out_coef`` (m x k) =
    U diag(sqrt(sigma)) and ``in_coef`` (k x m) @ Y^T = diag(sqrt(sigma)) V^T (zero rows where sigma = 0).
    ``sigma`` holds all m values (kept first), ``basis`` the kept U_m, ``h`` = G_y (R_x D)^T (K = R_x D h), so
    inner products with other products in the same spans stay r-sized (see ``blend_svd``).
    """

    sigma: torch.Tensor
    out_coef: torch.Tensor
    in_coef: torch.Tensor
    basis: torch.Tensor
    h: torch.Tensor
    x_root: GramRoot
    gram_y: torch.Tensor


def one_sided_svds(
    products: Sequence[tuple[Sequence[torch.Tensor], Sequence[torch.Tensor], torch.Tensor]],
    keep: Sequence[int],
    grams: Sequence[tuple[torch.Tensor, torch.Tensor]] | None = None,
    x_roots: Sequence[GramRoot] | None = None,
    root_middles: Sequence[torch.Tensor] | None = None,
) -> list[OneSidedSVD]:
    """Top-``keep[i]`` SVD of each [out_blocks] D [in_blocks]^T by one eigendecomposition of K.

    D is diag(weights) for a weight vector, or the m x m matrix given. In both cases T = R_x D is formed
    first and K = T G_y T^T with ``h`` = G_y T^T (so K = T h): two m x m products for any D. ``root_middles``:
    T itself for each product when the caller has it from structure (e.g. ``operators._component_cores``);
    the products' D is then not read.

    Against ``factored_svds`` it skips the root of Y (Cholesky, kappa check, inverse) and swaps the m x m SVD
    for a symmetric eigendecomposition (about half the time). The price is precision in the smallest kept
    components: lambda = sigma^2 is resolved to eps64 lambda_max, so sigma_j to ~1e-8 sigma_max, and sigma V^T
    carries the error of U_m scaled by sigma_max / sigma_j. Callers keep ``factored_svds`` for products whose
    kept sigma fall near the null threshold, where a unit V row is needed. ``grams``: each product's
    (out Gram, in Gram) from ``block_gram`` when the caller already has them (then they are not recomputed);
    ``x_roots``: with ``grams``, the out Grams' ``GramRoot`` when the caller has those too.
    """
    if grams is not None and x_roots is not None:
        x_roots, grams_y = list(x_roots), [gy for _, gy in grams]
    elif grams is None:
        x_roots = gram_roots([out for out, _, _ in products])
        grams_y = [block_gram(inp, torch.float32) for _, inp, _ in products]
    else:  # the caller's block Grams (float64 holding float32 products, as ``block_gram`` makes them)
        x_roots = roots_of_grams([gx for gx, _ in grams], [[x.shape[1] for x in out] for out, _, _ in products],
                                 [lambda out=out: block_gram(out, torch.float64) for out, _, _ in products])
        grams_y = [gy for _, gy in grams]
    result: list[OneSidedSVD | None] = [None] * len(products)
    groups: dict[tuple, list[int]] = {}
    for i, gram in enumerate(grams_y):
        middle_dim = -1 if root_middles is not None else products[i][2].dim()
        groups.setdefault((tuple(gram.shape), gram.device, keep[i], middle_dim), []).append(i)
    for (_, _, kept, _), indices in groups.items():
        gram_y = torch.stack([grams_y[i] for i in indices])
        check_finite(gram_y)
        pinv = torch.stack([x_roots[i].pinv for i in indices])
        if root_middles is not None:
            root_d = torch.stack([root_middles[i].to(gram_y) for i in indices])
        else:
            root = torch.stack([x_roots[i].root for i in indices])
            root_d = _times_middle(root, torch.stack([products[i][2].to(gram_y) for i in indices]))
        h = gram_y @ root_d.mT
        core = root_d @ h
        lam, vec = on_threads(torch.linalg.eigh, core)  # eigh reads one triangle: no symmetrising pass needed
        sigma = lam.flip(-1).clamp_min(0).sqrt()
        basis = vec[:, :, -kept:].flip(-1) if kept else vec[:, :, :0]
        basis = basis * canonical_signs(pinv @ basis)[:, None, :]  # eigenvector signs, the same on every device
        half = sigma[:, :kept].sqrt()
        out_coef = ((pinv @ basis) * half[:, None, :]).to(torch.float32)
        inverse = torch.where(half > 0, 1.0 / half.where(half > 0, torch.ones_like(half)), torch.zeros_like(half))
        in_coef = ((basis.mT @ root_d) * inverse[:, :, None]).to(torch.float32)
        for pos, i in enumerate(indices):
            result[i] = OneSidedSVD(sigma[pos], out_coef[pos], in_coef[pos], basis[pos], h[pos], x_roots[i], gram_y[pos])
    return result  # type: ignore[return-value]


def factored_svd(
    out_blocks: Sequence[torch.Tensor],
    in_blocks: Sequence[torch.Tensor],
    weights: torch.Tensor | None = None,
    scaling: float = 1.0,
) -> FactoredSVD:
    """Thin SVD of s * [out_blocks] diag(weights) [in_blocks]^T (each block tall: d x r_i)."""
    return factored_svds([(out_blocks, in_blocks, weights)], scaling)[0]


def thin_svd(a: torch.Tensor, b: torch.Tensor, scaling: float = 1.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(U, sigma, Vh) of Delta W = s * b @ a for one slot (a: r x d_in, b: d_out x r), float32 U/Vh, float64 sigma.

    Components with sigma = 0 (rank below r) have zero or arbitrary columns of U / rows of Vh.
    """
    svd = factored_svd([b.float()], [a.float().mT], scaling=scaling)
    u = b.float() @ svd.left.to(torch.float32)
    vh = (a.float().mT @ svd.right.to(torch.float32)).mT
    return u, svd.sigma, vh


def householder_svd(a: torch.Tensor, b: torch.Tensor, scaling: float = 1.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Reference route: float64 Householder QR of B and A^T, SVD of the core (U, sigma, Vh in float64)."""
    q_b, r_b = torch.linalg.qr(b.double())
    q_a, r_a = torch.linalg.qr(a.double().mT)
    core_u, sigma, core_vh = torch.linalg.svd(scaling * r_b @ r_a.mT)
    return q_b @ core_u, sigma, core_vh @ q_a.mT


def balanced_factors(
    u: torch.Tensor, sigma: torch.Tensor, vh: torch.Tensor, scaling: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """(A, B) with s * B @ A = U diag(sigma) Vh and equal factor norms: B = U sqrt(sigma/s), A = sqrt(sigma/s) Vh."""
    root = (sigma.clamp_min(0) / scaling).sqrt().to(u.dtype)
    return root[:, None] * vh, u * root[None, :]
