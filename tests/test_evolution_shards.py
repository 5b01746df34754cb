"""Operators split over threads (evolution.shards) make the same children as on one thread."""

from __future__ import annotations

import threading

import pytest
import torch
from evolution_adapters import gen, make_adapter

from evolution import operators
from evolution.shards import MIN_SLOTS_PER_SHARD, in_shards, thread_pool

LAYERS = 8  # 24 slots: two shards of 12 with two threads


@pytest.fixture
def threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def make_child(name: str, a: dict, b: dict, threads: int) -> operators.Child:
    torch.set_num_threads(threads)
    if name in operators.CROSSOVERS:
        return operators.CROSSOVERS[name](a, b, generator=gen(5))
    return operators.MUTATIONS[name](a, generator=gen(5))


@pytest.mark.parametrize("name", sorted(operators.OPERATORS))
def test_two_shards_make_the_child_one_thread_makes(name, threads):
    a, b = make_adapter(1, layers=LAYERS), make_adapter(2, layers=LAYERS)
    assert len(a) // 2 >= 2 * MIN_SLOTS_PER_SHARD
    one = make_child(name, a, b, 1)
    two = make_child(name, a, b, 2)
    assert list(two.state_dict) == list(one.state_dict)
    for key, tensor in one.state_dict.items():
        assert torch.allclose(two.state_dict[key], tensor, rtol=1e-5, atol=1e-6), key
    assert list(two.report) == list(one.report)
    for slot, report in one.report.items():
        assert two.report[slot].keys() == report.keys()
        for field, value in report.items():
            expected = value if isinstance(value, str) else pytest.approx(value, rel=1e-6, abs=1e-9)
            assert two.report[slot][field] == expected, (slot, field)


def test_shards_run_on_pool_threads_in_order_and_restore_the_thread_count(threads):
    torch.set_num_threads(2)
    items = list(range(3 * MIN_SLOTS_PER_SHARD))
    parts = in_shards(lambda part: (threading.current_thread().name, torch.get_num_threads(), part), items)
    assert [item for _, _, part in parts for item in part] == items
    assert len(parts) == 2 and all(name.startswith("evolution-pool") and inner == 1 for name, inner, _ in parts)
    assert torch.get_num_threads() == 2
    with pytest.raises(ZeroDivisionError):
        in_shards(lambda part: 1 / 0, items)
    assert torch.get_num_threads() == 2
    assert len(in_shards(lambda part: part, items[: 2 * MIN_SLOTS_PER_SHARD - 1])) == 1  # too few to split


def test_an_operator_called_on_a_pool_thread_does_not_wait_on_the_pool(threads):
    torch.set_num_threads(2)
    a, b = make_adapter(1, layers=LAYERS), make_adapter(2, layers=LAYERS)
    future = thread_pool(2).submit(lambda: operators.dare(a, b, 0.1, gen(0)).max_relative_change)
    assert future.result(timeout=60) > 0


def test_pools_are_reused_across_children(threads):
    torch.set_num_threads(2)
    a = make_adapter(1, layers=LAYERS)
    operators.gaussian_noise(a, 0.1, gen(0))
    count = threading.active_count()
    for seed in range(3):
        operators.gaussian_noise(a, 0.1, gen(seed))
        operators.perturb_singular_values(a, 0.1, gen(seed))
    assert threading.active_count() == count
