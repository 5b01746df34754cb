"""The paper's further operators (layer_noise, mask_components, dare, splice_svd, extrapolate) against dense references."""

from __future__ import annotations

import pytest
import torch
from evolution_adapters import delta, dense_svd, gen, make_adapter, rel, slot_names

from evolution import operators
from configs.operators import SPECS

RANK = 4
NEW_CROSSOVERS = ("dare", "splice_svd", "extrapolate")


def components(m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return dense_svd(m, RANK)


def best_rank_r(m: torch.Tensor) -> torch.Tensor:
    u, s, vh = dense_svd(m, RANK)
    return (u * s) @ vh


def tail(m: torch.Tensor) -> float:
    s = torch.linalg.svdvals(m)
    return float(s[RANK:].norm() / s.norm())


def assert_layout(child: operators.Child, parent: dict[str, torch.Tensor]) -> None:
    assert list(child.state_dict) == list(parent)
    for key, tensor in parent.items():
        assert child.state_dict[key].shape == tensor.shape and child.state_dict[key].dtype == tensor.dtype


def assert_merge(child: operators.Child, parent, other, target) -> None:
    """Child = best rank-r approximation of target(slot); reported changes and truncation error = dense ones."""
    assert_layout(child, parent)
    for slot in slot_names(parent):
        dense = target(slot)
        got = delta(child.state_dict, slot)
        assert rel(got, best_rank_r(dense)) < 1e-4
        report = child.report[slot]
        assert report["truncation_error"] == pytest.approx(tail(dense), abs=1e-5)
        assert report["relative_change_a"] == pytest.approx(rel(got, delta(parent, slot)), rel=1e-4, abs=1e-6)
        assert report["relative_change_b"] == pytest.approx(rel(got, delta(other, slot)), rel=1e-4, abs=1e-6)
        assert report["relative_change"] == min(report["relative_change_a"], report["relative_change_b"])


# ---------------------------------------------------------------------------------------------- mutations


def test_mask_components_drops_the_drawn_components_without_rescaling(parent):
    p = 0.5
    child = operators.mask_components(parent, strength=p, generator=gen(4))
    draws = gen(4)
    assert_layout(child, parent)
    for slot in slot_names(parent):
        u, s, vh = components(delta(parent, slot))
        keep = (torch.rand(RANK, generator=draws, dtype=torch.float64) >= p).double()
        expected = (u * (s * keep)) @ vh
        assert rel(delta(child.state_dict, slot), expected) < 1e-5 if keep.any() else delta(child.state_dict, slot).abs().max() < 1e-6
        assert child.report[slot]["dropped"] == float(RANK - keep.sum())
        measured = rel(delta(child.state_dict, slot), delta(parent, slot))
        assert child.report[slot]["relative_change"] == pytest.approx(measured, rel=1e-4, abs=1e-6)
        assert measured == pytest.approx(float((s * (1 - keep)).norm() / s.norm()), rel=1e-4, abs=1e-6)


def test_mask_components_rescaled_is_dare_on_the_components(parent):
    p = 0.25
    plain = operators.mask_components(parent, strength=p, generator=gen(5))
    rescaled = operators.mask_components(parent, strength=p, generator=gen(5), rescale=True)
    for slot in slot_names(parent):
        assert rel(delta(rescaled.state_dict, slot), delta(plain.state_dict, slot) / (1 - p)) < 1e-5
    assert rescaled.mean_relative_change > plain.mean_relative_change
    with pytest.raises(ValueError, match="rescale"):
        operators.mask_components(parent, strength=1.0, rescale=True)


def test_mask_components_keeps_dropped_directions_trainable(parent):
    child = operators.mask_components(parent, strength=1.0, generator=gen(0))
    for slot in slot_names(parent):
        assert torch.count_nonzero(child.state_dict[f"{slot}.lora_B.weight"]) == 0
        assert torch.linalg.matrix_rank(child.state_dict[f"{slot}.lora_A.weight"]) == RANK
        assert child.report[slot]["relative_change"] == pytest.approx(1.0)


@pytest.mark.parametrize("fraction, layers", [(0.34, 1), (0.67, 2), (1.0, 3)])
def test_layer_noise_noises_whole_layers_and_copies_the_rest(parent, fraction, layers):
    child = operators.layer_noise(parent, strength=0.1, generator=gen(9), fraction=fraction)
    assert_layout(child, parent)
    noised_layers = set()
    for slot in slot_names(parent):
        layer = int(slot.split(".layers.")[1].split(".")[0])
        measured = rel(delta(child.state_dict, slot), delta(parent, slot))
        assert child.report[slot]["relative_change"] == pytest.approx(measured, rel=1e-4, abs=1e-6)
        if child.report[slot]["noised"]:
            noised_layers.add(layer)
            assert measured > 0.01
        else:
            for side in ("A", "B"):
                key = f"{slot}.lora_{side}.weight"
                assert torch.equal(child.state_dict[key], parent[key])
    assert len(noised_layers) == layers
    # every module of a chosen layer is noised
    assert all(child.report[s]["noised"] for s in slot_names(parent) if int(s.split(".layers.")[1].split(".")[0]) in noised_layers)


def test_layer_noise_draws_different_layers_for_different_seeds(parent):
    chosen = {tuple(r["noised"] for r in operators.layer_noise(parent, 0.1, gen(seed), fraction=0.34).report.values()) for seed in range(12)}
    assert len(chosen) == 3


# --------------------------------------------------------------------------------------------- crossovers


@pytest.mark.parametrize("eta", [1.25, 1.5, 2.0])
def test_extrapolate_is_the_best_rank_r_approximation_past_parent_a(parent, other, eta):
    child = operators.extrapolate(parent, other, strength=eta)
    # the paper's X4: worse + eta (better - worse), parent a the better one
    assert_merge(child, parent, other, lambda s: delta(other, s) + eta * (delta(parent, s) - delta(other, s)))
    assert child.max_truncation_error > 0.01  # the difference has rank 2r: its tail is real and reported


@pytest.mark.parametrize("strength", [0.25, 0.5, 0.75])
def test_splice_takes_a_top_components_and_b_rest(parent, other, strength):
    cut = RANK - round(strength * RANK)

    def spliced(slot: str) -> torch.Tensor:
        ua, sa, va = components(delta(parent, slot))
        ub, sb, vb = components(delta(other, slot))
        return (ua[:, :cut] * sa[:cut]) @ va[:cut] + (ub[:, cut:] * sb[cut:]) @ vb[cut:]

    child = operators.splice_svd(parent, other, strength=strength)
    assert_merge(child, parent, other, spliced)
    assert child.max_truncation_error < 1e-5  # rank <= r: re-orthogonalised, nothing truncated
    for slot in slot_names(parent):  # balanced factors: B^T B = A A^T = Sigma
        a, b = child.state_dict[f"{slot}.lora_A.weight"].double(), child.state_dict[f"{slot}.lora_B.weight"].double()
        assert torch.allclose(b.mT @ b, a @ a.mT, atol=1e-4 * float(a.norm() ** 2))


@pytest.mark.parametrize("p, weight", [(0.3, 0.5), (0.6, 0.8)])
def test_dare_drops_rescales_and_merges_the_drawn_components(parent, other, p, weight):
    draws = gen(21)
    targets = {}
    for slot in slot_names(parent):
        merged = torch.zeros_like(delta(parent, slot))
        for adapter, w in ((parent, weight), (other, 1 - weight)):
            u, s, vh = components(delta(adapter, slot))
            keep = (torch.rand(RANK, generator=draws, dtype=torch.float64) >= p).double()
            merged += w / (1 - p) * (u * (s * keep)) @ vh
        targets[slot] = merged
    child = operators.dare(parent, other, strength=p, generator=gen(21), weight=weight)
    assert_merge(child, parent, other, lambda s: targets[s])


def test_dare_without_drops_is_the_blend(parent, other):
    child = operators.dare(parent, other, strength=0.0, generator=gen(0), weight=0.3)
    blend = operators.blend_svd(parent, other, weight=0.3)
    for slot in slot_names(parent):
        assert rel(delta(child.state_dict, slot), delta(blend.state_dict, slot)) < 1e-5


@pytest.mark.parametrize("name", NEW_CROSSOVERS)
def test_neutral_strength_gives_parent_a(name, parent, other):
    kwargs = {"weight": 1.0} if name == "dare" else {}
    neutral = SPECS[name].neutral  # extrapolate: eta = 1 is parent a
    child = operators.CROSSOVERS[name](parent, other, strength=neutral, generator=gen(0), **kwargs)
    for slot in slot_names(parent):
        assert rel(delta(child.state_dict, slot), delta(parent, slot)) < 1e-5
        assert child.report[slot]["relative_change"] < 1e-5


@pytest.mark.parametrize("name, strengths", [("splice_svd", (0.25, 0.5, 0.75)), ("extrapolate", (1.2, 1.6, 2.2)), ("dare", (0.1, 0.4, 0.7))])
def test_crossover_change_from_parent_a_grows_with_strength(name, strengths, parent, other):
    kwargs = {"weight": 1.0} if name == "dare" else {}
    changes = [
        sum(c.report[s]["relative_change_a"] for s in slot_names(parent))
        for c in (operators.CROSSOVERS[name](parent, other, strength=x, generator=gen(3), **kwargs) for x in strengths)
    ]
    assert 0 < changes[0] < changes[1] < changes[2]


def test_dare_same_seed_same_child_other_seed_other_child(parent, other):
    first = operators.dare(parent, other, 0.5, gen(1)).state_dict
    again = operators.dare(parent, other, 0.5, gen(1)).state_dict
    different = operators.dare(parent, other, 0.5, gen(2)).state_dict
    assert all(torch.equal(first[k], again[k]) for k in parent)
    assert not all(torch.equal(first[k], different[k]) for k in parent)


def test_crossovers_of_rank_deficient_parents_stay_trainable():
    fresh = [{k: (torch.zeros_like(v) if "lora_B" in k else v) for k, v in make_adapter(seed).items()} for seed in (7, 8)]
    for name in NEW_CROSSOVERS:
        child = operators.CROSSOVERS[name](fresh[0], fresh[1], generator=gen(0))
        for slot in slot_names(fresh[0]):
            assert torch.count_nonzero(child.state_dict[f"{slot}.lora_B.weight"]) == 0
            assert torch.linalg.matrix_rank(child.state_dict[f"{slot}.lora_A.weight"]) == RANK


def test_new_strength_ranges_are_checked(parent, other):
    for call in (
        lambda: operators.extrapolate(parent, other, strength=2.6),
        lambda: operators.extrapolate(parent, other, strength=0.9),
        lambda: operators.splice_svd(parent, other, strength=1.5),
        lambda: operators.dare(parent, other, strength=1.0),
        lambda: operators.mask_components(parent, strength=-0.1),
        lambda: operators.layer_noise(parent, strength=-1.0),
    ):
        with pytest.raises(ValueError, match="outside"):
            call()
    with pytest.raises(ValueError, match="fraction"):
        operators.layer_noise(parent, 0.1, fraction=0.0)


def test_the_spec_table_and_the_functions_name_the_same_operators():
    from configs.operators import SPECS, names

    assert set(SPECS) == set(operators.OPERATORS)
    assert set(names("mutation")) == set(operators.MUTATIONS) and set(names("crossover")) == set(operators.CROSSOVERS)
    for name, spec in SPECS.items():
        low, high = spec.strength_range
        assert low <= spec.strength <= high and low <= spec.neutral <= high, name
