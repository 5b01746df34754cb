"""LoRA weight-space operators: properties checked against dense Delta W and dense SVDs."""

from __future__ import annotations

import math

import pytest
import torch
from evolution_adapters import delta, dense_svd, gen, make_adapter, principal_cosines, rel, slot_names

from evolution import operators
from evolution.operators import CROSSOVERS, MUTATIONS

STRENGTHS = {"perturb_singular_values": 0.2, "rotate_subspace": 0.2, "gaussian_noise": 0.1, "layer_noise": 0.1, "mask_components": 0.5}
# strengths where the change must grow; mask_components drops whole components, so it needs coarser steps at r = 4
# operators that may leave some slots exactly as they were (unchosen layers, no component dropped)
PARTIAL = ("layer_noise", "mask_components")
GROWTH = {name: (0.02, 0.1, 0.3) for name in STRENGTHS} | {"mask_components": (0.2, 0.5, 0.8)}


@pytest.mark.parametrize("name", list(MUTATIONS))
def test_mutation_keeps_layout_and_reports_the_dense_relative_change(name, parent):
    child = MUTATIONS[name](parent, strength=STRENGTHS[name], generator=gen(7))
    assert list(child.state_dict) == list(parent)
    for key, tensor in parent.items():
        assert child.state_dict[key].shape == tensor.shape and child.state_dict[key].dtype == tensor.dtype
    for slot in slot_names(parent):
        measured = rel(delta(child.state_dict, slot), delta(parent, slot))
        assert measured > 0.01 or name in PARTIAL
        assert child.report[slot]["relative_change"] == pytest.approx(measured, rel=1e-4, abs=1e-6)
    assert child.max_relative_change > 0.01


@pytest.mark.parametrize("name", list(MUTATIONS))
def test_strength_zero_keeps_delta_w(name, parent):
    child = MUTATIONS[name](parent, strength=0.0, generator=gen(1))
    for slot in slot_names(parent):
        assert rel(delta(child.state_dict, slot), delta(parent, slot)) < 1e-5
        assert child.report[slot]["relative_change"] < 1e-6


@pytest.mark.parametrize("name", list(MUTATIONS))
def test_change_grows_with_strength(name, parent):
    changes = [MUTATIONS[name](parent, strength=s, generator=gen(3)).mean_relative_change for s in GROWTH[name]]
    assert 0 < changes[0] < changes[1] < changes[2]


@pytest.mark.parametrize("name", list(MUTATIONS))
def test_same_seed_same_child_other_seed_other_child(name, parent):
    first = MUTATIONS[name](parent, strength=0.1, generator=gen(11)).state_dict
    again = MUTATIONS[name](parent, strength=0.1, generator=gen(11)).state_dict
    other = MUTATIONS[name](parent, strength=0.1, generator=gen(12)).state_dict
    assert all(torch.equal(first[k], again[k]) for k in parent)
    assert not all(torch.equal(first[k], other[k]) for k in parent)


def test_perturb_keeps_singular_subspaces_and_scales_log_normally(parent):
    strength = 0.3
    child = MUTATIONS["perturb_singular_values"](parent, strength=strength, generator=gen(5)).state_dict
    log_ratios = []
    for slot in slot_names(parent):
        u, s, vh = dense_svd(delta(parent, slot), 4)
        new = delta(child, slot)
        # the child is diagonal in the parent's singular basis: same subspaces, new singular values
        core = u.mT @ new @ vh.mT
        assert torch.allclose(core, torch.diag(core.diagonal()), atol=1e-4 * float(s[0]))
        assert rel(u @ core @ vh, new) < 1e-5
        assert torch.all(core.diagonal() > 0)
        log_ratios.append(torch.log(core.diagonal() / s))
    z = torch.cat(log_ratios) / strength
    assert abs(float(z.mean())) < 0.6 and 0.5 < float(z.std()) < 1.6  # z ~ N(0, 1), 36 draws


def test_perturb_rebuilds_balanced_factors(parent):
    child = MUTATIONS["perturb_singular_values"](parent, strength=0.1, generator=gen(2)).state_dict
    for slot in slot_names(parent):
        a, b = child[f"{slot}.lora_A.weight"], child[f"{slot}.lora_B.weight"]
        gram_b, gram_a = b.mT @ b, a @ a.mT
        assert torch.allclose(gram_b, gram_a, rtol=1e-4, atol=1e-3)  # both diag(sigma)
        assert torch.allclose(gram_b, torch.diag(gram_b.diagonal()), atol=1e-3 * float(gram_b.max()))


@pytest.mark.parametrize("side", ["input", "output", "both"])
def test_rotation_moves_the_span_by_the_angle_and_keeps_singular_values(side):
    parent = make_adapter(3, rank=4, shapes={"mlp.up_proj": (30, 20)})
    theta = 0.3
    child = MUTATIONS["rotate_subspace"](parent, strength=theta, generator=gen(4), side=side).state_dict
    for slot in slot_names(parent):
        u, s, vh = dense_svd(delta(parent, slot), 4)
        cu, cs, cvh = dense_svd(delta(child, slot), 4)
        assert torch.allclose(cs, s, rtol=1e-5)
        input_cos = principal_cosines(vh.mT, cvh.mT)
        output_cos = principal_cosines(u, cu)
        expected_in = math.cos(theta) if side in ("input", "both") else 1.0
        expected_out = math.cos(theta) if side in ("output", "both") else 1.0
        assert torch.allclose(input_cos, torch.full_like(input_cos, expected_in), atol=1e-5)
        assert torch.allclose(output_cos, torch.full_like(output_cos, expected_out), atol=1e-5)


def test_rotation_inside_the_core_would_not_move_anything(parent):
    # the contrast the operator is built around: (B R)(R^T A) = B A for any orthogonal R
    slot = slot_names(parent)[0]
    a, b = parent[f"{slot}.lora_A.weight"].double(), parent[f"{slot}.lora_B.weight"].double()
    r, _ = torch.linalg.qr(torch.randn(4, 4, generator=gen(0), dtype=torch.float64))
    assert torch.allclose((b @ r) @ (r.mT @ a), b @ a)
    child = MUTATIONS["rotate_subspace"](parent, strength=0.2, generator=gen(0), side="input").state_dict
    _, _, vh = dense_svd(delta(parent, slot), 4)
    _, _, cvh = dense_svd(delta(child, slot), 4)
    assert float(principal_cosines(vh.mT, cvh.mT).min()) < math.cos(0.2) + 1e-5


def test_rotation_moves_at_most_the_free_dimensions():
    # d_in - r = 2 < r = 4: only two input components can leave the span
    parent = make_adapter(4, rank=4, shapes={"narrow": (20, 6)})
    child = MUTATIONS["rotate_subspace"](parent, strength=0.4, generator=gen(1), side="input")
    for slot in slot_names(parent):
        assert child.report[slot]["rotated"] == 2
        measured = rel(delta(child.state_dict, slot), delta(parent, slot))
        assert child.report[slot]["relative_change"] == pytest.approx(measured, rel=1e-4)


def test_gaussian_noise_is_scaled_to_each_tensor(parent):
    child = MUTATIONS["gaussian_noise"](parent, strength=0.05, generator=gen(9)).state_dict
    for key, tensor in parent.items():
        rms = float(tensor.norm()) / math.sqrt(tensor.numel())
        noise = child[key] - tensor
        assert float(noise.std()) == pytest.approx(0.05 * rms, rel=0.35)


def test_fresh_adapter_child_stays_trainable():
    # PEFT init: B = 0, A random. Delta W = 0 must stay 0 and A must keep full rank (else B never learns)
    parent = {k: (torch.zeros_like(v) if "lora_B" in k else v) for k, v in make_adapter(5).items()}
    for name in ("perturb_singular_values", "rotate_subspace"):
        child = MUTATIONS[name](parent, strength=0.2, generator=gen(0))
        for slot in slot_names(parent):
            a = child.state_dict[f"{slot}.lora_A.weight"]
            assert torch.count_nonzero(child.state_dict[f"{slot}.lora_B.weight"]) == 0
            assert torch.linalg.matrix_rank(a) == a.shape[0]
            parent_rms_row = float(parent[f"{slot}.lora_A.weight"].norm()) / 2  # sqrt(rank = 4)
            assert torch.allclose(a.norm(dim=1), torch.full((4,), parent_rms_row), rtol=1e-4)
            assert child.report[slot]["relative_change"] == 0.0


def test_bfloat16_parent_gives_bfloat16_child():
    parent = make_adapter(6, dtype=torch.bfloat16)
    child = MUTATIONS["perturb_singular_values"](parent, strength=0.0, generator=gen(0)).state_dict
    for slot in slot_names(parent):
        assert child[f"{slot}.lora_A.weight"].dtype == torch.bfloat16
        assert rel(delta(child, slot), delta(parent, slot)) < 2e-2  # bf16 rounding of the re-balanced factors


def test_swap_takes_every_slot_whole_from_one_parent(parent, other):
    child = CROSSOVERS["swap_slots"](parent, other, generator=gen(2))
    sources = set()
    for slot in slot_names(parent):
        source = {"a": parent, "b": other}[child.report[slot]["source"]]
        sources.add(child.report[slot]["source"])
        for factor in ("lora_A", "lora_B"):
            key = f"{slot}.{factor}.weight"
            assert torch.equal(child.state_dict[key], source[key])
            assert child.state_dict[key].data_ptr() != source[key].data_ptr()
    assert sources == {"a", "b"}


def test_swap_by_layers_takes_one_contiguous_block(parent, other):
    parent5, other5 = make_adapter(0, layers=5), make_adapter(1, layers=5)
    for seed in range(6):
        child = CROSSOVERS["swap_slots"](parent5, other5, generator=gen(seed), mode="layers")
        per_layer = {}
        for slot, entry in child.report.items():
            layer = int(slot.split("layers.")[1].split(".")[0])
            per_layer.setdefault(layer, set()).add(entry["source"])
        assert all(len(s) == 1 for s in per_layer.values())  # all modules of a layer together
        from_b = [layer for layer, s in sorted(per_layer.items()) if s == {"b"}]
        assert from_b and from_b == list(range(from_b[0], from_b[-1] + 1)) and len(from_b) < 5


@pytest.mark.parametrize("weight", [0.5, 0.8])
def test_blend_is_the_best_rank_r_approximation(weight, parent, other):
    child = CROSSOVERS["blend_svd"](parent, other, weight=weight)
    for slot in slot_names(parent):
        target = weight * delta(parent, slot) + (1 - weight) * delta(other, slot)
        u, s, vh = dense_svd(target, 4)
        best = (u * s) @ vh
        assert rel(delta(child.state_dict, slot), best) < 1e-5
        full = torch.linalg.svdvals(target)
        assert child.report[slot]["truncation_error"] == pytest.approx(float(full[4:].norm() / full.norm()), rel=1e-4)
        to_a = rel(delta(child.state_dict, slot), delta(parent, slot))
        to_b = rel(delta(child.state_dict, slot), delta(other, slot))
        assert child.report[slot]["relative_change_a"] == pytest.approx(to_a, rel=1e-4)
        assert child.report[slot]["relative_change"] == pytest.approx(min(to_a, to_b), rel=1e-4)


def test_blend_with_weight_one_is_the_first_parent(parent, other):
    child = CROSSOVERS["blend_svd"](parent, other, weight=1.0)
    for slot in slot_names(parent):
        assert rel(delta(child.state_dict, slot), delta(parent, slot)) < 1e-5
        assert child.report[slot]["truncation_error"] < 1e-6


def test_blend_of_a_parent_with_itself_is_the_parent(parent):
    # [B, B] has a singular Gram: its root takes the eigen route with the null half cut
    child = CROSSOVERS["blend_svd"](parent, parent, weight=0.3)
    for slot in slot_names(parent):
        assert rel(delta(child.state_dict, slot), delta(parent, slot)) < 1e-5
        assert child.report[slot]["truncation_error"] < 1e-6
        assert child.report[slot]["relative_change"] < 1e-5


def test_blend_of_low_rank_parents_takes_the_two_sided_route_where_needed(parent, other):
    # in q_proj both parents have rank 1 (B keeps one column), so the rank-4 child has null components: their A
    # rows must be unit directions at the parent's RMS row norm (trainable), while the other slots stay exact
    low = "base_model.model.model.layers.0.self_attn.q_proj"
    first, second = dict(parent), dict(other)
    for adapter in (first, second):
        b = adapter[f"{low}.lora_B.weight"].clone()
        b[:, 1:] = 0
        adapter[f"{low}.lora_B.weight"] = b
    child = CROSSOVERS["blend_svd"](first, second, weight=0.6)
    for slot in slot_names(parent):
        target = 0.6 * delta(first, slot) + 0.4 * delta(second, slot)
        u, s, vh = dense_svd(target, 4)
        assert rel(delta(child.state_dict, slot), (u * s) @ vh) < 1e-5
        to_a = rel(delta(child.state_dict, slot), delta(first, slot))
        assert child.report[slot]["relative_change_a"] == pytest.approx(to_a, rel=1e-4)
    a = child.state_dict[f"{low}.lora_A.weight"]
    b = child.state_dict[f"{low}.lora_B.weight"]
    assert torch.linalg.matrix_rank(a) == 4
    assert int((b.norm(dim=0) > 0).sum()) == 2  # two live components, two null ones
    assert child.report[low]["truncation_error"] < 1e-6


def test_blend_of_fresh_adapters_stays_trainable():
    fresh = [{k: (torch.zeros_like(v) if "lora_B" in k else v) for k, v in make_adapter(seed).items()} for seed in (7, 8)]
    child = CROSSOVERS["blend_svd"](fresh[0], fresh[1], weight=0.5)
    for slot in slot_names(fresh[0]):
        assert torch.count_nonzero(child.state_dict[f"{slot}.lora_B.weight"]) == 0
        assert torch.linalg.matrix_rank(child.state_dict[f"{slot}.lora_A.weight"]) == 4
        assert child.report[slot]["relative_change"] == 0.0


def test_bad_inputs_are_clear_errors(parent, other):
    with pytest.raises(ValueError, match="outside"):
        MUTATIONS["perturb_singular_values"](parent, strength=-0.1)
    with pytest.raises(ValueError, match="outside"):
        MUTATIONS["rotate_subspace"](parent, strength=2.0)
    with pytest.raises(ValueError, match="outside"):
        CROSSOVERS["blend_svd"](parent, other, weight=1.5)
    with pytest.raises(ValueError, match="no lora_B"):
        MUTATIONS["gaussian_noise"]({k: v for k, v in parent.items() if "lora_B" not in k or "layers.0.mlp" not in k})
    with pytest.raises(ValueError, match="not a LoRA factor"):
        MUTATIONS["gaussian_noise"]({**parent, "model.embed_tokens.weight": torch.zeros(3, 3)})
    with pytest.raises(ValueError, match="parents hold different slots"):
        CROSSOVERS["swap_slots"](parent, make_adapter(1, layers=2))
    with pytest.raises(ValueError, match="disagree"):
        CROSSOVERS["blend_svd"](parent, make_adapter(1, rank=5))
    broken = dict(parent)
    key = next(iter(broken))
    broken[key] = torch.full_like(broken[key], float("nan"))
    with pytest.raises(ValueError, match="NaN or Inf"):
        MUTATIONS["perturb_singular_values"](broken, strength=0.1)


def test_clone_is_an_exact_independent_copy(parent):
    child = operators.clone(parent)
    assert all(torch.equal(child.state_dict[k], v) and child.state_dict[k].data_ptr() != v.data_ptr() for k, v in parent.items())
    assert child.max_relative_change == 0.0


@pytest.mark.gpu
def test_cuda_children_match_cpu_children(parent, other):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    on_gpu = {k: v.cuda() for k, v in parent.items()}
    other_gpu = {k: v.cuda() for k, v in other.items()}
    for name in MUTATIONS:
        cpu = MUTATIONS[name](parent, strength=0.1, generator=gen(3)).state_dict
        gpu = MUTATIONS[name](on_gpu, strength=0.1, generator=gen(3)).state_dict
        for slot in slot_names(parent):
            assert rel(delta({k: v.cpu() for k, v in gpu.items()}, slot), delta(cpu, slot)) < 1e-4
    for name in CROSSOVERS:
        cpu = CROSSOVERS[name](parent, other, generator=gen(3)).state_dict
        gpu = CROSSOVERS[name](on_gpu, other_gpu, generator=gen(3)).state_dict
        assert all(v.is_cuda for v in gpu.values())
        for slot in slot_names(parent):
            assert rel(delta({k: v.cpu() for k, v in gpu.items()}, slot), delta(cpu, slot)) < 1e-4


@pytest.mark.parametrize("name", list(MUTATIONS) + list(CROSSOVERS))
def test_children_save_to_safetensors_and_load_back_exactly(name, parent, other, tmp_path):
    from safetensors.torch import load_file, save_file

    operator = operators.OPERATORS[name]
    child = operator(parent, other, generator=gen(0)) if name in CROSSOVERS else operator(parent, strength=0.1, generator=gen(0))
    save_file(child.state_dict, tmp_path / "adapter_model.safetensors")
    loaded = load_file(tmp_path / "adapter_model.safetensors")
    assert set(loaded) == set(child.state_dict)
    assert all(torch.equal(loaded[k], v) for k, v in child.state_dict.items())


def test_children_do_not_depend_on_the_sign_convention_of_the_svd(parent, other, monkeypatch):
    """CPU (LAPACK) and CUDA (cuSOLVER) choose different signs for singular pairs; an operator that draws in the SVD
    basis (rotate_subspace) gave a child 20% apart on an H100. With the signs of some pairs flipped, as another
    solver may return them, every child's Delta W is the same."""
    reference = {name: MUTATIONS[name](parent, strength=0.1, generator=gen(3)).state_dict for name in MUTATIONS}
    reference |= {name: CROSSOVERS[name](parent, other, generator=gen(3)).state_dict for name in CROSSOVERS}
    svd, eigh = torch.linalg.svd, torch.linalg.eigh

    def flipped_svd(matrix, *args, **kwargs):
        u, s, vh = svd(matrix, *args, **kwargs)
        sign = torch.ones(s.shape[-1], dtype=u.dtype, device=u.device)
        sign[::2] = -1  # every other singular pair
        return u * sign, s, vh * sign[:, None]

    def flipped_eigh(matrix, *args, **kwargs):
        lam, vec = eigh(matrix, *args, **kwargs)
        sign = torch.ones(lam.shape[-1], dtype=vec.dtype, device=vec.device)
        sign[1::2] = -1
        return lam, vec * sign

    monkeypatch.setattr(torch.linalg, "svd", flipped_svd)
    monkeypatch.setattr(torch.linalg, "eigh", flipped_eigh)
    for name, before in reference.items():
        op = operators.OPERATORS[name]
        after = (op(parent, other, generator=gen(3)) if name in CROSSOVERS else op(parent, strength=0.1, generator=gen(3))).state_dict
        for slot in slot_names(parent):
            assert rel(delta(after, slot), delta(before, slot)) < 1e-5, (name, slot)
