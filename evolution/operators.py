"""LoRA weight-space mutations and crossovers that keep the rank, keys, shapes and dtype of their parents.

Every operator takes PEFT state dicts (see ``evolution.adapter_slots``), acts slot by slot on
Delta W = s B A, and returns a :class:`Child` with a per-slot report whose ``relative_change`` is
||Delta W' - Delta W||_F / ||Delta W||_F (for a crossover: to the nearer parent). The scaling s is the
same for parents and child, so it cancels out of every child factor and every reported ratio.

SVD-based operators rebuild balanced factors B' = U sqrt(Sigma'), A' = sqrt(Sigma') V^T (s = 1 here),
except for null directions (sigma_j <= 1e-6 sigma_max, e.g. a freshly initialised adapter with B = 0):
there B' gets a zero column and A' the unit row v_j^T times the parent's RMS row norm of A, so the child
keeps Delta W and stays trainable (PEFT's own init is the same shape: B = 0, A != 0).

Same generator seed, same parents -> same child. Random numbers come from the generator in slot key order
on its device; the large Gaussian blocks are drawn on a thread pool, each from its own stream seeded in
key order. Thin SVDs run on the parents' device (CPU or CUDA) in float32 with float64 r x r maths.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal

import torch

from evolution.adapter_slots import Adapter, Slot, check_same_layout, find_slots
from evolution.shards import flat, in_pool_thread, in_shards, thread_pool
from configs.operators import check_strength
from evolution.thin_svd import (
    FactoredSVD,
    GramRoot,
    OneSidedSVD,
    block_gram,
    check_finite,
    factored_svds,
    on_threads,
    one_sided_svds,
    roots_of_grams,
    tall_inner,
    tall_times,
)

NULL_SIGMA = 1e-6
NORMAL_CHUNK = 1 << 16  # entries per normal_ call on CPU (256 KiB of float32)

SlotReport = dict[str, float | str]


@dataclass
class Child:
    """A child adapter, the operator and strength that made it, and what it changed per slot."""

    state_dict: dict[str, torch.Tensor]
    operator: str
    strength: float
    report: dict[str, SlotReport] = field(default_factory=dict)

    @property
    def max_relative_change(self) -> float:
        return max((float(r["relative_change"]) for r in self.report.values()), default=0.0)

    @property
    def mean_relative_change(self) -> float:
        values = [float(r["relative_change"]) for r in self.report.values()]
        return sum(values) / len(values) if values else 0.0

    @property
    def max_truncation_error(self) -> float | None:
        values = [float(r["truncation_error"]) for r in self.report.values() if "truncation_error" in r]
        return max(values) if values else None

    def summary(self) -> dict[str, float | str | None]:
        """JSON-ready digest for logs and lineage."""
        return {
            "operator": self.operator,
            "strength": self.strength,
            "max_relative_change": self.max_relative_change,
            "mean_relative_change": self.mean_relative_change,
            "max_truncation_error": self.max_truncation_error,
        }


def _ratio(num: float, den: float) -> float:
    if den > 0:
        return num / den
    return 0.0 if num == 0 else math.inf


def _randn(shape: tuple[int, ...], generator: torch.Generator | None, device: torch.device, dtype=torch.float32) -> torch.Tensor:
    return torch.randn(shape, generator=generator, device=_gen_device(generator), dtype=dtype).to(device)


def _gen_device(generator: torch.Generator | None) -> torch.device:
    return generator.device if generator is not None else torch.device("cpu")


def _slot_generators(generator: torch.Generator | None, count: int) -> list[torch.Generator]:
    """``count`` independent streams seeded from ``generator``: deterministic for a seeded generator,
    whatever order the slots are then drawn in."""
    where = _gen_device(generator)
    seeds = torch.randint(0, 2**62, (count,), generator=generator, device=where).tolist()
    return [torch.Generator(device=where).manual_seed(seed) for seed in seeds]


def _factor_scales(sigma: torch.Tensor, a_sq_norm: float, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per component: B column scale sqrt(sigma) and A row scale (sqrt(sigma), or the RMS A row norm if null)."""
    top = float(sigma.max()) if sigma.numel() else 0.0
    alive = sigma > NULL_SIGMA * top if top > 0 else torch.zeros_like(sigma, dtype=torch.bool)
    root = torch.where(alive, sigma.clamp_min(0).sqrt(), torch.zeros_like(sigma))
    idle = math.sqrt(a_sq_norm / rank) if rank else 0.0
    return root, torch.where(alive, root, torch.full_like(sigma, idle))


def _f32(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float32)


def _finish(parent: Adapter, factors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Child tensors in the parent's key order and dtypes."""
    return {key: factors[key].to(parent[key].dtype).contiguous() for key in parent}


def _each_slot(parent: Adapter) -> list[tuple[Slot, torch.Tensor, torch.Tensor]]:
    return [(slot, parent[slot.a_key].detach().float(), parent[slot.b_key].detach().float()) for slot in find_slots(parent)]


# ---------------------------------------------------------------------------------------------- mutations


def perturb_singular_values(parent: Adapter, strength: float = 0.1, generator: torch.Generator | None = None) -> Child:
    """Log-normal singular values: sigma_j' = sigma_j exp(strength z_j), z ~ N(0, I_r); U and V unchanged.

    relative change = ||sigma' - sigma|| / ||sigma||.
    """
    strength = check_strength("perturb_singular_values", strength)

    def new_sigma(sigma: torch.Tensor) -> tuple[torch.Tensor, SlotReport]:
        z = _randn(tuple(sigma.shape), generator, sigma.device, torch.float64)
        return sigma * torch.exp(strength * z), {}

    return _with_singular_values(parent, "perturb_singular_values", strength, new_sigma)


def mask_components(
    parent: Adapter, strength: float = 0.25, generator: torch.Generator | None = None, rescale: bool = False
) -> Child:
    """Drop each singular component with probability p = ``strength``: sigma_j' = m_j sigma_j, m_j ~ Bernoulli(1 - p).

    U and V are kept; a dropped component becomes a null one (zero B column, unit A row scaled to the RMS
    A row norm), so the child keeps its rank r of trainable directions. relative change =
    ||sigma' - sigma|| / ||sigma|| = sqrt(sum_dropped sigma_j^2) / ||sigma||.

    Not rescaled by default: Delta W' is then the orthogonal projection of Delta W onto the kept components,
    the nearest matrix to Delta W with those components, and the change is only the dropped energy. DARE's
    1 / (1 - p) keeps E[Delta W'] = Delta W over many draws, but a single child is one draw: rescaling
    inflates every kept direction by 1 / (1 - p), which adds (p / (1 - p))^2 sum_kept sigma^2 to the squared
    change (for p = 0.25: the change at least doubles) without restoring the dropped directions.
    ``rescale=True`` gives DARE's convention. The drops use u_j < p on one uniform u_j per component, so for
    one generator seed a larger p drops a superset.
    """
    strength = check_strength("mask_components", strength)
    if rescale and strength >= 1:
        raise ValueError("mask_components: rescale needs strength < 1")

    def new_sigma(sigma: torch.Tensor) -> tuple[torch.Tensor, SlotReport]:
        keep = (torch.rand(tuple(sigma.shape), generator=generator, device=_gen_device(generator), dtype=torch.float64) >= strength)
        keep = keep.to(sigma.device, sigma.dtype)
        scale = 1.0 / (1.0 - strength) if rescale else 1.0
        return sigma * keep * scale, {"dropped": float((keep == 0).sum())}

    return _with_singular_values(parent, "mask_components", strength, new_sigma)


def _with_singular_values(
    parent: Adapter, name: str, strength: float, new_sigma: Callable[[torch.Tensor], tuple[torch.Tensor, SlotReport]]
) -> Child:
    """Each slot rebuilt as U diag(sigma') V^T (balanced factors), sigma' = ``new_sigma(sigma)`` in slot key order.

    The SVDs and the rebuilds run in shards (``evolution.shards``); ``new_sigma`` draws on this thread."""
    with torch.no_grad():
        items = _each_slot(parent)
        device = _device_of(items)
        svds = flat(in_shards(lambda part: factored_svds([([b], [a.mT], None) for _, a, b in part]), items, device))
        sigmas = [new_sigma(svd.sigma) for svd in svds]

        def rebuild(part: list) -> list[tuple[str, dict[str, torch.Tensor], SlotReport]]:
            out = []
            for (slot, a, b), svd, (sigma, extra) in part:
                b_scale, a_scale = _factor_scales(sigma, svd.y_root.block_sq_norms[0], a.shape[0])
                new_b = tall_times([(b, _f32(svd.left * b_scale[None, :]))])
                new_a = _f32(svd.right * a_scale[None, :]).mT @ a
                change = _ratio(float(torch.linalg.vector_norm(sigma - svd.sigma)), float(torch.linalg.vector_norm(svd.sigma)))
                out.append((slot.name, {slot.a_key: new_a, slot.b_key: new_b}, {"relative_change": change, **extra}))
            return out

        factors, report = _collect(flat(in_shards(rebuild, list(zip(items, svds, sigmas)), device)))
    return Child(_finish(parent, factors), name, strength, report)


def _device_of(items: list) -> torch.device:
    return items[0][1].device if items else torch.device("cpu")


def _collect(rows: list[tuple[str, dict[str, torch.Tensor], SlotReport]]) -> tuple[dict[str, torch.Tensor], dict[str, SlotReport]]:
    """(factors, report) from per-slot (name, child tensors, report) rows."""
    factors: dict[str, torch.Tensor] = {}
    report: dict[str, SlotReport] = {}
    for name, tensors, slot_report in rows:
        factors.update(tensors)
        report[name] = slot_report
    return factors, report


def _outside_span_gram(tall: torch.Tensor, coef: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """W0^T W0 for W0 = (I - P) G, P the orthogonal projector onto span(tall @ coef), formed in the dtype given."""
    w0 = g - tall @ (coef @ (coef.mT @ (tall.mT @ g)))
    return w0.mT @ w0


def _draw_in_parallel(
    shapes: list[tuple[int, ...]], generator: torch.Generator | None, device: torch.device, stds: list[float] | None = None
) -> list[torch.Tensor]:
    """One Gaussian tensor N(0, std^2) per shape, each from its own stream seeded from ``generator``, on a pool
    of threads: torch draws normals on one thread, and for a 7B-shaped adapter (~160M entries) that dominates."""
    stds = [1.0] * len(shapes) if stds is None else stds

    def draw(shape: tuple[int, ...], std: float, g: torch.Generator) -> torch.Tensor:
        out = torch.empty(shape, device=g.device)
        # on CPU, torch fills uniforms and then transforms them in a second pass: chunks that stay in cache
        # draw ~25% faster than one pass over a 5 MB tensor
        chunk = NORMAL_CHUNK if out.device.type == "cpu" else out.numel()
        for part in out.view(-1).split(max(1, chunk)):
            part.normal_(0.0, std, generator=g)
        return out.to(device)

    streams = _slot_generators(generator, len(shapes))
    if in_pool_thread():  # already on a pool thread: waiting on the pool could deadlock
        return [draw(shape, std, g) for shape, std, g in zip(shapes, stds, streams)]
    return list(thread_pool(max(1, torch.get_num_threads())).map(draw, shapes, stds, streams))


def rotate_subspace(
    parent: Adapter,
    strength: float = 0.1,
    generator: torch.Generator | None = None,
    side: Literal["input", "output", "both", "random"] = "random",
) -> Child:
    """Move singular vectors out of their span by the angle ``strength`` (radians); singular values unchanged.

    A Grassmann step per slot: v_j' = cos(theta) v_j + sin(theta) w_j with W an orthonormal basis of a random
    subspace orthogonal to span(V) (input side, the rows of A), likewise for U (output side, the columns of B).
    ``side='random'`` picks one side per slot. Rotating k = min(r, d - r) components (all r when d >= 2r):
    relative change^2 = sum_j 2(1 - cos theta) sigma_j^2 / ||sigma||^2 for one side, 2 sin^2(theta) sigma_j^2 for both.
    (Rotating U_m and V_m inside the r x r core would be a no-op on the spans: (B R)(R^T A) = B A.)
    """
    strength = check_strength("rotate_subspace", strength)
    if side not in ("input", "output", "both", "random"):
        raise ValueError(f"rotate_subspace: side must be 'input', 'output', 'both' or 'random', got {side!r}")
    cos, sin = math.cos(strength), math.sin(strength)
    where = _gen_device(generator)
    with torch.no_grad():
        items = _each_slot(parent)
        device = _device_of(items)
        svds = flat(in_shards(lambda part: factored_svds([([b], [a.mT], None) for _, a, b in part]), items, device))
        # phase 1: per slot, the side(s), the moved components and the raw directions W0 outside the span
        plans, directions = [], []
        for (slot, a, b), svd in zip(items, svds):
            rank, d_out, d_in = a.shape[0], b.shape[0], a.shape[1]
            slot_side = side
            if side == "random":
                slot_side = ("input", "output")[int(torch.randint(2, (1,), generator=generator, device=where))]
            sides = ("input", "output") if slot_side == "both" else (slot_side,)
            k = max(0, min([rank] + [(d_in if s == "input" else d_out) - rank for s in sides]))
            if k == rank:
                moved = torch.arange(rank)
            else:
                moved = torch.randperm(rank, generator=generator, device=where)[:k].sort().values
            slot_dirs = {}
            if k > 0 and "input" in sides:
                slot_dirs["input"] = len(directions)
                directions.append((a.mT, svd.right, k))
            if k > 0 and "output" in sides:
                slot_dirs["output"] = len(directions)
                directions.append((b, svd.left, k))
            plans.append((slot_side, sides, k, moved.to(svd.sigma.device), slot_dirs))
        gaussians = _draw_in_parallel([(tall.shape[0], k) for tall, _, k in directions], generator, device)
        proj_roots = flat(in_shards(_outside_span_roots, list(zip(directions, gaussians)), device))
        projs, roots = [proj for proj, _ in proj_roots], [root for _, root in proj_roots]

        def rotated(part: list) -> list[tuple[str, dict[str, torch.Tensor], SlotReport]]:
            return [_rotated_slot(item, svd, plan, projs, roots, gaussians, cos, sin) for item, svd, plan in part]

        factors, report = _collect(flat(in_shards(rotated, list(zip(items, svds, plans)), device)))
    return Child(_finish(parent, factors), "rotate_subspace", strength, report)


def _outside_span_roots(part: list) -> list[tuple[torch.Tensor, GramRoot]]:
    """``rotate_subspace``'s phase 2 on a shard of ((tall, coef, k), G) directions: W = W0 R^+ orthonormal, for
    W0 = (I - Q Q^T) G and Q = tall @ coef (orthonormal). W0 is never formed: W0 = G - tall @ proj with
    proj = coef H, H = coef^T tall^T G, and W0^T W0 = G^T G - H^T H. Returns (proj, root of W0) per direction."""
    projs, grams, exact = [], [], []
    for (tall, coef, _), g in part:
        h = coef.mT @ tall_inner(tall, g).double()
        projs.append(coef @ h)
        grams.append(tall_inner(g, g).double() - h.mT @ h)
        exact.append(lambda tall=tall, coef=coef, g=g: _outside_span_gram(tall.double(), coef, g.double()))
    return list(zip(projs, roots_of_grams(grams, [[g.shape[1]] for _, g in part], exact)))


def _rotated_slot(item: tuple, svd: FactoredSVD, plan: tuple, projs: list[torch.Tensor], roots: list[GramRoot],
                  gaussians: list[torch.Tensor], cos: float, sin: float) -> tuple[str, dict[str, torch.Tensor], SlotReport]:
    """``rotate_subspace``'s phase 3 for one slot: the child factors and the report."""
    (slot, a, b), (slot_side, sides, k, moved, slot_dirs) = item, plan
    rank = a.shape[0]
    turn = torch.ones(rank, dtype=torch.float64, device=svd.sigma.device)
    turn[moved] = cos
    b_scale, a_scale = _factor_scales(svd.sigma, svd.y_root.block_sq_norms[0], rank)
    # A' = diag(a) V'^T and B' = U' diag(b), with V' = V C + W S on the moved columns (U' likewise);
    # the -tall @ proj part of W0 folds into the r x r matrix that multiplies the parent factor
    to_a = (svd.right * (a_scale * (turn if "input" in sides else 1.0))[None, :]).mT
    to_b = svd.left * (b_scale * (turn if "output" in sides else 1.0))[None, :]
    mix_a = mix_b = None
    if "input" in slot_dirs:
        i = slot_dirs["input"]
        mix_a = torch.zeros(rank, k, dtype=torch.float64, device=svd.sigma.device)
        mix_a[moved] = (a_scale[moved] * sin)[:, None] * roots[i].pinv.mT
        to_a = to_a - mix_a @ projs[i].mT
    if "output" in slot_dirs:
        i = slot_dirs["output"]
        mix_b = torch.zeros(k, rank, dtype=torch.float64, device=svd.sigma.device)
        mix_b[:, moved] = roots[i].pinv * (b_scale[moved] * sin)[None, :]
        to_b = to_b - projs[i] @ mix_b
    new_a = _f32(to_a) @ a
    if mix_a is not None:
        new_a.addmm_(_f32(mix_a), gaussians[slot_dirs["input"]].mT)
    b_terms = [(b, _f32(to_b))]
    if mix_b is not None:
        b_terms.append((gaussians[slot_dirs["output"]], _f32(mix_b)))
    new_b = tall_times(b_terms)
    per_component = 2 * sin**2 if len(sides) == 2 else 2 * (1 - cos)
    sq = svd.sigma.square()
    change = _ratio(math.sqrt(per_component * float(sq[moved].sum())), math.sqrt(float(sq.sum())))
    return slot.name, {slot.a_key: new_a, slot.b_key: new_b}, {"relative_change": change, "rotated": float(k), "side": slot_side}


def gaussian_noise(parent: Adapter, strength: float = 0.1, generator: torch.Generator | None = None) -> Child:
    """A' = A + strength rms(A) N, B' = B + strength rms(B) N (N ~ N(0, 1) per entry, rms = ||T||_F / sqrt(numel)).

    Factors stay in the parent's gauge. The relative change is exact, from r x r Gram blocks:
    B'A' - BA = [B, dB] K [A; dA] with K = [[0, I], [I, I]], so ||.||_F^2 = tr(K^T G_X K G_Y).
    The parent blocks B^T B and A A^T come first: their traces give the rms scales.
    """
    strength = check_strength("gaussian_noise", strength)
    with torch.no_grad():
        items = _each_slot(parent)
        device = _device_of(items)
        own = flat(in_shards(lambda part: [(tall_inner(b, b), tall_inner(a.mT, a.mT)) for _, a, b in part], items, device))
        stds = []
        for (_, a, b), (gram_b, gram_a) in zip(items, own):
            for gram, factor in ((gram_a, a), (gram_b, b)):
                stds.append(strength * math.sqrt(max(float(gram.trace()), 0.0) / factor.numel()))
        drawn = _draw_in_parallel([tuple(t.shape) for _, a, b in items for t in (a, b)], generator, device, stds)
        rows = flat(in_shards(_noised_slots, list(zip(items, own, drawn[0::2], drawn[1::2])), device))
        factors, report = _collect(rows)
    return Child(_finish(parent, factors), "gaussian_noise", strength, report)


def _noised_slots(part: list) -> list[tuple[str, dict[str, torch.Tensor], SlotReport]]:
    """``gaussian_noise`` on one shard of (slot item, its (B, A) Grams, noise for A, noise for B): child factors and
    the exact relative change ||[B, dB] K [A; dA]||_F / ||B A||_F from the Gram blocks (K = [[0, I], [I, I]])."""
    grams, rows = [], []
    for (slot, a, b), (gram_b, gram_a), noise_a, noise_b in part:
        grams.append((_with_noise_gram(gram_b, b, noise_b), _with_noise_gram(gram_a, a.mT, noise_a.mT)))
        rows.append((slot.name, {slot.a_key: noise_a.add_(a), slot.b_key: noise_b.add_(b)}))
    changes: dict[int, float] = {}
    by_rank: dict[tuple, list[int]] = {}
    for i, (gx, _) in enumerate(grams):
        by_rank.setdefault((gx.shape[0], gx.device), []).append(i)
    for (size, device), indices in by_rank.items():
        rank = size // 2
        gx = torch.stack([grams[i][0] for i in indices])
        gy = torch.stack([grams[i][1] for i in indices])
        eye = torch.eye(rank, dtype=torch.float64, device=device)
        k = torch.cat([torch.cat([torch.zeros_like(eye), eye], 1), torch.cat([eye, eye], 1)], 0)
        diff_sq = ((k.mT @ gx @ k) * gy).sum((1, 2)).clamp_min(0).sqrt().tolist()
        base_sq = (gx[:, :rank, :rank] * gy[:, :rank, :rank]).sum((1, 2)).clamp_min(0).sqrt().tolist()
        for i, num, den in zip(indices, diff_sq, base_sq):
            changes[i] = _ratio(num, den)
    return [(name, tensors, {"relative_change": changes[i]}) for i, (name, tensors) in enumerate(rows)]


def layer_noise(
    parent: Adapter, strength: float = 0.1, generator: torch.Generator | None = None, fraction: float = 0.25
) -> Child:
    """``gaussian_noise`` on the slots of a random subset of layers, the other slots copied unchanged.

    k = max(1, round(``fraction`` L)) of the L layer indices are drawn without replacement (slots without a
    layer index count as one extra "layer"); every slot in them gets A' = A + strength rms(A) N,
    B' = B + strength rms(B) N. The report marks each slot ``noised`` 1 or 0; relative change is exact
    (``gaussian_noise``'s Gram formula) on noised slots and 0 elsewhere.
    """
    strength = check_strength("layer_noise", strength)
    if not (isinstance(fraction, (int, float)) and 0 < fraction <= 1):
        raise ValueError(f"layer_noise: fraction must be in (0, 1], got {fraction!r}")
    slots = find_slots(parent)
    layers = sorted({s.layer for s in slots}, key=lambda layer: (layer is None, layer or 0))
    count = max(1, round(fraction * len(layers))) if layers else 0
    order = torch.randperm(len(layers), generator=generator, device=_gen_device(generator)).tolist()
    chosen = {layers[i] for i in order[:count]}
    noised = [s for s in slots if s.layer in chosen]
    inner = gaussian_noise({k: parent[k] for s in noised for k in (s.a_key, s.b_key)}, strength, generator)
    factors = {key: tensor.detach().clone() for key, tensor in parent.items()}
    factors.update(inner.state_dict)
    report: dict[str, SlotReport] = {}
    for slot in slots:
        if slot.layer in chosen:
            report[slot.name] = {**inner.report[slot.name], "noised": 1.0}
        else:
            report[slot.name] = {"relative_change": 0.0, "noised": 0.0}
    return Child(_finish(parent, factors), "layer_noise", strength, report)


def _with_noise_gram(gram: torch.Tensor, tall: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """[X, N]^T [X, N] in float64, given X^T X (X, N: d x r)."""
    cross = tall_inner(tall, noise)
    return torch.cat([torch.cat([gram, cross], 1), torch.cat([cross.mT, tall_inner(noise, noise)], 1)]).double()


# --------------------------------------------------------------------------------------------- crossovers


def swap_slots(
    a: Adapter,
    b: Adapter,
    generator: torch.Generator | None = None,
    mode: Literal["slots", "layers"] = "slots",
) -> Child:
    """Each slot's (A, B) pair is copied whole from one parent, so each slot's Delta W is exactly one parent's.

    ``mode='slots'``: a fair coin per slot. ``mode='layers'``: one contiguous block of layers (every module in
    them) comes from parent b, the rest from a (slots without a layer index in their key get a coin).
    The report gives ``source`` ('a' or 'b') and ``relative_change`` 0 (to the parent it came from).
    """
    if mode not in ("slots", "layers"):
        raise ValueError(f"swap_slots: mode must be 'slots' or 'layers', got {mode!r}")
    slots = check_same_layout(a, b)
    where = _gen_device(generator)
    from_b = [bool(c) for c in torch.randint(2, (len(slots),), generator=generator, device=where).tolist()]
    if mode == "layers":
        layers = sorted({s.layer for s in slots if s.layer is not None})
        if layers:
            start = int(torch.randint(len(layers), (1,), generator=generator, device=where))
            length = int(torch.randint(1, max(2, len(layers)), (1,), generator=generator, device=where))
            block = set(layers[start : start + length])
            from_b = [(s.layer in block) if s.layer is not None else coin for s, coin in zip(slots, from_b)]
    factors, report = {}, {}
    for slot, take_b in zip(slots, from_b):
        source = b if take_b else a
        factors[slot.a_key] = source[slot.a_key].detach().clone()
        factors[slot.b_key] = source[slot.b_key].detach().clone()
        report[slot.name] = {"relative_change": 0.0, "source": "b" if take_b else "a"}
    return Child(_finish(a, factors), "swap_slots", 0.0, report)


def blend_svd(a: Adapter, b: Adapter, weight: float = 0.5, generator: torch.Generator | None = None) -> Child:
    """Best rank-r approximation (Eckart-Young) of w dW_a + (1 - w) dW_b, from the concatenated factors.

    s (w B_a A_a + (1-w) B_b A_b) = s [B_a, B_b] diag(w I, (1-w) I) [A_a; A_b] has rank <= 2r; its top r
    components give the child. Per slot the report holds ``truncation_error`` = ||sigma_{r+1..2r}|| / ||sigma||
    (relative to the blend), ``relative_change_a``/``_b`` (to each parent) and ``relative_change`` = the
    smaller one. Deterministic: ``generator`` is unused.

    Route: ``one_sided_svds`` (Cholesky root of the B Gram, eigendecomposition of K = R D G_A D R^T). A slot
    whose kept sigma reach the null threshold (a parent of rank < r, e.g. B = 0) goes the two-sided
    ``factored_svds`` route instead, which gives null components the unit A rows described in the module
    docstring.
    """
    weight = check_strength("blend_svd", weight)
    pairs = _pairs(a, b)
    middles = []
    for pair in pairs:
        ones = torch.ones(pair[1].shape[0], dtype=torch.float64)
        middles.append(torch.cat([weight * ones, (1 - weight) * ones]))
    return _rank_r_merge(a, pairs, "blend_svd", weight, middles=middles)


def extrapolate(a: Adapter, b: Adapter, strength: float = 1.5, generator: torch.Generator | None = None) -> Child:
    """Best rank-r approximation of dW_b + eta (dW_a - dW_b) = dW_a + (eta - 1)(dW_a - dW_b), eta = ``strength``.

    The paper's extrapolative crossover (X4 of ``reference/azr_populora.md``: worse + eta (better - worse),
    eta in [1, 1.5]): the point on the line from parent b through parent a, at eta = 1 parent a itself, past
    it for eta > 1 (the replacement policy passes the stronger parent as a). As a blend,
    s [B_a, B_b] diag(eta I, (1 - eta) I) [A_a; A_b] has rank <= 2r and is truncated to r like ``blend_svd``
    (same route, same report: ``truncation_error`` = ||sigma_{r+1..2r}|| / ||sigma|| of the extrapolated
    product, ``relative_change_a``/``_b``). ||child - dW_a|| ~ (eta - 1) ||dW_a - dW_b||.
    Deterministic: ``generator`` is unused.
    """
    eta = check_strength("extrapolate", strength)
    pairs = _pairs(a, b)
    middles = []
    for pair in pairs:
        ones = torch.ones(pair[1].shape[0], dtype=torch.float64)
        middles.append(torch.cat([eta * ones, (1 - eta) * ones]))
    return _rank_r_merge(a, pairs, "extrapolate", eta, middles=middles)


def dare(
    a: Adapter, b: Adapter, strength: float = 0.1, generator: torch.Generator | None = None, weight: float = 0.5
) -> Child:
    """DARE on singular components: drop, rescale, merge, back to rank r.

    Each parent's dW_p = sum_j sigma_pj u_pj v_pj^T loses each rank-one component with probability
    p = ``strength`` and keeps the rest scaled by 1 / (1 - p) (so E[dW_p'] = dW_p, DARE's point); the child is
    the best rank-r approximation of w dW_a' + (1 - w) dW_b'. p = 0 is ``blend_svd(weight)``.

    Why components, not entries (Yu et al. drop entries of the task vector): an entry mask on dW is a dense
    d_out x d_in product (18944 x 3584 per 7B slot) of full rank, and a mask on the entries of A and B depends
    on the arbitrary split of dW into factors (B R, R^-1 A is the same adapter). The singular components are
    the adapter's own basis, and dropping them stays in r x r coordinates: dW_p' = B_p C_p A_p with
    C_p = R_p^+ U_p diag(c_p) U_p^T R_p (``_component_cores``), c_pj = w_p keep_pj / (1 - p), and the merge is
    [B_a, B_b] blockdiag(C_a, C_b) [A_a; A_b], truncated like ``blend_svd`` (same report).
    The drops use one uniform per component (per slot in key order: parent a's r, then b's): u < p drops.
    """
    strength = check_strength("dare", strength)
    weight = check_strength("blend_svd", weight)
    pairs = _pairs(a, b)
    where = _gen_device(generator)
    scale = 1.0 / (1.0 - strength)
    coefs = []
    for pair in pairs:
        rank = pair[1].shape[0]
        for w in (weight, 1 - weight):
            keep = torch.rand(rank, generator=generator, device=where, dtype=torch.float64) >= strength
            coefs.append((w * scale) * keep.double())
    return _rank_r_merge(a, pairs, "dare", strength, coefs=coefs)


def splice_svd(a: Adapter, b: Adapter, strength: float = 0.5, generator: torch.Generator | None = None) -> Child:
    """One-point crossover of the ranked singular components: a's top k, then b's components k+1..r.

    k = r - round(``strength`` r): strength 0 is parent a, 1 is parent b. The child
    sum_{j<=k} sigma_aj u_aj v_aj^T + sum_{j>k} sigma_bj u_bj v_bj^T has rank <= r but its two parts are not
    orthogonal to each other; its thin SVD (``blend_svd``'s route on [B_a, B_b] blockdiag(C_a, C_b) [A_a; A_b],
    C_p = R_p^+ U_p diag(c_p) U_p^T R_p with c_a = 1 on j <= k, c_b = 1 on j > k, see ``_component_cores``)
    re-orthogonalises them, so the child's factors are balanced U sqrt(Sigma), sqrt(Sigma) V^T and
    ``truncation_error`` is ~0 (reported). Deterministic: ``generator`` is unused.
    """
    strength = check_strength("splice_svd", strength)
    pairs = _pairs(a, b)
    coefs = []
    for pair in pairs:
        rank = pair[1].shape[0]
        from_a = (torch.arange(rank) < rank - round(strength * rank)).double()
        coefs += [from_a, 1 - from_a]
    return _rank_r_merge(a, pairs, "splice_svd", strength, coefs=coefs)


def _pairs(a: Adapter, b: Adapter) -> list[tuple[Slot, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]:
    """(slot, A_a, B_a, A_b, B_b) per slot, float32, after checking that the parents share one layout."""
    return [
        (slot, a[slot.a_key].detach().float(), a[slot.b_key].detach().float(), b[slot.a_key].detach().float(), b[slot.b_key].detach().float())
        for slot in check_same_layout(a, b)
    ]


def _component_cores(
    pairs: list, coefs: list[torch.Tensor]
) -> tuple[list[torch.Tensor], Callable[[int], torch.Tensor], list[tuple[torch.Tensor, torch.Tensor]], list[GramRoot]]:
    """Each slot's merge reweighting the parents' singular components, in the merge's root coordinates.

    Parent p (``coefs``: per slot a's then b's, r weights c_p each, ranked by sigma descending) in the
    one-sided form of ``one_sided_svds``: B_p = Q_p R_p (Gram root), K_p = R_p G_{A_p} R_p^T = U_p Lambda_p U_p^T,
    so u_pj = Q_p U_p e_j, sigma_pj v_pj^T = e_j^T U_p^T R_p A_p and

        sum_j c_pj sigma_pj u_pj v_pj^T = B_p C_p A_p,   C_p = F_p diag(c_p) P_p,   F_p = R_p^+ U_p,  P_p = U_p^T R_p.

    The merge is [B_a, B_b] blockdiag(C_a, C_b) [A_a; A_b] = Q T [A_a; A_b] with R the root of [B_a, B_b] and
    T = R blockdiag(C_a, C_b) = [(R_{:,a} F_a) diag(c_a) P_a, (R_{:,b} F_b) diag(c_b) P_b] (R_{:,p}: p's r columns
    of R), formed from r-wide products (a dense 2r x 2r middle would cost a 2r x 2r product more and its
    block structure would be multiplied out as zeros). No root of A_p and no SVD: one r x r eigh per parent,
    all parents of one rank in one batch.
    The Grams of [B_a, B_b] and [A_a^T, A_b^T] (what the merge needs anyway) are formed once; each parent's
    come from their diagonal blocks, so the parents cost only r x r work on top of the merge.

    Returns T per slot (``one_sided_svds(root_middles=)``), the middle blockdiag(C_a, C_b) of slot i on demand
    (for the two-sided route of rank-deficient slots), the block Grams and the merge roots.
    """
    grams = [(block_gram([b_a, b_b], torch.float32), block_gram([a_a.mT, a_b.mT], torch.float32)) for _, a_a, b_a, a_b, b_b in pairs]
    merge_roots = _merge_roots(pairs, grams)
    parent_roots = _parent_roots(pairs, grams, merge_roots)
    root_middles: list[torch.Tensor | None] = [None] * len(pairs)
    parts: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * len(pairs)
    groups: dict[tuple, list[int]] = {}
    for i, (gram_b, _) in enumerate(grams):
        groups.setdefault((gram_b.shape[0] // 2, gram_b.device), []).append(i)
    for (rank, _), indices in groups.items():
        sides = [(i, side) for i in indices for side in (slice(0, rank), slice(rank, 2 * rank))]  # a0, b0, a1, b1, ...
        root = torch.stack([parent_roots[2 * i + (side.start > 0)].root for i, side in sides])
        pinv = torch.stack([parent_roots[2 * i + (side.start > 0)].pinv for i, side in sides])
        gram_a = torch.stack([grams[i][1][side, side] for i, side in sides])
        check_finite(gram_a)
        _, vec = on_threads(torch.linalg.eigh, root @ (gram_a @ root.mT))  # eigh reads one triangle
        basis = vec.flip(-1)  # sigma descending, as the coefs are ranked
        weighted = torch.stack([coefs[2 * i + (side.start > 0)].to(basis) for i, side in sides])[:, :, None] * (basis.mT @ root)
        from_root = pinv @ basis  # F_p
        merge_root = torch.stack([merge_roots[i].root for i in indices])
        columns = merge_root.view(len(indices), 2 * rank, 2, rank).transpose(1, 2).reshape(2 * len(indices), 2 * rank, rank)
        blocks = (columns @ from_root) @ weighted  # R_{:,p} C_p, (2 slots) x 2r x r
        t = blocks.view(len(indices), 2, 2 * rank, rank).transpose(1, 2).reshape(len(indices), 2 * rank, 2 * rank)
        for pos, i in enumerate(indices):
            root_middles[i] = t[pos]
            parts[i] = (from_root[2 * pos : 2 * pos + 2], weighted[2 * pos : 2 * pos + 2])

    def middle_of(i: int) -> torch.Tensor:
        from_root, weighted = parts[i]  # type: ignore[misc]
        return torch.block_diag(*(from_root @ weighted).unbind())

    return root_middles, middle_of, grams, merge_roots  # type: ignore[return-value]


def _merge_roots(pairs: list, grams: list[tuple[torch.Tensor, torch.Tensor]]) -> list[GramRoot]:
    """``GramRoot`` of each slot's [B_a, B_b] from its block Gram (the merge's, shared with the parents)."""
    return roots_of_grams([gram_b for gram_b, _ in grams], [[b_a.shape[1], b_b.shape[1]] for _, _, b_a, _, b_b in pairs],
                          [lambda b_a=b_a, b_b=b_b: block_gram([b_a, b_b], torch.float64) for _, _, b_a, _, b_b in pairs])


def _parent_roots(pairs: list, grams: list[tuple[torch.Tensor, torch.Tensor]], merge_roots: list[GramRoot]) -> list[GramRoot]:
    """``GramRoot`` of B_a and B_b per slot (a's then b's), from the merge's root R of [B_a, B_b] where it is
    the Cholesky one: B_a's root is R[:r, :r] (inverse R^+[:r, :r]); B_b's is the Cholesky factor of its
    Gram block, with no conditioning check, since kappa(B_b) <= kappa([B_a, B_b]) (its singular values
    interlace) and the merge's passed. Other slots go through ``roots_of_grams`` (checks, eigen roots)."""
    roots: list[GramRoot | None] = [None] * (2 * len(pairs))
    fast = [i for i, root in enumerate(merge_roots) if root.cholesky]
    for i in fast:
        rank = pairs[i][1].shape[0]
        root = merge_roots[i]
        roots[2 * i] = GramRoot(root.root[:rank, :rank], root.pinv[:rank, :rank], root.block_sq_norms[:1], True)
    groups: dict[tuple, list[int]] = {}
    for i in fast:
        rank = pairs[i][1].shape[0]
        groups.setdefault((rank, grams[i][0].device), []).append(i)
    slow = [i for i in range(len(pairs)) if not merge_roots[i].cholesky]
    for (rank, _), indices in groups.items():
        block = torch.stack([grams[i][0][rank:, rank:] for i in indices])
        chol, info = torch.linalg.cholesky_ex(block)
        upper = chol.mT
        ok = info == 0
        eye = torch.eye(rank, dtype=upper.dtype, device=upper.device).expand_as(upper)
        inverse = torch.linalg.solve_triangular(torch.where(ok[:, None, None], upper, eye), eye, upper=True)
        for pos, i in enumerate(indices):
            if bool(ok[pos]):
                roots[2 * i + 1] = GramRoot(upper[pos], inverse[pos], merge_roots[i].block_sq_norms[1:], True)
            else:
                slow.append(i)
    rest = [(2 * i + side, part) for i in slow for side, part in enumerate(_halves(pairs[i]))]
    if rest:
        found = roots_of_grams([grams[j // 2][0][part, part] for j, part in rest], [[part.stop - part.start] for _, part in rest],
                               [lambda j=j: block_gram([pairs[j // 2][2 + 2 * (j % 2)]], torch.float64) for j, _ in rest])
        for (j, _), root in zip(rest, found):
            roots[j] = root
    return roots  # type: ignore[return-value]


def _halves(pair: tuple) -> tuple[slice, slice]:
    rank = pair[1].shape[0]
    return slice(0, rank), slice(rank, 2 * rank)


def _rank_r_merge(
    parent: Adapter, pairs: list, name: str, strength: float,
    middles: list[torch.Tensor] | None = None, coefs: list[torch.Tensor] | None = None,
) -> Child:
    """Top-r SVD of each slot's [B_a, B_b] D [A_a; A_b] as balanced factors, with ``truncation_error`` and the
    relative change to each parent (see ``blend_svd``), the slots in shards (``evolution.shards``).

    D per slot: ``middles[i]`` (a 2r vector or a 2r x 2r matrix), or from ``coefs`` (per slot a's then b's
    weights of the parents' ranked singular components, ``_component_cores``)."""
    if (middles is None) == (coefs is None):
        raise ValueError("_rank_r_merge needs middles or coefs")
    per_slot = [(pair, middles[i] if middles is not None else None,
                 (coefs[2 * i], coefs[2 * i + 1]) if coefs is not None else None) for i, pair in enumerate(pairs)]

    def merge(part: list) -> list[tuple[str, dict[str, torch.Tensor], SlotReport]]:
        shard_pairs = [pair for pair, _, _ in part]
        if coefs is not None:
            root_middles, middle_of, grams, roots = _component_cores(shard_pairs, [c for _, _, pc in part for c in pc])
        else:
            middle_of, grams, roots, root_middles = [m for _, m, _ in part].__getitem__, None, None, None
        factors, report = _merge_slots(shard_pairs, middle_of, grams, roots, root_middles)
        return [(pair[0].name, {pair[0].a_key: factors[pair[0].a_key], pair[0].b_key: factors[pair[0].b_key]}, report[pair[0].name])
                for pair in shard_pairs]

    with torch.no_grad():
        factors, report = _collect(flat(in_shards(merge, per_slot, pairs[0][1].device if pairs else None)))
    return Child(_finish(parent, factors), name, strength, report)


def _merge_slots(
    pairs: list, middle_of: Callable[[int], torch.Tensor], grams: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
    roots: list[GramRoot] | None = None, root_middles: list[torch.Tensor] | None = None,
) -> tuple[dict[str, torch.Tensor], dict[str, SlotReport]]:
    """``_rank_r_merge`` on one shard: (child factors, report). D = ``middle_of(i)`` for slot i; ``grams``: the
    block Grams of [B_a, B_b] and [A_a^T, A_b^T] if the caller has them; ``roots``: with them, the
    ``GramRoot`` of each [B_a, B_b]; ``root_middles``: with both, R D per slot (R that root), and D is then
    asked for only by slots that take the two-sided route."""
    factors: dict[str, torch.Tensor] = {}
    report: dict[str, SlotReport] = {}
    products = [([b_a, b_b], [a_a.mT, a_b.mT], None if root_middles is not None else middle_of(i))
                for i, (_, a_a, b_a, a_b, b_b) in enumerate(pairs)]
    svds = one_sided_svds(products, [pair[1].shape[0] for pair in pairs], grams, roots, root_middles)  # type: ignore[arg-type]
    two_sided, by_rank = [], {}
    for i, (pair, product, svd) in enumerate(zip(pairs, products, svds)):
        slot, rank = pair[0], pair[1].shape[0]
        sigma = svd.sigma[:rank]
        if not float(sigma[-1]) > NULL_SIGMA * float(sigma[0]):
            two_sided.append((pair, (product[0], product[1], middle_of(i))))
            continue
        _write_blend(factors, pair, svd.out_coef, svd.in_coef)
        by_rank.setdefault((rank, svd.sigma.device), []).append((slot.name, svd))
    for (rank, _), named in by_rank.items():
        reports = _blend_reports_one_sided([svd for _, svd in named], rank)
        report.update(zip([name_ for name_, _ in named], reports))
    if two_sided:
        _blend_two_sided(two_sided, factors, report)
    return factors, report


def _write_blend(factors: dict[str, torch.Tensor], pair: tuple, left: torch.Tensor, right: torch.Tensor) -> None:
    """Child factors from the parents': B = [B_a, B_b] ``left`` (2r x r), A = ``right`` [A_a; A_b] (``right``: r x 2r)."""
    slot, a_a, b_a, a_b, b_b = pair
    rank = a_a.shape[0]
    factors[slot.b_key] = tall_times([(b_a, left[:rank]), (b_b, left[rank:])])
    factors[slot.a_key] = (right[:, :rank] @ a_a).addmm_(right[:, rank:], a_b)


def _blend_reports_one_sided(svds: list[OneSidedSVD], rank: int) -> list[SlotReport]:
    """Truncation error and distances to the parents of slots of one rank, in r-sized coordinates, batched.

    The child is C = Q_x P R_x D Y^T with P = U_k U_k^T and parent p is Q_x R_x E_p Y^T (E_p keeps p's half), so
    ||C - dW_p||^2 = sum_kept lambda - 2 tr(U_k^T N_p U_k) + ||dW_p||^2 with N_p = R_x E_p G_y D R_x^T = R_x E_p h
    and ||dW_p||^2 = tr(R_p^T R_p G_y[p, p]) (R_p: p's columns of R_x).
    """
    lam = torch.stack([svd.sigma for svd in svds]).square()
    root = torch.stack([svd.x_root.root for svd in svds])
    h = torch.stack([svd.h for svd in svds])
    basis = torch.stack([svd.basis for svd in svds])
    gram_y = torch.stack([svd.gram_y for svd in svds])
    kept_sq = lam[:, :rank].sum(1)
    changes = []
    for part in (slice(0, rank), slice(rank, 2 * rank)):
        cross = ((root[:, :, part] @ (h[:, part] @ basis)) * basis).sum((1, 2))
        parent_sq = ((root[:, :, part].mT @ root[:, :, part]) * gram_y[:, part, part]).sum((1, 2)).clamp_min(0)
        changes.append(zip((kept_sq - 2 * cross + parent_sq).clamp_min(0).sqrt().tolist(), parent_sq.sqrt().tolist()))
    tails = zip(lam[:, rank:].sum(1).sqrt().tolist(), lam.sum(1).sqrt().tolist())
    reports = []
    for to_a, to_b, tail in zip(*changes, tails):
        change_a, change_b = _ratio(*to_a), _ratio(*to_b)
        reports.append({"relative_change": min(change_a, change_b), "relative_change_a": change_a,
                        "relative_change_b": change_b, "truncation_error": _ratio(*tail)})
    return reports


def _blend_two_sided(slots: list, factors: dict[str, torch.Tensor], report: dict[str, SlotReport]) -> None:
    """``blend_svd`` for slots whose kept components include null ones: full thin SVD of the blend.

    ``slots``: ((slot, A_a, B_a, A_b, B_b), blend product) pairs as ``blend_svd`` built them."""
    svds = factored_svds([product for _, product in slots])
    for (pair, _), svd in zip(slots, svds):
        slot, rank = pair[0], pair[1].shape[0]
        sigma = svd.sigma[:rank]
        b_scale, a_scale = _factor_scales(sigma, svd.y_root.block_sq_norms[0], rank)
        _write_blend(factors, pair, _f32(svd.left[:, :rank] * b_scale[None, :]), _f32(svd.right[:, :rank] * a_scale[None, :]).mT)
        kept = sigma.where(b_scale > 0, torch.zeros_like(sigma))
        child_core = (svd.core_u[:, :rank] * kept[None, :]) @ svd.core_v[:, :rank].mT
        ones = torch.ones(rank, dtype=torch.float64, device=child_core.device)
        changes = []
        for mask in (torch.cat([ones, 0 * ones]), torch.cat([0 * ones, ones])):
            parent_core = svd.core_of(mask, 1.0)
            changes.append(_ratio(float(torch.linalg.matrix_norm(child_core - parent_core)), float(torch.linalg.matrix_norm(parent_core))))
        report[slot.name] = {
            "relative_change": min(changes),
            "relative_change_a": changes[0],
            "relative_change_b": changes[1],
            "truncation_error": _ratio(float(torch.linalg.vector_norm(svd.sigma[rank:])), float(torch.linalg.vector_norm(svd.sigma))),
        }


def clone(parent: Adapter, generator: torch.Generator | None = None) -> Child:
    """An exact copy (the replacement policy's last resort when every mutation moved too far)."""
    slots = find_slots(parent)
    factors = {key: tensor.detach().clone() for key, tensor in parent.items()}
    return Child(_finish(parent, factors), "clone", 0.0, {slot.name: {"relative_change": 0.0} for slot in slots})


Mutation = Callable[..., Child]
Crossover = Callable[..., Child]

MUTATIONS: dict[str, Mutation] = {
    "perturb_singular_values": perturb_singular_values,
    "rotate_subspace": rotate_subspace,
    "gaussian_noise": gaussian_noise,
    "layer_noise": layer_noise,
    "mask_components": mask_components,
}
CROSSOVERS: dict[str, Crossover] = {
    "swap_slots": swap_slots,
    "blend_svd": blend_svd,
    "dare": dare,
    "splice_svd": splice_svd,
    "extrapolate": extrapolate,
}
OPERATORS: Mapping[str, Callable[..., Child]] = {**MUTATIONS, **CROSSOVERS}
