"""Replacement policy: victim, parents, operator draw, rejection of far-moved children, lineage, state."""

from __future__ import annotations

import json
from collections import Counter

import pytest
import torch
from evolution_adapters import delta, make_adapter, rel, slot_names

from evolution.league import League
from evolution.replacement import ReplacementPolicy

ONLY = lambda name, strength=0.1: {name: {"weight": 1.0, "strength": strength}}  # noqa: E731


def league_with(mus: dict[str, float], role: str = "teacher", sigma: float = 1.0) -> League:
    league = League()
    for member_id, mu in mus.items():
        league.add_member(member_id, role, mu=mu, sigma=sigma)
    league.add_member("s0", "student")
    league.add_member("s1", "student")
    return league


def test_due_every_period():
    policy = ReplacementPolicy(period=5)
    assert [s for s in range(16) if policy.due(s)] == [5, 10, 15]
    assert not ReplacementPolicy(period=5, enabled=False).due(10)


def test_never_due_at_the_last_step_and_a_longer_run_evolves_at_its_next_due_step():
    """A child made at the run's last step would never train: a run of 15 steps evolves at 5 and 10, not 15; resumed
    to step 22 it evolves at 20 (the next multiple of the period before its end), and to 25 at 20 only."""
    policy = ReplacementPolicy(period=5)
    assert [s for s in range(1, 16) if policy.due(s, last_step=15)] == [5, 10]
    assert [s for s in range(16, 23) if policy.due(s, last_step=22)] == [20]
    assert [s for s in range(16, 26) if policy.due(s, last_step=25)] == [20]
    assert not policy.due(4, last_step=4) and policy.due(5, last_step=6)


def test_victim_is_the_lowest_conservative_rating():
    league = League()
    league.add_member("sure", "teacher", mu=20.0, sigma=1.0)  # conservative 17
    league.add_member("unsure", "teacher", mu=24.0, sigma=3.0)  # conservative 15: lowest despite a higher mu
    league.add_member("top", "teacher", mu=30.0, sigma=1.0)
    selection = ReplacementPolicy(seed=0).select(league, "teacher", step=10)
    assert selection.victim == "unsure" and "unsure" not in selection.parents


def test_tournament_over_everyone_picks_the_strongest_parent():
    league = league_with({"a": 10.0, "b": 20.0, "c": 30.0, "d": 25.0})
    policy = ReplacementPolicy(tournament_size=4, operators=ONLY("blend_svd", 0.5), seed=1)
    for step in range(10, 60, 10):
        selection = policy.select(league, "teacher", step)
        assert selection.victim == "a" and selection.parents == ("c", "d")


def test_protected_child_is_not_culled_until_its_window_ends():
    league = league_with({"t0": 20.0, "t1": 25.0, "t2": 30.0})
    adapters = {m: make_adapter(i) for i, m in enumerate(["t0", "t1", "t2"])}
    policy = ReplacementPolicy(protection_steps=10, operators=ONLY("perturb_singular_values"), seed=2)
    record, child = policy.evolve(league, "teacher", 10, adapters, torch.Generator().manual_seed(0))
    assert record.victim == "t0" and record.id in league
    # the child starts with sigma_reset, so its conservative rating is the lowest
    assert min(league.members("teacher"), key=lambda m: league.rating(m).conservative) == record.id
    assert policy.select(league, "teacher", 15).victim != record.id
    assert policy.select(league, "teacher", 20).victim == record.id


def test_nothing_to_replace():
    policy = ReplacementPolicy(protection_steps=100)
    league = league_with({"only": 25.0})
    assert policy.select(league, "teacher", 10) is None  # a sub-population of one
    solo = League()
    solo.add_member("solo", "both")
    assert policy.select(solo, "teacher", 10) is None  # single-agent mode


def test_operator_drawn_by_weight():
    league = league_with({"a": 10.0, "b": 20.0, "c": 30.0})
    policy = ReplacementPolicy(
        operators={"perturb_singular_values": {"weight": 3.0, "strength": 0.1}, "swap_slots": {"weight": 1.0, "strength": 0.0},
                   "gaussian_noise": {"weight": 0.0, "strength": 0.1}},
        seed=3,
    )
    counts = Counter(policy.select(league, "teacher", 10).operator for _ in range(800))
    assert set(counts) == {"perturb_singular_values", "swap_slots"}
    assert counts["perturb_singular_values"] / 800 == pytest.approx(0.75, abs=0.06)


def test_crossover_needs_two_parents():
    league = league_with({"weak": 10.0, "strong": 30.0})  # one candidate parent besides the victim
    mixed = ReplacementPolicy(operators={**ONLY("blend_svd", 0.5), **ONLY("rotate_subspace")}, seed=4)
    assert {mixed.select(league, "teacher", 10).operator for _ in range(50)} == {"rotate_subspace"}
    crossover_only = ReplacementPolicy(operators=ONLY("swap_slots", 0.0), seed=4)
    selection = crossover_only.select(league, "teacher", 10)
    assert selection.operator == "clone" and selection.parents == ("strong",)


def test_child_that_moves_too_far_is_rebuilt_weaker():
    league = league_with({"a": 10.0, "b": 30.0})
    policy = ReplacementPolicy(operators=ONLY("perturb_singular_values", 1.0), max_relative_change=0.15, seed=5)
    selection = policy.select(league, "teacher", 10)
    offspring = policy.make_child(selection, [make_adapter(0)], torch.Generator().manual_seed(1))
    strengths = [a["strength"] for a in offspring.attempts]
    assert strengths[:2] == [1.0, 0.5] and not offspring.attempts[0]["accepted"]
    assert offspring.attempts[-1]["accepted"] and offspring.child.max_relative_change <= 0.15


def test_every_attempt_rejected_falls_back_to_a_clone():
    league = league_with({"a": 10.0, "b": 30.0})
    policy = ReplacementPolicy(operators=ONLY("gaussian_noise", 5.0), max_relative_change=1e-3, max_retries=2, seed=6)
    parent = make_adapter(0)
    offspring = policy.make_child(policy.select(league, "teacher", 10), [parent], torch.Generator().manual_seed(0))
    assert [a["operator"] for a in offspring.attempts] == ["gaussian_noise"] * 3 + ["clone"]
    assert all(torch.equal(offspring.child.state_dict[k], v) for k, v in parent.items())


def test_blend_with_a_large_truncation_error_moves_toward_the_first_parent():
    league = league_with({"a": 10.0, "b": 30.0, "c": 25.0})
    policy = ReplacementPolicy(operators=ONLY("blend_svd", 0.5), max_relative_change=0.5, seed=7)
    selection = policy.select(league, "teacher", 10)
    offspring = policy.make_child(selection, [make_adapter(1), make_adapter(2)], None)
    weights = [a["strength"] for a in offspring.attempts]
    assert weights[0] == 0.5 and weights[1] == 0.75  # independent parents: weight 0.5 is too far from both
    assert offspring.child.max_relative_change <= 0.5


def test_extrapolation_too_far_moves_eta_back_toward_the_stronger_parent():
    league = league_with({"a": 10.0, "b": 30.0, "c": 25.0})
    policy = ReplacementPolicy(operators=ONLY("extrapolate", 2.0), max_relative_change=0.3, max_truncation_error=1.0, seed=7)
    selection = policy.select(league, "teacher", 10)
    offspring = policy.make_child(selection, [make_adapter(1), make_adapter(2)], None)
    etas = [a["strength"] for a in offspring.attempts]
    assert etas[:2] == [2.0, 1.5] and not offspring.attempts[0]["accepted"]  # halfway back to eta = 1 (parent a)
    assert offspring.attempts[-1]["operator"] == "extrapolate" and offspring.child.max_relative_change <= 0.3


def test_commit_puts_the_child_in_the_victims_place():
    league = league_with({"a": 10.0, "b": 30.0, "c": 20.0})
    policy = ReplacementPolicy(operators=ONLY("swap_slots", 0.0), tournament_size=2, sigma_reset=4.0, seed=8)
    adapters = {m: make_adapter(i) for i, m in enumerate(["a", "b", "c"])}
    record, child = policy.evolve(league, "teacher", 20, adapters, torch.Generator().manual_seed(0))
    assert "a" not in league and record.victim == "a" and set(record.parents) == {"b", "c"}
    # the child enters at its parents' mean (25), then the three teachers move by -(25 - 10) / 3 = -5
    assert record.mean_shift == pytest.approx(-5.0)
    assert league.rating(record.id).mu == pytest.approx(25.0 - 5.0) == record.mu and league.rating(record.id).sigma == 4.0
    assert (league.rating("b").mu, league.rating("c").mu) == (pytest.approx(25.0), pytest.approx(15.0))
    assert league.rating("s0").mu == 25.0  # the other sub-population is untouched
    assert league.member(record.id).role == "teacher" and league.member(record.id).parent == record.parents[0]
    assert (record.operator, record.step, record.relative_change, record.attempts) == ("swap_slots", 20, 0.0, 1)
    assert policy.parents_of(record.id) == list(record.parents) and policy.parents_of("b") == []
    for slot in slot_names(child.state_dict):
        source = adapters[record.parents[0] if child.report[slot]["source"] == "a" else record.parents[1]]
        assert rel(delta(child.state_dict, slot), delta(source, slot)) == 0.0


def test_state_and_lineage_round_trip_through_json():
    league = league_with({"a": 10.0, "b": 30.0, "c": 20.0, "d": 26.0})
    policy = ReplacementPolicy(seed=9, protection_steps=0)
    adapters = {m: make_adapter(i) for i, m in enumerate(["a", "b", "c", "d"])}
    for step in (10, 20):
        record, child = policy.evolve(league, "teacher", step, adapters, torch.Generator().manual_seed(step))
        adapters[record.id] = child.state_dict
    state = json.loads(json.dumps(policy.state_dict()))
    restored = ReplacementPolicy.from_state_dict(state)
    assert restored.state_dict() == policy.state_dict()
    assert [r.to_dict() for r in restored.lineage] == [r.to_dict() for r in policy.lineage]
    league_copy = League.from_state_dict(json.loads(json.dumps(league.state_dict())))
    assert restored.select(league_copy, "teacher", 30) == policy.select(league, "teacher", 30)


def test_bad_configuration_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown evolution operator 'mutate_everything'"):
        ReplacementPolicy(operators={"mutate_everything": {"weight": 1.0, "strength": 0.1}})
    with pytest.raises(ValueError, match="every evolution operator weight is 0"):
        ReplacementPolicy(operators={"swap_slots": {"weight": 0.0, "strength": 0.0}})
    with pytest.raises(ValueError, match="rotate_subspace: strength"):
        ReplacementPolicy(operators=ONLY("rotate_subspace", 3.0))
    with pytest.raises(ValueError, match="period"):
        ReplacementPolicy(period=0)
    with pytest.raises(ValueError, match="role"):
        ReplacementPolicy().select(League(), "coach", 10)


def test_policy_accepts_the_config_section():
    from configs.schema import Config

    config = Config()
    policy = ReplacementPolicy(**config.evolution.model_dump(), seed=config.run.seed)
    assert policy.config["period"] == config.evolution.period
    assert set(policy.config["operators"]) == set(config.evolution.operators)


def sub_population_means(league: League) -> dict[str, float]:
    means = {}
    for role in ("teacher", "student"):
        mus = [league.rating(m).mu for m in league.members(role)]
        means[role] = sum(mus) / len(mus)
    return means


@pytest.mark.parametrize("entry", ["mean_preserving", "parents"])
def test_replacements_alone_leave_each_sub_populations_mean_mu_unchanged(entry):
    """No games: only replacements touch the ratings. The old rule ('parents') inflates the mean; the control
    shows this test can fail."""
    league = League()
    for i, mu in enumerate([31.0, 24.0, 19.0, 27.5]):
        league.add_member(f"t{i}", "teacher", mu=mu, sigma=2.0)
        league.add_member(f"s{i}", "student", mu=mu - 3.0, sigma=2.0)
    adapters = {m: make_adapter(i, layers=1) for i, m in enumerate(league.members())}
    # sigma_reset = the founders' sigma: the conservative rating then orders like mu, so every victim is its
    # sub-population's lowest mu and every child's parents are above it
    policy = ReplacementPolicy(operators=ONLY("swap_slots", 0.0), protection_steps=0, sigma_reset=2.0, rating_entry=entry, seed=3)
    before = sub_population_means(league)
    spreads = {role: sorted(league.rating(m).mu for m in league.members(role)) for role in ("teacher", "student")}
    for step in range(1, 25):
        for role in ("teacher", "student"):
            record, child = policy.evolve(league, role, step, adapters, torch.Generator().manual_seed(step))
            adapters[record.id] = child.state_dict
    after = sub_population_means(league)
    if entry == "mean_preserving":
        assert after == pytest.approx(before, abs=1e-9)
        assert sum(r.mean_shift < 0 for r in policy.lineage) > 24 and all(r.mean_shift <= 0 for r in policy.lineage)
    else:
        assert all(after[role] > before[role] + 3.0 for role in before), (before, after)
        assert all(r.mean_shift == 0.0 for r in policy.lineage)
    assert len(policy.lineage) == 48 and spreads  # every step replaced one member per role


def test_every_configured_operator_is_drawn_by_weight():
    from evolution.operators import OPERATORS

    league = league_with({"a": 10.0, "b": 30.0, "c": 20.0, "d": 25.0})
    table = {name: {"weight": 2.0 if name == "dare" else 1.0, "strength": 1.1 if name == "extrapolate" else 0.1} for name in OPERATORS}
    policy = ReplacementPolicy(operators=table, seed=11)
    drawn = Counter(policy.select(league, "teacher", step).operator for step in range(1, 2001))
    assert set(drawn) == set(OPERATORS)
    share = drawn["dare"] / sum(drawn.values())
    assert share == pytest.approx(2 / (len(OPERATORS) + 1), abs=0.03)


@pytest.mark.parametrize("name", ["layer_noise", "mask_components", "dare", "splice_svd", "extrapolate"])
def test_new_operators_make_accepted_children_through_the_policy(name):
    league = league_with({"a": 10.0, "b": 30.0, "c": 20.0})
    strength = {"layer_noise": 0.1, "mask_components": 0.25, "dare": 0.1, "splice_svd": 0.5, "extrapolate": 1.5}[name]
    policy = ReplacementPolicy(operators=ONLY(name, strength), max_relative_change=10.0, max_truncation_error=1.0, seed=2)
    adapters = {m: make_adapter(i) for i, m in enumerate(["a", "b", "c"])}
    record, child = policy.evolve(league, "teacher", 10, adapters, torch.Generator().manual_seed(0))
    assert (record.operator, child.operator, record.strength) == (name, name, strength)
    if name == "extrapolate":  # a is the stronger parent
        ratings = [league.rating(p).conservative for p in record.parents]
        assert ratings[0] >= ratings[1]


def test_a_toy_operator_registered_in_one_place_is_validated_drawn_and_applied(monkeypatch):
    """One spec (configs.operators.SPECS) plus its function (evolution.operators): the config accepts it and checks its
    strength range, the policy draws it and the child is made by it."""
    import dataclasses

    from configs.operators import SPECS, OperatorSpec
    from configs.schema import Config
    from evolution import operators as ops

    calls = []

    def toy_noise(parent, strength, generator=None):
        calls.append(strength)
        child = ops.gaussian_noise(parent, strength=strength / 10, generator=generator)
        return dataclasses.replace(child, operator="toy_noise", strength=strength)

    monkeypatch.setitem(SPECS, "toy_noise", OperatorSpec("toy_noise", "mutation", 0.0, 0.3, (0.0, 1.0)))
    monkeypatch.setitem(ops.OPERATORS, "toy_noise", toy_noise)
    config = Config.model_validate({"evolution": {"operators": {
        **{name: {"weight": 0.0} for name in SPECS if name != "toy_noise"}, "toy_noise": {"weight": 1.0}}}})
    assert config.evolution.operators["toy_noise"].strength == 0.3  # the spec's default strength
    with pytest.raises(ValueError, match=r"toy_noise: strength 2.0 is outside \[0.0, 1.0\]"):
        Config.model_validate({"evolution": {"operators": {"toy_noise": {"weight": 1.0, "strength": 2.0}}}})
    league = league_with({"t0": 20.0, "t1": 25.0, "t2": 30.0})
    adapters = {m: make_adapter(i) for i, m in enumerate(["t0", "t1", "t2"])}
    policy = ReplacementPolicy(operators=config.evolution.operators, seed=0)
    record, child = policy.evolve(league, "teacher", 10, adapters, torch.Generator().manual_seed(0))
    assert record.operator == "toy_noise" and calls == [0.3]
    parent = adapters[record.parents[0]]
    slot = slot_names(parent)[0]
    assert 0 < rel(delta(child.state_dict, slot), delta(parent, slot)) < 0.5
