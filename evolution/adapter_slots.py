"""The (layer, module) slots of a PEFT LoRA state dict, and checks that adapters share one layout.

A PEFT adapter saves one pair of factors per adapted linear layer::

    <prefix>.lora_A.weight   (r, d_in)      A
    <prefix>.lora_B.weight   (d_out, r)     B          Delta W = s * B @ A

(an in-memory ``model.state_dict()`` may carry the adapter name: ``<prefix>.lora_A.<name>.weight``).
A *slot* is one such pair. Operators act per slot and never mix the A of one slot or parent with the B
of another.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

import torch

_FACTOR_KEY = re.compile(r"^(?P<prefix>.+)\.lora_(?P<factor>[AB])(?P<name>\.[^.]+)?\.weight$")
_LAYER_INDEX = re.compile(r"\.(\d+)\.")

Adapter = Mapping[str, torch.Tensor]


@dataclass(frozen=True)
class Slot:
    """One adapted linear layer: the keys of its A (r, d_in) and B (d_out, r) factors."""

    name: str
    a_key: str
    b_key: str

    @property
    def layer(self) -> int | None:
        """The first integer path component (``...layers.12.mlp...`` -> 12), or None."""
        match = _LAYER_INDEX.search(self.name + ".")
        return int(match.group(1)) if match else None


def find_slots(adapter: Adapter) -> list[Slot]:
    """Pair every ``lora_A`` with its ``lora_B`` and check the shapes; raise ValueError naming any bad key.

    Slots are returned in the order their A keys appear, so the same adapter always yields the same order
    (operators draw their random numbers slot by slot in this order).
    """
    if not isinstance(adapter, Mapping) or not adapter:
        raise ValueError("an adapter must be a non-empty dict of PEFT LoRA tensors (keys '...lora_A.weight', '...lora_B.weight')")
    factors: dict[str, dict[str, str]] = {}
    for key in adapter:
        match = _FACTOR_KEY.match(key) if isinstance(key, str) else None
        if match is None:
            raise ValueError(f"adapter key {key!r} is not a LoRA factor ('<module>.lora_A.weight' or '<module>.lora_B.weight')")
        name = match.group("prefix") + (match.group("name") or "")
        factors.setdefault(name, {})[match.group("factor")] = key
    slots = []
    for name, pair in factors.items():
        if set(pair) != {"A", "B"}:
            missing = "B" if "A" in pair else "A"
            raise ValueError(f"slot {name!r} has no lora_{missing} factor")
        slot = Slot(name, pair["A"], pair["B"])
        _check_pair(slot, adapter[slot.a_key], adapter[slot.b_key])
        slots.append(slot)
    return slots


def _check_pair(slot: Slot, a: torch.Tensor, b: torch.Tensor) -> None:
    for key, tensor in ((slot.a_key, a), (slot.b_key, b)):
        if not isinstance(tensor, torch.Tensor):
            raise ValueError(f"{key!r} is a {type(tensor).__name__}, not a torch.Tensor")
        if tensor.ndim != 2:
            raise ValueError(f"{key!r} has shape {tuple(tensor.shape)}; LoRA factors are 2-D")
        if not tensor.is_floating_point():
            raise ValueError(f"{key!r} has dtype {tensor.dtype}; LoRA factors are floating point")
    if a.shape[0] == 0:
        raise ValueError(f"slot {slot.name!r} has rank 0")
    if a.shape[0] != b.shape[1]:
        raise ValueError(
            f"slot {slot.name!r}: lora_A {tuple(a.shape)} and lora_B {tuple(b.shape)} disagree on the rank "
            "(A is r x d_in, B is d_out x r)"
        )
    if a.device != b.device:
        raise ValueError(f"slot {slot.name!r}: lora_A is on {a.device} and lora_B on {b.device}")


def check_same_layout(first: Adapter, second: Adapter) -> list[Slot]:
    """The slots of two parents that must match key for key, shape for shape, dtype and device."""
    slots = find_slots(first)
    find_slots(second)
    if set(first) != set(second):
        only_first = sorted(set(first) - set(second))[:3]
        only_second = sorted(set(second) - set(first))[:3]
        raise ValueError(f"parents hold different slots: only in the first {only_first}, only in the second {only_second}")
    for key, tensor in first.items():
        other = second[key]
        if tensor.shape != other.shape or tensor.dtype != other.dtype or tensor.device != other.device:
            raise ValueError(
                f"parents disagree on {key!r}: {tuple(tensor.shape)} {tensor.dtype} {tensor.device} vs "
                f"{tuple(other.shape)} {other.dtype} {other.device}"
            )
    return slots
